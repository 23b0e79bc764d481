#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run every test that runs without a GPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
. .venv/bin/activate
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
python -m pytest -q "$@"
