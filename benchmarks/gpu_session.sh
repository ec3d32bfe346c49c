#!/usr/bin/env bash
# One GPU session: runs the chosen steps in order, each under its own `timeout`, never stopping the session
# on a failed step. Run on the staged GPU machine from the repo root:
#   bash /tmp/slime-gpu/on-device.sh check || exit 3; source /tmp/slime-gpu/env.sh
#   bash benchmarks/gpu_session.sh tests                                   # call 1 (≈ 7 min)
#   bash benchmarks/gpu_session.sh matmul train weight_sync rollout        # call 2 (≈ 7 min)
#   bash benchmarks/gpu_session.sh e2e trl                                 # call 3 (≈ 7 min)
# The whole session stops starting steps at $SESSION_LIMIT_S (570 s: one run call is 600 s at most) and
# cuts each step's timeout to the time left.
# Output (≤ 8 files come back from $OUT): $OUT/results.jsonl (every JSON result line + one
# {"bench":"step",...} line per step with rc and seconds), $OUT/logs.txt (all step logs, in order),
# $OUT/engine-logs.tar.gz (SGLang/app logs). Budgets below are seconds on one H200 (timeouts are ~1.5x).
# Steps:
#   tests          420  pytest -m "gpu or sglang" over slime-core, slime-train-fsdp, slime-rollout (-x)
#   tests_sglang   300  pytest -m "gpu or sglang" over tests/slime-rollout/test_sglang_engine.py (2 GPUs: + NCCL sync)
#   tests_megatron 360  pytest -m "gpu and megatron" over tests/slime-train-megatron (2 GPUs: + TP=2 vs TP=1)
#   megatron_parallel 300  Megatron GRPO step under (TP,PP,CP) = 1,1,1 2,1,1 1,2,1 1,1,2: same loss/grad norm
#   matmul          30  bf16 8192^3 matmul ceiling
#   train          240  FSDP train() qwen3-0.6b (~60) and qwen3-4b (~150, incl. ~60 s checkpoint write)
#   train_1.7b     120  FSDP train() qwen3-1.7b
#   train_1.7b_16k 120  the same with 16k-token micro-batches (--max-tokens-per-gpu 16384 in a real run)
#   train_base     120  the same with the pre-issue-22 settings (sdpa dense mask, fp32 head, no compile): side by side
#   train_gc       150  FSDP train() qwen3-4b with --gradient-checkpointing
#   train_megatron 200  Megatron train() (TP=PP=1, local spec, packed varlen attention) qwen3-0.6b (~70) and 1.7b (~100),
#                       the FSDP shape (8 x 1024 tokens a micro-batch)
#   train_megatron_1.7b 100  only the 1.7b of train_megatron
#   swap            60  FSDP qwen3-0.6b train() + sleep()/wake_up() through pinned vs pageable host buffers
#   train_megatron_4b  150  the same for qwen3-4b
#   train_megatron_base 200  qwen3-1.7b with the pre-issue-22 dense-mask attention (--attention-backend local) at
#                       4 micro-batches of 2 x 1024 a step (8 x 1024 OOMs: fp32 [16, T, T] probabilities per layer),
#                       then the packed attention on that same split: side by side
#   megatron_attention 40  one core attention fwd+bwd, dense mask vs packed, qwen3-1.7b heads, 8 x 1024 tokens
#   weight_sync    200  disk vs tensor push, qwen3-0.6b, on the shared engine (engine start 60-100 s once)
#   weight_sync_4b 300  the same for qwen3-4b (starts and stops its own engine)
#   rollout        150  slime rollout vs direct /generate, 64 prompts x 8 x 256 tokens, shared engine
#   e2e            420  apps/train GRPO, 4 rollouts of 32x8 (needs torch_memory_saver staged for SGLang)
#   e2e_disagg     420  the same on 2 GPUs: trainer on GPU 0, SGLang on GPU 1, NCCL weight sync
#   e2e_lora       420  the same with LoRA (rank 16, alpha 32, default target modules, lr 1e-5): memory and sync time vs e2e
#   e2e_megatron   420  the same (colocated, 1 GPU) with --train-backend megatron, 2048-token micro-batches
#   trl            420  TRL GRPOTrainer baseline (wheels from .whl, carried with the call)
# The shared qwen3-0.6b SGLang engine starts at the first step that needs it and stops at the end.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
cd "$REPO"
OUT="${OUT:-/tmp/slime-bench-out}"
mkdir -p "$OUT"
export BENCH_RESULTS="$OUT/results.jsonl"
export BENCH_LOG_DIR="${BENCH_LOG_DIR:-/tmp/slime-bench-logs}"
export SLIME_BENCH_MODELS="${SLIME_BENCH_MODELS:-/tmp/slime-bench-models}"
mkdir -p "$BENCH_LOG_DIR" "$SLIME_BENCH_MODELS"
LOGS="$OUT/logs.txt"
# Nothing is installed on the GPU machine: the packages and the apps (slime_app, slime_make_model) import from source.
SRC="$(ls -d "$REPO"/packages/*/src "$REPO"/apps/*/src | tr '\n' ':')"
case ":${PYTHONPATH:-}:" in *":$REPO/apps/train/src:"*) ;; *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SRC";; esac
export PYTHONUNBUFFERED=1
[[ -n "${SLIME_SGLANG_PYTHONPATH:-}" ]] || echo "gpu_session: WARNING: env.sh not sourced (no SLIME_SGLANG_PYTHONPATH)" | tee -a "$LOGS"

# BENCH_SMOKE=1: the same steps on CPU (reference engine, qwen3-tiny, tiny sizes) to test this script.
if [[ "${BENCH_SMOKE:-0}" == 1 ]]; then
  P06=qwen3-tiny; ENGINE=reference; DEV=(--device cpu); WS_EXTRA=(--engine reference --repeats 1); MM=(--size 256)
  RO_SIZE=(--engine reference --num-prompts 3 --n 2 --max-new-tokens 6 --concurrency 8 --repeats 1)
  MA=(--seqs 2 --seq-len 64 --heads 4 --kv-heads 2 --head-dim 16 --repeats 1)
else
  P06=qwen3-0.6b; ENGINE=sglang; DEV=(); WS_EXTRA=(); MM=(); MA=()
  RO_SIZE=(--num-prompts 64 --n 8 --max-new-tokens 256 --concurrency 256)
fi

ENGINE_PID=""
ENGINE_URL_FILE="/tmp/slime-bench-engine.url"

engine_up() {  # starts the shared qwen3-0.6b engine once (not in a subshell: ENGINE_PID must stick)
  if [[ -n "$ENGINE_PID" ]] && kill -0 "$ENGINE_PID" 2>/dev/null && [[ -s "$ENGINE_URL_FILE" ]]; then
    return 0
  fi
  rm -f "$ENGINE_URL_FILE"
  python3 "$HERE/_engine.py" --preset "$P06" --engine "$ENGINE" --url-file "$ENGINE_URL_FILE" --mem-fraction 0.3 --max-bs 256 \
    --log-dir "$BENCH_LOG_DIR" >> "$BENCH_LOG_DIR/engine_server.log" 2>&1 &
  ENGINE_PID=$!
  for _ in $(seq 1 300); do
    [[ -s "$ENGINE_URL_FILE" ]] && return 0
    kill -0 "$ENGINE_PID" 2>/dev/null || { echo "engine process exited" >&2; tail -30 "$BENCH_LOG_DIR"/engine_*.log >&2; return 1; }
    sleep 1
  done
  echo "engine not ready after 300 s" >&2; return 1
}

engine_down() {
  if [[ -n "$ENGINE_PID" ]] && kill -0 "$ENGINE_PID" 2>/dev/null; then
    kill -TERM "$ENGINE_PID"  # _engine.py shuts SGLang down (SIGTERM to its main pid, then its group)
    for _ in $(seq 1 20); do kill -0 "$ENGINE_PID" 2>/dev/null || break; sleep 1; done
    kill -0 "$ENGINE_PID" 2>/dev/null && kill -KILL "$ENGINE_PID"
  fi
  ENGINE_PID=""
}

finish() {
  engine_down
  # + the e2e runs' engine logs and TensorBoard events (bench_e2e.sh run dirs)
  tar -czf "$OUT/engine-logs.tar.gz" "$BENCH_LOG_DIR" $(ls -d /tmp/slime-bench-e2e/*/engine_logs \
    /tmp/slime-bench-e2e/*/tensorboard 2>/dev/null) 2>/dev/null
  echo "=== results ($BENCH_RESULTS) ==="; cat "$BENCH_RESULTS" 2>/dev/null | cut -c1-400
}
trap finish EXIT

SESSION_START=$(date +%s)
SESSION_LIMIT="${SESSION_LIMIT_S:-570}"  # the run tool allows 600 s a call; keep time to write $OUT

run_step() {  # run_step NAME TIMEOUT_S CMD...  (the timeout is cut to what the session has left)
  local name="$1" limit="$2"; shift 2
  local t0; t0=$(date +%s)
  local left=$(( SESSION_LIMIT - (t0 - SESSION_START) - 10 ))
  if (( left < 20 )); then
    echo "===== step $name skipped: ${left}s left in the session =====" | tee -a "$LOGS"
    printf '{"bench": "step", "step": "%s", "rc": -2, "seconds": 0, "error": "no time left"}\n' "$name" >> "$BENCH_RESULTS"
    return 0
  fi
  (( limit > left )) && limit=$left
  echo "===== step $name (limit ${limit}s) $(date -u +%H:%M:%S) =====" | tee -a "$LOGS"
  timeout -k 15 "$limit" "$@" >> "$LOGS" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  echo "===== step $name rc=$rc ${dt}s =====" | tee -a "$LOGS"
  printf '{"bench": "step", "step": "%s", "rc": %d, "seconds": %d}\n' "$name" "$rc" "$dt" >> "$BENCH_RESULTS"
  return 0
}

peak_tflops() {  # the bf16 matmul rate measured earlier in this session's results (else the 790 default)
  python3 - "$BENCH_RESULTS" <<'PY' 2>/dev/null || echo 790
import json, sys
rates = [json.loads(l)["tflops"] for l in open(sys.argv[1]) if '"bench": "matmul"' in l]
print(round(rates[-1], 1) if rates else 790)
PY
}

shared_engine_step() {  # shared_engine_step NAME TIMEOUT_S SCRIPT ARGS...
  local name="$1" limit="$2"; shift 2
  local t0; t0=$(date +%s)
  if ! engine_up 2>>"$LOGS"; then
    echo "===== step $name skipped: shared engine did not start =====" | tee -a "$LOGS"
    printf '{"bench": "step", "step": "%s", "rc": -1, "seconds": 0, "error": "engine start failed"}\n' "$name" >> "$BENCH_RESULTS"
    return 0
  fi
  echo "shared engine $(cat "$ENGINE_URL_FILE") up after $(( $(date +%s) - t0 )) s" | tee -a "$LOGS"
  run_step "$name" "$limit" python3 "$@" --engine-url "$(cat "$ENGINE_URL_FILE")"
}

[[ $# -gt 0 ]] || { sed -n 2,39p "$0"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv >> "$LOGS" 2>&1
for step in "$@"; do
  case "$step" in
    tests) run_step tests 600 python3 -m pytest -m "gpu or sglang" -q -x -p no:cacheprovider \
             tests/slime-core tests/slime-train-fsdp tests/slime-rollout ;;
    tests_sglang) SLIME_TEST_LOG_DIR="$BENCH_LOG_DIR/sglang-tests" run_step tests_sglang 300 python3 -m pytest \
                    -m "gpu or sglang" -q -rA -p no:cacheprovider -o faulthandler_timeout=120 \
                    tests/slime-rollout/test_sglang_engine.py ;;
    tests_megatron) run_step tests_megatron 360 python3 -m pytest -m "gpu and megatron" -q -rA -p no:cacheprovider \
                      tests/slime-train-megatron ;;
    megatron_parallel) run_step megatron_parallel 400 python3 "$HERE/bench_megatron_parallel.py" --preset qwen3-0.6b \
                         --layouts 1,1,1 2,1,1 1,2,1 1,1,2 ;;
    matmul) run_step matmul 60 python3 "$HERE/bench_matmul.py" "${DEV[@]}" "${MM[@]}" ;;
    train)
      run_step train_0.6b 150 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-0.6b --swap --peak-tflops "$(peak_tflops)"
      run_step train_4b 300 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-4b --peak-tflops "$(peak_tflops)" ;;
    train_1.7b) run_step train_1.7b 200 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-1.7b \
                  --peak-tflops "$(peak_tflops)" ;;
    train_1.7b_16k) run_step train_1.7b_16k 200 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-1.7b \
                      --tokens-per-mb 16384 --peak-tflops "$(peak_tflops)" ;;
    train_base) run_step train_base 200 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-1.7b \
                  --attn-implementation sdpa --log-probs-head fp32 --compile-layers off --peak-tflops "$(peak_tflops)" ;;
    train_gc) run_step train_gc 250 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-4b --gradient-checkpointing \
                --peak-tflops "$(peak_tflops)" ;;
    train_megatron)
      run_step train_megatron_0.6b 200 python3 "$HERE/bench_train_megatron.py" --preset qwen3-0.6b --peak-tflops "$(peak_tflops)"
      run_step train_megatron_1.7b 250 python3 "$HERE/bench_train_megatron.py" --preset qwen3-1.7b --peak-tflops "$(peak_tflops)" ;;
    train_megatron_1.7b) run_step train_megatron_1.7b 250 python3 "$HERE/bench_train_megatron.py" --preset qwen3-1.7b \
                           --peak-tflops "$(peak_tflops)" ;;
    swap) run_step swap_0.6b 150 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-0.6b --swap --repeats 2 \
            --peak-tflops "$(peak_tflops)" ;;
    train_megatron_4b) run_step train_megatron_4b 300 python3 "$HERE/bench_train_megatron.py" --preset qwen3-4b \
                         --peak-tflops "$(peak_tflops)" ;;
    train_megatron_base)
      run_step train_megatron_base 250 python3 "$HERE/bench_train_megatron.py" --preset qwen3-1.7b --attention-backend local \
        --tokens-per-mb 2048 --mbs-per-step 4 --peak-tflops "$(peak_tflops)"
      run_step train_megatron_2k 250 python3 "$HERE/bench_train_megatron.py" --preset qwen3-1.7b \
        --tokens-per-mb 2048 --mbs-per-step 4 --peak-tflops "$(peak_tflops)" ;;
    megatron_attention) run_step megatron_attention 90 python3 "$HERE/probe_megatron_attention.py" "${DEV[@]}" "${MA[@]}" ;;
    weight_sync) shared_engine_step weight_sync 300 "$HERE/bench_weight_sync.py" --preset "$P06" --modes disk,tensor \
                   "${DEV[@]}" "${WS_EXTRA[@]}" ;;
    weight_sync_4b) run_step weight_sync_4b 450 python3 "$HERE/bench_weight_sync.py" --preset qwen3-4b --modes disk,tensor ;;
    rollout) shared_engine_step rollout 240 "$HERE/bench_rollout.py" --preset "$P06" "${RO_SIZE[@]}" ;;
    e2e) engine_down; RUN_DIR=/tmp/slime-bench-e2e/run run_step e2e 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_disagg) engine_down; DISAGG=1 RUN_DIR=/tmp/slime-bench-e2e/disagg run_step e2e_disagg 600 \
                  bash "$HERE/bench_e2e.sh" ;;
    e2e_lora) engine_down; EXTRA_FLAGS="${EXTRA_FLAGS:-} --lora-rank 16 --lora-alpha 32 --lr 1e-5" \
                RUN_DIR=/tmp/slime-bench-e2e/lora run_step e2e_lora 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_megatron) engine_down; TRAIN_BACKEND=megatron MAX_TOKENS_PER_GPU=2048 RUN_DIR=/tmp/slime-bench-e2e/megatron \
                    run_step e2e_megatron 600 bash "$HERE/bench_e2e.sh" ;;
    trl) engine_down
      # From the .whl wheels carried with the call, installed with their metadata (datasets asks
      # importlib.metadata for dill's version, which the staged site copy lacks); one visible GPU, since
      # GRPOTrainer refuses nn.DataParallel.
      run_step trl 600 bash -c "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/trl-site $REPO/.whl/*.whl && CUDA_VISIBLE_DEVICES=0 \
        PYTHONPATH=/tmp/trl-site:\$PYTHONPATH python3 $HERE/bench_trl_grpo.py --preset qwen3-0.6b" ;;
    *) echo "gpu_session: unknown step '$step'" | tee -a "$LOGS" ;;
  esac
done
