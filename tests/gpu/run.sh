#!/usr/bin/env bash
# Run every GPU test on the GPU machine in both forms of the scan: with the C core
# (compiled here first from jupyter_gpumem/core/_reach.c, since the machine runs the
# tree as it is) and without it (JUPYTER_GPUMEM_PURE_SCAN=1), then the GPU benchmark.
#   . .whl/prelude.sh && bash tests/gpu/run.sh        (logs in $OUT, else /tmp/gpumem-gpu)
# GPU_FORMS picks the forms (default "native pure"); GPU_PER_FILE=1 also runs each file in
# a process of its own (no test may depend on the order or on what another left
# behind); GPU_TESTS picks those files; GPU_SKIP_BENCH skips the benchmark.
set -u
OUT=${OUT:-/tmp/gpumem-gpu}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
{ date -u; nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,driver_version --format=csv
  python3 -c "import torch, IPython; print('torch', torch.__version__, 'IPython', IPython.__version__, 'cuda devices', torch.cuda.device_count())"
} > "$summary" 2>&1

# the C core, built in place as an editable install would
INC=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
EXT=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if gcc -O2 -shared -fPIC -I"$INC" jupyter_gpumem/core/_reach.c -o "jupyter_gpumem/core/_reach$EXT" > "$OUT/build.log" 2>&1; then
  echo "C core built: jupyter_gpumem/core/_reach$EXT" >> "$summary"
else
  echo "C core NOT built (see build.log): the native form runs without it" >> "$summary"
fi

for form in ${GPU_FORMS:-native pure}; do
  if [ "$form" = pure ]; then export JUPYTER_GPUMEM_PURE_SCAN=1; else unset JUPYTER_GPUMEM_PURE_SCAN; fi
  python3 -c "from jupyter_gpumem.core.scan import native, reach as scan_reach; print('form $form: C core', 'loaded' if native.CORE else 'absent', '· walk', 'C' if scan_reach.NATIVE else 'Python')" >> "$summary" 2>&1
  if [ -n "${GPU_PER_FILE:-}" ]; then
    for t in ${GPU_TESTS:-$(cd tests/gpu && ls test_*.py | sed 's/\.py$//')}; do
      start=$(date +%s)
      timeout "${GPU_TEST_TIMEOUT:-240}" python3 -m pytest -q -s -p no:cacheprovider "tests/gpu/$t.py" > "$OUT/$form-$t.log" 2>&1
      rc=$?
      echo "$form $t rc=$rc $(( $(date +%s) - start ))s $(tail -n 1 "$OUT/$form-$t.log")" >> "$summary"
    done
  fi
  start=$(date +%s)
  timeout "${GPU_ALL_TIMEOUT:-1500}" python3 -m pytest -q -s -p no:cacheprovider tests/gpu > "$OUT/$form.log" 2>&1
  rc=$?
  echo "$form: tests/gpu in one process rc=$rc $(( $(date +%s) - start ))s $(tail -n 1 "$OUT/$form.log")" >> "$summary"
done
unset JUPYTER_GPUMEM_PURE_SCAN

if [ -z "${GPU_SKIP_BENCH:-}" ]; then
  timeout 300 python3 benchmarks/scan.py --device cuda --repeat 9 --forms > "$OUT/scan_cuda.log" 2>&1
  echo "scan benchmark rc=$? $(tail -n 3 "$OUT/scan_cuda.log" | tr '\n' ' ')" >> "$summary"
fi
cat "$summary"
