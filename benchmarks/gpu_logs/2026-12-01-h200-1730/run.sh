#!/bin/bash
cd "$(dirname "$0")"
export PYTHONPATH="$PWD:$PYTHONPATH"
INC=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
EXT=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
gcc -O2 -shared -fPIC -I"$INC" jupyter_gpumem/core/_reach.c -o jupyter_gpumem/core/_reach$EXT 2>&1 | tail -3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
nproc; uptime
python3 -c "import torch; print(torch.__version__)"
python3 benchmarks/trace_overhead.py --rounds 21 --steps 40 --torch-modes --breakdown --quiet 2>&1 | tee $OUT/trace_modes.log
