#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run every test that runs without a GPU, twice: once
# with the scan's C core (built by the editable install) and once with it kept out
# (JUPYTER_GPUMEM_PURE_SCAN=1: every use of core/_reach takes its Python form, as on a
# machine without a compiler). The second pass leaves out the browser and frontend
# tests, which run no Python path of the C core, and the notebook tests that drive a
# real kernel (the same scan runs in the shell tests of that pass). Each pass runs its
# files on GPUMEM_TEST_WORKERS processes (pytest-xdist, default 2; a file's tests stay
# together in one process, in their order; 0 runs them in this process). Arguments go
# to both pytest runs; GPUMEM_TEST_PASSES=native or =pure runs one pass only.
# The generated cases (tests/generated) run after each pass in a process of their own,
# so that no other test file's state reaches their shell.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
. .venv/bin/activate
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
passes=${GPUMEM_TEST_PASSES:-native pure}
workers=${GPUMEM_TEST_WORKERS:-2}
spread=()
if [ "$workers" != 0 ]; then
  spread=(-n "$workers" --dist loadfile)
fi
status=0
for pass in $passes; do
  case "$pass" in
    native)
      echo "== tests with the C core"
      env -u JUPYTER_GPUMEM_PURE_SCAN python -m pytest -q "${spread[@]}" --durations=15 \
        --ignore=tests/generated "$@" || status=$?
      env -u JUPYTER_GPUMEM_PURE_SCAN python -m pytest -q -p no:cacheprovider tests/generated \
        || status=$? ;;
    pure)
      echo "== tests without the C core (JUPYTER_GPUMEM_PURE_SCAN=1)"
      JUPYTER_GPUMEM_PURE_SCAN=1 python -m pytest -q -p no:cacheprovider "${spread[@]}" \
        --durations=15 --ignore=tests/e2e --ignore=tests/labextension --ignore=tests/test_notebooks.py \
        --ignore=tests/views/test_panel_kernel.py --ignore=tests/generated "$@" || status=$?
      JUPYTER_GPUMEM_PURE_SCAN=1 python -m pytest -q -p no:cacheprovider tests/generated \
        || status=$? ;;
    *) echo "unknown pass: $pass (native, pure)" >&2; exit 2 ;;
  esac
done
exit $status
