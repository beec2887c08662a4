#!/usr/bin/env bash
# Fidelity tier: check dspark_obs's scheduler, cost tables and record structs
# against SGLang 0.5.23's own code, imported on CPU torch in a separate venv.
#
#   bash .ci/fidelity-venv.sh [extra pytest args]
#
# Environment:
#   FIDELITY_VENV             venv location (default .fidelity-venv, relative to
#                             the repo root; absolute paths are kept as they are)
#   SGLANG_CPU_REQUIREMENTS   the pinned SGLang-on-CPU requirements, used when
#                             ../shared/sglang-cpu-requirements.txt (beside the
#                             repo) does not exist; the last resort is the copy
#                             in tests/fidelity/
#
# Idempotent: the venv (~2.4 GB, ~2 min) is created only when missing, and the
# pinned installs rerun only when the requirements or the extras change (a
# stamp file in the venv records what was installed).  Exits with pytest's
# status, so non-zero on any failure; pytest's last line has the counts.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/tier.sh"
tier_venv FIDELITY_VENV .fidelity-venv

# Test-only extras, installed with --no-deps on top of the SGLang pins (attrs,
# hypothesis's other dependency, is already among them).  pytest-timeout is
# there because pyproject.toml sets `timeout`.
EXTRAS=(
  pytest==9.2.0
  pluggy==1.7.0
  iniconfig==2.3.1
  pytest-timeout==2.4.0
  hypothesis==6.155.2
  sortedcontainers==2.4.0
  pyarrow==26.0.1
  scipy==1.17.1
)

# The pinned SGLang-on-CPU set: shared/ beside the repo, else $SGLANG_CPU_REQUIREMENTS,
# else the copy kept in the repo.
REQS=""
for candidate in "$ROOT/../shared/sglang-cpu-requirements.txt" "${SGLANG_CPU_REQUIREMENTS:-}" \
                 "$ROOT/tests/fidelity/sglang-cpu-requirements.txt"; do
  if [[ -n "$candidate" && -f "$candidate" ]]; then REQS="$candidate"; break; fi
done

pip_install() {
  "$VENV/bin/python" -m pip install --no-deps --disable-pip-version-check --quiet "$@"
}

if [[ ! -x "$VENV/bin/python" ]]; then
  if [[ -z "$REQS" ]]; then
    echo "fidelity: no SGLang requirements file: looked for $ROOT/../shared/sglang-cpu-requirements.txt," \
         "\$SGLANG_CPU_REQUIREMENTS and tests/fidelity/sglang-cpu-requirements.txt;" \
         "set SGLANG_CPU_REQUIREMENTS to its path." >&2
    exit 2
  fi
  echo "fidelity: creating $VENV (pip install --no-deps -r $REQS; about 2 minutes, 2.4 GB)"
  python3 -m venv "$VENV"
fi

STAMP="$VENV/.dspark-fidelity-stamp"
WANT="$( { [[ -n "$REQS" ]] && cat "$REQS"; printf '%s\n' "${EXTRAS[@]}"; } | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]]; then
  if [[ -n "$REQS" ]]; then
    pip_install -r "$REQS"
  else
    echo "fidelity: no requirements file; using the SGLang already in $VENV" >&2
  fi
  pip_install "${EXTRAS[@]}"
  echo "$WANT" > "$STAMP"
fi

# The SGLang import emits a SWIG DeprecationWarning at interpreter exit, after
# pytest's summary; silence just that one so the summary stays the last line.
exec "$VENV/bin/python" -W "ignore:builtin type swigvarlink:DeprecationWarning" \
  -m pytest tests/fidelity -p no:cacheprovider -o python_files='fidelity_*.py' -q "$@"
