#!/usr/bin/env bash
# One-shot GPU benchmark: base and big in bf16 with ~25k source + ~25k target
# tokens a step (§5.1), the XLA against the cuDNN attention path, an f32 base
# reference, the attention sweeps (every implementation; pallas and cudnn against xla at
# 4k, 16k and 64k tokens), and decoding (greedy and beam 4).
#
#   bash benchmarks/gpu_run.sh            # from the repo root or anywhere
#   QUICK=1 bash benchmarks/gpu_run.sh    # fewer steps, for a short device slot
#
# Results are appended to benchmarks/results/<gpu>_<date>.json and summarised in
# benchmarks/README.md; every command's output is kept under
# benchmarks/results/logs/<date>/. Each run is independent: one that fails (out
# of memory, a cuDNN limit, a timeout) is logged and the rest still run. The
# exit status is the number of failed runs.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
STEPS=${STEPS:-20}
TIMEOUT=${TIMEOUT:-900}  # Seconds per run (compiling the big model takes a while).
if [[ -n "${QUICK:-}" ]]; then STEPS=5; TIMEOUT=300; fi
# Leave JAX's default preallocation on: peak_bytes_in_use still reports what was used.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}

if ! "$PYTHON" -c "import jax, sys; sys.exit(jax.devices()[0].platform != 'gpu')" 2>/dev/null; then
  echo "error: JAX sees no GPU; install a CUDA build (pip install -U 'jax[cuda12]') and retry" >&2
  exit 100
fi
LOGS="benchmarks/results/logs/$(date +%Y-%m-%d)"
mkdir -p "$LOGS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$LOGS/gpu.txt"

failed=()
run() {  # run NAME SCRIPT ARGS...: one benchmark, logged; a failure is counted, not fatal.
  local name=$1 script=$2; shift 2
  echo "=== $name: benchmarks/$script $*"
  if timeout "$TIMEOUT" "$PYTHON" "benchmarks/$script" --label="$name" "$@" \
      > "$LOGS/$name.log" 2>&1; then
    grep -v '^{' "$LOGS/$name.log" | grep -E '^\s{2}' | head -30
  else
    echo "FAILED ($?): see $LOGS/$name.log"; tail -3 "$LOGS/$name.log"
    failed+=("$name")
  fi
}

BASE=(--config=experiments/configs/wmt14_base.py)
BIG=(--config=experiments/configs/wmt14_big.py)
BF16=(--config.model.dtype=bfloat16)
BATCH_25K=(--batch_size=200 --src_len=128 --tgt_len=128 --steps="$STEPS")  # 25,600 + 25,600.

run base_bf16_xla    train_step.py "${BASE[@]}" "${BF16[@]}" "${BATCH_25K[@]}" --config.model.attention_impl=xla --json
run base_bf16_cudnn  train_step.py "${BASE[@]}" "${BF16[@]}" "${BATCH_25K[@]}" --config.model.attention_impl=cudnn --json
run base_bf16_plain  train_step.py "${BASE[@]}" "${BF16[@]}" "${BATCH_25K[@]}" --json \
    --profile_dir="$LOGS/profile_base_bf16"
run base_f32_plain   train_step.py "${BASE[@]}" "${BATCH_25K[@]}" --json
run big_bf16_cudnn   train_step.py "${BIG[@]}" "${BF16[@]}" "${BATCH_25K[@]}" --config.model.attention_impl=cudnn --json
run big_bf16_xla     train_step.py "${BIG[@]}" "${BF16[@]}" "${BATCH_25K[@]}" --config.model.attention_impl=xla --json
run attention_bf16   attention.py --attention_lengths=128,256,512,1024,2048,4096,8192,16384 \
    --attention_tokens=65536 --attention_max_seconds=30 --json
# The flash kernels against XLA's attention at long lengths (64k tokens a call, bf16).
run attention_long_bf16 attention.py --attention_impls=xla,pallas,cudnn,chunked \
    --attention_lengths=4096,16384,65536 --attention_tokens=65536 --attention_max_seconds=60 \
    --attention_max_gib=120 --json
for model in base big; do
  config=(--config=experiments/configs/wmt14_$model.py)
  # --pair_shared_cache: the beams' shared cache against the reordered one (off by default on
  # a GPU until measured: DecodeOptions.shared_beam_cache).
  run "decode_${model}_bf16_b64" decoding.py "${config[@]}" "${BF16[@]}" --beam_size=4 \
      --batch_size=64 --src_len=32 --decode_steps=40 --pair_shared_cache --json
  run "decode_${model}_bf16_b512" decoding.py "${config[@]}" "${BF16[@]}" --beam_size=4 \
      --batch_size=512 --src_len=32 --decode_steps=40 --pair_shared_cache --json
done
run decode_base_f32_b64 decoding.py "${BASE[@]}" --beam_size=4 --batch_size=64 --src_len=32 \
    --decode_steps=40 --vocab_size=32000 --json  # The CPU command's shapes, for comparison.

echo "=== done; results in benchmarks/results, summary in benchmarks/README.md"
if (( ${#failed[@]} )); then echo "failed: ${failed[*]}"; fi
exit "${#failed[@]}"
