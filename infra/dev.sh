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

# axolotl's published source for the export tests' schema check (its pins conflict with this environment,
# so it is unpacked, not installed; tests/export/test_real_tools.py imports it in a subprocess).
exportcheck_axolotl() {
  local dest=.gpuplan/exportcheck/axolotl version=0.19.0
  if [ ! -f "$dest/axolotl-$version.dist-info/METADATA" ]; then
    rm -rf "$dest" .gpuplan/exportcheck/wheel
    "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps "axolotl==$version" \
      -d .gpuplan/exportcheck/wheel
    "$venv/bin/python" -m zipfile -e .gpuplan/exportcheck/wheel/axolotl-$version-py3-none-any.whl "$dest"
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
    exportcheck_axolotl
    shift
    "$venv/bin/python" -m pytest "$@"
    ;;
  *)
    echo "usage: bash infra/dev.sh run|test [pytest args]" >&2
    exit 2
    ;;
esac
