#!/usr/bin/env bash
# Set up a development environment in .venv: the package (editable, with the
# JupyterLab sidebar built from labextension/), the test tools, CPU builds of
# PyTorch, TensorFlow and JAX, and Chromium for the sidebar's browser test.
# Safe to run again: it skips what is already there. Source it or run it.
# Chromium's install (Debian's package) runs beside the Python installs; each
# step says when it ends, so a slow set-up shows where its time went.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
step() { echo "setup: $1 ($((SECONDS - t0)) s)"; }

# A real browser for the sidebar's end-to-end test (Debian's Chromium; tools never download browsers here).
browser_pid=""
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    browser_log=$(mktemp)
    ( apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null ) \
      > "$browser_log" 2>&1 &
    browser_pid=$!
  else
    echo "note: chromium not found; the sidebar's browser test will be skipped" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip

# Frameworks: CPU builds, pinned (an unpinned torch pulls a multi-GB CUDA build).
python -m pip install -q "torch==2.13.0" "tensorflow-cpu==2.21.0" "keras==3.15.1" "jax==0.10.2" "jaxlib==0.10.2"
step "frameworks installed"

# The package with its test extras; this builds the sidebar (needs Node.js 20+, not needed by users).
python -m pip install -q -e ".[test]"
step "package and sidebar built"
# Jupyter Notebook 7, for the browser test of the sidebar in its right panel.
python -m pip install -q "notebook>=7.4,<8"
step "notebook installed"

if [ -n "$browser_pid" ]; then
  if ! wait "$browser_pid"; then
    cat "$browser_log" >&2
    echo "setup: chromium could not be installed" >&2
    exit 1
  fi
  rm -f "$browser_log"
  step "chromium installed"
fi
