#!/usr/bin/env bash
# Set up only what the demo needs (this package with its JupyterLab sidebar, PyTorch's CPU
# build, JupyterLab) in .venv, then open the quickstart notebook in JupyterLab with the
# "Kernel Memory" sidebar. Stop with Ctrl-C. The full development set-up (every framework,
# the test tools, a browser) is scripts/setup.sh, which scripts/test.sh runs.
# Building the sidebar needs Node.js 20+ (jlpm comes with the build tools); its
# node_modules are removed again afterwards unless they were there before.
# `bash scripts/demo.sh --setup-only` sets up and stops there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip() { python -m pip -q --no-cache-dir "$@"; }
pip install --upgrade pip
# PyTorch's CPU build: its index beside PyPI (2.13.0+cpu outranks PyPI's CUDA 2.13.0);
# where that index cannot be reached, pip says so and goes on with what it finds
pip install --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu \
  "torch==2.13.0" numpy   # (numpy: torch warns at import without it)
had_modules=0
[ -d labextension/node_modules ] && had_modules=1
yarn_tmp=""
if [ "$had_modules" = 0 ]; then
  # the sidebar's build tools and their cache live in a temporary folder, removed after
  yarn_tmp=$(mktemp -d)
  export YARN_GLOBAL_FOLDER="$yarn_tmp" YARN_CACHE_FOLDER="$yarn_tmp/cache"
fi
pip install -e ".[lab]"
if [ "$had_modules" = 0 ]; then
  rm -rf labextension/node_modules labextension/.yarn "$yarn_tmp"
fi
echo "demo: set up in $((SECONDS - t0)) s; .venv is $(du -sh .venv | cut -f1)"
[ "${1:-}" = --setup-only ] && exit 0
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
exec jupyter lab notebooks/quickstart.ipynb --ServerApp.ip=127.0.0.1 "${extra[@]}" "$@"
