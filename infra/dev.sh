#!/usr/bin/env bash
# Developer entry point: sets up a virtual environment in .venv (idempotent) and runs gpuplan.
#   bash infra/dev.sh run [serve args]  set up the runtime only, then start the service on its embedded defaults
#                                       (SQLite, in-process tasks); e.g. `bash infra/dev.sh run --port 8080`
#   bash infra/dev.sh setup             the runtime only, nothing started (what `run` installs)
#   bash infra/dev.sh test [pytest args] set up with the dev, trace and exportcheck extras (CPU torch), then run
#                                       the whole test suite, one process per core (GPUPLAN_TEST_WORKERS)
# GPUPLAN_VENV names another environment folder (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=${GPUPLAN_VENV:-.venv}

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
  if [ -n "$1" ]; then
    pip_install -e ".[$1]"
  else
    pip_install -e .
  fi
  "$venv/bin/python" -c "import services" >/dev/null
}

setup_runtime() {
  # The service's own packages only (no test, lint or docs tools), with a line before and after so a
  # first start that spends a minute or two installing is not silent.
  echo "gpuplan: setting up $venv (the runtime packages; a first run takes a minute or two)" >&2
  setup ""
  echo "gpuplan: $venv ready" >&2
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
    setup_runtime
    shift
    exec "$venv/bin/gpuplan" serve "$@"
    ;;
  setup)
    setup_runtime
    ;;
  test)
    setup dev,trace,exportcheck,otel
    exportcheck_unpack axolotl 0.19.0
    exportcheck_unpack torchao 0.14.1
    shift
    # One test process per core, at most 8 (pytest-xdist); the tests of one file run in one process, in order;
    # GPUPLAN_TEST_WORKERS=0 runs in this process, and a later -n in the arguments wins.
    cores=$(nproc 2>/dev/null || echo 2)
    workers=${GPUPLAN_TEST_WORKERS:-$(( cores < 8 ? cores : 8 ))}
    "$venv/bin/python" -m pytest -n "$workers" --dist loadfile "$@"
    ;;
  *)
    echo "usage: bash infra/dev.sh run [serve args] | setup | test [pytest args]" >&2
    exit 2
    ;;
esac
