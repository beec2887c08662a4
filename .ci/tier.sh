# Sourced by each test tier's script: the repository root (cwd set to it) and the tier's venv path.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/tier.sh"; tier_venv NAME_OF_ENV_VAR default-dir
#
# sets ROOT and VENV (a relative venv path is taken from the repository root).
set -euo pipefail
ROOT="$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel 2>/dev/null \
        || (cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd))"
cd "$ROOT"

tier_venv() {
  VENV="${!1:-$2}"
  case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
}
