#!/usr/bin/env bash
# Developer entry point: sets up a virtual environment in .venv (idempotent) and runs gpuplan.
#   bash infra/dev.sh run    set up, then start the service on its embedded defaults (SQLite, in-process tasks)
#   bash infra/dev.sh test   set up with the dev, trace and exportcheck extras (CPU torch), then run the whole test suite
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=.venv

pip_install() {
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
}

setup() {
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
  fi
  if [[ "$1" == *trace* ]] && ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    # The CPU build first: a bare torch requirement would pull a multi-GB CUDA build.
    pip_install "torch==${GPUPLAN_TORCH_VERSION:-2.13.0}"
  fi
  pip_install -e ".[$1]"
  "$venv/bin/python" -c "import services" >/dev/null
}

# Packages the export tests validate with but cannot install beside this project's pins, unpacked from
# their wheels (no dependencies) for tests/export/test_real_tools.py to import in a subprocess: axolotl
# pins transformers 5.16 and pydantic 2.12; torchtune 0.6.1 needs torchao < 0.15, which PEFT refuses.
exportcheck_unpack() {
  local name=$1 version=$2 dest=.gpuplan/exportcheck/$1
  if ! ls "$dest/$name-$version.dist-info/METADATA" >/dev/null 2>&1; then
    rm -rf "$dest" ".gpuplan/exportcheck/wheels-$name"
    "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps "$name==$version" \
      -d ".gpuplan/exportcheck/wheels-$name"
    "$venv/bin/python" -m zipfile -e ".gpuplan/exportcheck/wheels-$name/"*.whl "$dest"
  fi
}

case "${1:-}" in
  run)
    setup dev
    shift
    exec "$venv/bin/gpuplan" serve "$@"
    ;;
  test)
    setup dev,trace,exportcheck
    exportcheck_unpack axolotl 0.19.0
    exportcheck_unpack torchao 0.14.1
    shift
    "$venv/bin/python" -m pytest "$@"
    ;;
  *)
    echo "usage: bash infra/dev.sh run|test [pytest args]" >&2
    exit 2
    ;;
esac
