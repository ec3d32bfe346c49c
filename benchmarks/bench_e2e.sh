#!/usr/bin/env bash
# End-to-end GRPO on GSM8K with the full app (apps/train), 1 GPU, colocated; prints one JSON line of
# per-phase times and tokens/s (benchmarks/e2e_report.py reads the run's TensorBoard events).
#
# GPU (staged machine, `source /tmp/slime-gpu/env.sh`, PYTHONPATH += packages/*/src apps/*/src):
#   bash benchmarks/bench_e2e.sh                      # qwen3-0.6b, 4 rollouts of 32 prompts x 8, 256 tokens
#   DISAGG=1 bash benchmarks/bench_e2e.sh             # 2 GPUs: trainer on one, SGLang on the other, NCCL sync
#   TRAIN_BACKEND=megatron MAX_TOKENS_PER_GPU=2048 bash benchmarks/bench_e2e.sh   # Megatron (local spec)
#   LABEL=qwen3-0.6b-fsdp-ppo EXTRA_FLAGS="--advantage-estimator ppo --normalize-advantages" bash ...   # PPO
#   VL=1 bash benchmarks/bench_e2e.sh                 # vision-language GRPO (label qwen3-vl-tiny-fsdp), see below
#   FP8=1 bash benchmarks/bench_e2e.sh                # FP8 rollout (label qwen3-0.6b-fsdp-fp8), see below
#   TRUE_ON_POLICY=1 bash benchmarks/bench_e2e.sh     # --true-on-policy-mode (label qwen3-0.6b-fsdp-true-on-policy):
#                                                     # first_step_logprob_abs_diff must be 0 (<= 1e-6), issue 29
# CPU smoke (MODEL_DTYPE: the preset's dtype, default bfloat16; tests/apps/test_train_e2e.py runs it in float32):
#   BENCH_DEVICE=cpu PRESET=qwen3-tiny RBS=2 N=2 MAXLEN=8 NUM_ROLLOUT=2 PYTHON="uv run python" bash benchmarks/bench_e2e.sh
#   BENCH_DEVICE=cpu VL=1 RBS=2 N=2 MAXLEN=6 NUM_ROLLOUT=2 PYTHON="uv run python" bash benchmarks/bench_e2e.sh
# VL=1: the geo3k-style picture questions of examples/geo3k-vlm/data/train.parquet (`problem` with an <image>
# placeholder, `answer`, PNG bytes in `images`; --rm-type math) on the qwen3-vl-tiny preset (a random 2-layer
# Qwen3-VL with Qwen3-0.6B's head geometry; a 64x64 picture is 64 image tokens), FSDP only. SGLang runs its
# vision tower with --mm-attention-backend triton_attn: its default on an H200 is FA3, whose kernels the staged
# sglang-kernel leaves out (shared/device/bundle.sh).
# FP8=1: BF16 training, FP8 serving (issue 30 item 3). The preset is converted once with `slime-convert hf-to-fp8`
# (e4m3, 128x128 blocks) next to it; the engines serve that as --hf-checkpoint, the trainer starts from the BF16
# preset as --ref-load and quantizes every push; --use-tis as the original recommends. SGLang picks its block-FP8
# GEMM itself; FP8_DEEPGEMM=0 (the default here) sets SGLANG_ENABLE_JIT_DEEPGEMM=0, i.e. its Triton kernel on an
# H200, so no DeepGEMM JIT compile eats the step's budget (FP8_DEEPGEMM=1: SGLang's default).
# Colocated SGLang needs torch_memory_saver on the SGLang side (--enable-memory-saver); the staged stack
# lacks it unless bundle.sh was run with `--sglang torch-memory-saver==<ver>`: this script checks first.
# Budget on an H200: model write ~20 s, Ray + trainer + SGLang start ~120 s, 4 rollouts ~4 x 20 s: ~4 min.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PY="${PYTHON:-python3}"
VL="${VL:-0}"
if [[ "$VL" == 1 ]]; then PRESET="${PRESET:-qwen3-vl-tiny}"; else PRESET="${PRESET:-qwen3-0.6b}"; fi
RBS="${RBS:-32}"
N="${N:-8}"
MAXLEN="${MAXLEN:-256}"
NUM_ROLLOUT="${NUM_ROLLOUT:-4}"
RUN_DIR="${RUN_DIR:-/tmp/slime-bench-e2e/run-$$}"
MODEL_ROOT="${SLIME_BENCH_MODELS:-/tmp/slime-bench-models}"
DEVICE="${BENCH_DEVICE:-cuda}"
TRAIN_BACKEND="${TRAIN_BACKEND:-fsdp}"
DISAGG="${DISAGG:-0}"

if [[ "$VL" == 1 && "$TRAIN_BACKEND" != fsdp ]]; then
  echo "bench_e2e: VL=1 trains on --train-backend fsdp only (got TRAIN_BACKEND=$TRAIN_BACKEND)" >&2
  exit 2
fi
DATA_FLAGS=(--prompt-data "$REPO/tests/fixtures/gsm8k/test-50.jsonl" --input-key question --label-key answer)
if [[ "$VL" == 1 ]]; then
  DATA_FLAGS=(--prompt-data "$REPO/examples/geo3k-vlm/data/train.parquet" --input-key problem --label-key answer
              --multimodal-keys '{"image": "images"}')
fi

MODEL_DIR="$($PY "$HERE/_common.py" "$PRESET" "$MODEL_ROOT" "${MODEL_DTYPE:-bfloat16}")" \
  || { echo "bench_e2e: could not build the $PRESET checkpoint" >&2; exit 2; }

CKPT_FLAGS=(--hf-checkpoint "$MODEL_DIR")
FP8="${FP8:-0}"
if [[ "$FP8" == 1 ]]; then
  FP8_DIR="$MODEL_ROOT/$PRESET-fp8"
  if [[ ! -f "$FP8_DIR/config.json" ]]; then
    $PY -m slime_convert.cli hf-to-fp8 --hf-checkpoint "$MODEL_DIR" --save "$FP8_DIR" --force --no-progress \
      || { echo "bench_e2e: could not convert $MODEL_DIR to FP8" >&2; exit 2; }
  fi
  CKPT_FLAGS=(--hf-checkpoint "$FP8_DIR" --ref-load "$MODEL_DIR" --use-tis)
  export SGLANG_ENABLE_JIT_DEEPGEMM="${FP8_DEEPGEMM:-0}"
fi

TRUE_ON_POLICY="${TRUE_ON_POLICY:-0}"
if [[ "$TRUE_ON_POLICY" == 1 ]]; then
  EXTRA_FLAGS="${EXTRA_FLAGS:-} --true-on-policy-mode"
  # Engine and trainer must pick the same batch-invariant matmul; Triton's (no DeepGEMM JIT) in both, inherited.
  export SGLANG_ENABLE_JIT_DEEPGEMM="${TRUE_ON_POLICY_DEEPGEMM:-0}"
fi

ENGINE_FLAGS=()
PLACEMENT=(--colocate)
MEM_FRACTION=0.3
if [[ "$DISAGG" == 1 ]]; then
  PLACEMENT=(--rollout-num-gpus 1 --rollout-num-gpus-per-engine 1)  # weight sync: NCCL (auto on GPUs)
  MEM_FRACTION=0.7
fi
MEM_FRACTION="${ENGINE_MEM_FRACTION:-$MEM_FRACTION}"
# ENGINE_MAX_TOTAL_TOKENS caps the engine's KV cache (with ENGINE_MEM_FRACTION=0.9 its memory no longer depends on
# what else holds the GPU: runs side by side on one GPU, gpu_session.sh acceptance).
KV_CAP=()
[[ -n "${ENGINE_MAX_TOTAL_TOKENS:-}" ]] && KV_CAP=(--sglang-max-total-tokens "$ENGINE_MAX_TOTAL_TOKENS")
if [[ "$DEVICE" == "cuda" && "$DISAGG" != 1 ]]; then
  if ! PYTHONPATH="${SLIME_SGLANG_PYTHONPATH:-$PYTHONPATH}" $PY -c "import torch_memory_saver" 2>/dev/null; then
    echo "bench_e2e: torch_memory_saver is not importable on the SGLang side; --colocate cannot run." >&2
    echo "  stage it: shared/device/bundle.sh --sglang torch-memory-saver==<ver>" >&2
    exit 3
  fi
fi
if [[ "$DEVICE" == "cuda" ]]; then
  ENGINE_FLAGS=(--rollout-engine sglang --sglang-mem-fraction-static "$MEM_FRACTION" "${KV_CAP[@]}"
                --sglang-cuda-graph-backend-prefill disabled --sglang-cuda-graph-max-bs-decode "${CUDA_GRAPH_BS:-256}")
  [[ "$VL" == 1 ]] && ENGINE_FLAGS+=(--sglang-mm-attention-backend triton_attn)
else
  ENGINE_FLAGS=(--rollout-engine reference)
fi

mkdir -p "$RUN_DIR"
start=$(date +%s)
$PY "$REPO/apps/train" \
  --train-backend "$TRAIN_BACKEND" "${CKPT_FLAGS[@]}" \
  "${DATA_FLAGS[@]}" --apply-chat-template --rm-type math --advantage-estimator grpo \
  --num-rollout "$NUM_ROLLOUT" --rollout-batch-size "$RBS" --n-samples-per-prompt "$N" \
  --global-batch-size $((RBS * N)) --rollout-max-response-len "$MAXLEN" --rollout-temperature 1.0 \
  --actor-num-nodes 1 --actor-num-gpus-per-node 1 "${PLACEMENT[@]}" --lr 1e-6 \
  --use-dynamic-batch-size --max-tokens-per-gpu "${MAX_TOKENS_PER_GPU:-8192}" \
  --output-dir "$RUN_DIR" "${ENGINE_FLAGS[@]}" ${EXTRA_FLAGS:-}
rc=$?
echo "bench_e2e: app exited $rc after $(( $(date +%s) - start )) s (run dir $RUN_DIR)" >&2
[[ $rc -eq 0 ]] || exit $rc
$PY "$HERE/e2e_report.py" "$RUN_DIR" --rollout-batch-size "$RBS" --n "$N" --skip-first 1 \
  --label "${LABEL:-$PRESET-$TRAIN_BACKEND$([[ $DISAGG == 1 ]] && echo -disagg)$([[ $FP8 == 1 ]] && echo -fp8)$(
    [[ $TRUE_ON_POLICY == 1 ]] && echo -true-on-policy)}" \
  --extra-flags "${EXTRA_FLAGS:-} --max-tokens-per-gpu ${MAX_TOKENS_PER_GPU:-8192}"
