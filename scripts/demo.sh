#!/usr/bin/env bash
# Set up (scripts/setup.sh) and open the quickstart notebook in JupyterLab,
# with the "GPU Memory" sidebar. Stop with Ctrl-C.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
. .venv/bin/activate
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
exec jupyter lab notebooks/quickstart.ipynb --ServerApp.ip=127.0.0.1 "${extra[@]}" "$@"
