#!/usr/bin/env bash
# Wheel tier: build the wheel, install it in a clean venv, and run the product from it.
#
#   bash .ci/wheel-venv.sh [extra pytest args]
#
# Editable installs read data files from the source tree, so a file missing
# from the wheel (a SQL macro, a thresholds file) only shows here.  The venv
# is made anew each run (pip's download cache is reused); the tests run from a
# directory outside the source tree, so nothing can be imported from it.
# Environment: WHEEL_VENV (default .wheel-venv). Exits with pytest's status.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/tier.sh"
tier_venv WHEEL_VENV .wheel-venv
DIST="$VENV.dist"

rm -rf "$VENV" "$DIST"
python3 -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --disable-pip-version-check --quiet)
"${pip[@]}" --upgrade pip
"$VENV/bin/python" -m pip wheel --disable-pip-version-check --quiet --no-deps --wheel-dir "$DIST" "$ROOT"
"${pip[@]}" "$DIST"/dspark_obs-*.whl pytest pytest-timeout

RUN="$(mktemp -d)"
trap 'rm -rf "$RUN"' EXIT
cp "$ROOT"/tests/wheel/wheel_*.py "$RUN"/
cd "$RUN"
WHEEL_SOURCE_ROOT="$ROOT" exec "$VENV/bin/python" -m pytest "$RUN" -p no:cacheprovider -o python_files='wheel_*.py' \
  -o timeout=1200 -q "$@"
