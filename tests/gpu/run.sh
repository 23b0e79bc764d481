#!/usr/bin/env bash
# Run every GPU test and the GPU benchmark on the GPU machine, one log per part:
# each file in a process of its own, then the whole directory in one process (no test
# may depend on the order or on what another left behind), then the benchmark.
#   . .whl/prelude.sh && bash tests/gpu/run.sh        (logs in $OUT, else /tmp/gpumem-gpu)
# GPU_TESTS picks files; GPU_SKIP_ALL skips the one-process run; GPU_SKIP_BENCH the benchmark.
set -u
OUT=${OUT:-/tmp/gpumem-gpu}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
{ date -u; nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,driver_version --format=csv
  python3 -c "import torch, IPython; print('torch', torch.__version__, 'IPython', IPython.__version__, 'cuda devices', torch.cuda.device_count())"
} > "$summary" 2>&1
for t in ${GPU_TESTS:-test_table_gpu test_batches_gpu test_comm_gpu test_watch_gpu test_panel_gpu test_frameworks_gpu test_multi_gpu test_nvml_gpu test_internals_gpu test_trace_gpu test_cluster_gpu}; do
  start=$(date +%s)
  timeout "${GPU_TEST_TIMEOUT:-240}" python3 -m pytest -q -s -p no:cacheprovider "tests/gpu/$t.py" > "$OUT/$t.log" 2>&1
  rc=$?
  echo "$t rc=$rc $(( $(date +%s) - start ))s $(tail -n 1 "$OUT/$t.log")" >> "$summary"
done
if [ -z "${GPU_SKIP_ALL:-}" ]; then
  start=$(date +%s)
  timeout "${GPU_ALL_TIMEOUT:-1500}" python3 -m pytest -q -s -p no:cacheprovider tests/gpu > "$OUT/all_in_one_process.log" 2>&1
  rc=$?
  echo "tests/gpu in one process rc=$rc $(( $(date +%s) - start ))s $(tail -n 1 "$OUT/all_in_one_process.log")" >> "$summary"
fi
if [ -z "${GPU_SKIP_BENCH:-}" ]; then
  timeout 200 python3 benchmarks/scan.py --device cuda --repeat 9 > "$OUT/scan_cuda.log" 2>&1
  echo "scan benchmark rc=$? $(tail -n 3 "$OUT/scan_cuda.log" | tr '\n' ' ')" >> "$summary"
fi
cat "$summary"
