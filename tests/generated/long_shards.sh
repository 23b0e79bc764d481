#!/usr/bin/env bash
# The long generator run spread over processes, for a machine with many cores: SHARDS
# processes (default: the cores less two), each drawing afresh from its own seed (the
# ``long`` profile), for at most SECONDS seconds (default 540). Each example's outcome is
# a line of $OUT/gen-<form>-<i>.log ("ok" or "fail ..."); the counts are printed at the end.
#   GEN_FORM=native|pure bash tests/generated/long_shards.sh [SHARDS] [SECONDS]
# native: the C core as built in place (build it first); pure: JUPYTER_GPUMEM_PURE_SCAN=1.
# Host tensors only: the GPU is hidden from the shards (CUDA_VISIBLE_DEVICES=, JAX on CPU).
set -u
OUT=${OUT:-/tmp/gpumem-gen}
mkdir -p "$OUT"
shards=${1:-$(( $(nproc) - 2 ))}
secs=${2:-540}
form=${GEN_FORM:-native}
base=${GEN_SEED:-$(( RANDOM * 1000 ))}
echo "generator shards: $shards x ${secs}s, form $form, seeds $((base + 1))..$((base + shards))"
for i in $(seq 1 "$shards"); do
  tmp=$(mktemp -d)
  (
    if [ "$form" = pure ]; then export JUPYTER_GPUMEM_PURE_SCAN=1; else unset JUPYTER_GPUMEM_PURE_SCAN; fi
    export CUDA_VISIBLE_DEVICES= JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false \
      TMPDIR="$tmp" IPYTHONDIR="$tmp/ipython" MPLCONFIGDIR="$tmp/mpl" \
      GPUMEM_HYPOTHESIS_PROFILE=long GPUMEM_GENERATED_LOG="$OUT/gen-$form-$i.log"
    timeout "$secs" nice -n 19 python3 -m pytest -q -p no:cacheprovider \
      "tests/generated/test_generated.py::test_generated_notebooks_keep_every_rule" \
      --hypothesis-seed=$(( base + i )) > "$OUT/gen-$form-$i.out" 2>&1
    echo "shard $i rc=$?" >> "$OUT/gen-$form-$i.out"
  ) &
done
wait
ok=$(cat "$OUT"/gen-"$form"-*.log 2>/dev/null | grep -c " ok ")
failed=$(cat "$OUT"/gen-"$form"-*.log 2>/dev/null | grep -c " fail ")
echo "generator, $form: $ok examples passed, $failed failed, in $shards processes"
[ "$failed" -eq 0 ]
