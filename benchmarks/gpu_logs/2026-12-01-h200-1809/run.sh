#!/bin/bash
cd "$(dirname "$0")"
export PYTHONPATH="$PWD:$PYTHONPATH"
INC=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
EXT=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
gcc -O2 -shared -fPIC -I"$INC" jupyter_gpumem/core/_reach.c -o jupyter_gpumem/core/_reach$EXT 2>&1 | tail -3
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
date -u
python3 -m pytest -q -s -p no:cacheprovider tests/gpu 2>&1 | tee $OUT/gpu_tests.log | tail -40
date -u
