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
#   tests_sglang   300  pytest -m "gpu or sglang" over test_sglang_engine.py and test_routed_experts.py (2 GPUs: + NCCL)
#   tests_true_on_policy 300  tests/slime-train-fsdp/test_true_on_policy_gpu.py in its own process (it turns on
#                       SGLang's batch-invariant ops process-wide): trainer == SGLang log-probs, same seed same tokens
#   tests_megatron 540  pytest -m "gpu and megatron" over tests/slime-train-megatron (2 GPUs: + TP=2 vs TP=1)
#   megatron_parallel 300  Megatron GRPO step under (TP,PP,CP) = 1,1,1 2,1,1 1,2,1 1,1,2: same loss/grad norm
#   matmul          30  bf16 8192^3 matmul ceiling
#   train          240  FSDP train() qwen3-0.6b (~60) and qwen3-4b (~150, incl. ~60 s checkpoint write)
#   train_1.7b     120  FSDP train() qwen3-1.7b
#   train_1.7b_profile 200  qwen3-1.7b at the standard shape with a profile (GPU busy vs wall, kernels by category),
#                       then the same with --log-probs-head fp32out
#   train_0.6b_e2e_profile 120  qwen3-0.6b train() at the e2e_tuned shape (256 x (128 + 256) tokens, 16k-token
#                       micro-batches, one optimizer step) with a profile: where the e2e train phase goes
#   train_0.6b_e2e_fused 120  the same with --log-probs-head fused (issue 26; the default since 5d5b5b9's numbers)
#   train_0.6b_e2e_fp32out 120  the same with the former default head, --log-probs-head fp32out: run
#                       `train_0.6b_e2e_fp32out train_0.6b_e2e_profile` in one call to compare the heads
#   logprob_gap    300  probe_logprob_gap.py: one rollout per engine config (default, --enable-fp32-lm-head) scored by
#                       trainer variants and an fp32 HF model: where |trainer - engine| log-prob comes from
#   train_1.7b_16k 120  the same with 16k-token micro-batches (--max-tokens-per-gpu 16384 in a real run)
#   train_base     120  the same with the pre-issue-22 settings (sdpa dense mask, fp32 head, no compile): side by side
#   train_gc       150  FSDP train() qwen3-4b with --gradient-checkpointing
#   train_megatron 200  Megatron train() (TP=PP=1, local spec, packed varlen attention) qwen3-0.6b (~70) and 1.7b (~100),
#                       the FSDP shape (8 x 1024 tokens a micro-batch)
#   train_megatron_1.7b 100  only the 1.7b of train_megatron
#   train_megatron_1.7b_ab 170  issue 26: the 1.7b of train_megatron once, each speed switch off/on in that one process
#                       (bench_train_megatron.py --ab): base, head (--log-probs-head fused), adam (--use-torch-fused-adam),
#                       gradnorm (--use-foreach-grad-norm), fusions (--bias-swiglu-fusion --bias-dropout-fusion), compile
#                       (--megatron-compile-layers), all (head+adam+gradnorm+compile), eager_all (all but compile),
#                       all_hostnorm (all with megatron-core's host-read grad norm: what the device norm saves);
#                       1 warm-up + 2 timed train() each,
#                       profiles of base and all (PROFILE_VARIANTS=...; PROFILE_GAPS=1 adds the idle-gap attribution by
#                       host frame); each variant's time is logged as it finishes. AB_VARIANTS=... picks
#                       others. Budget estimated from reading (~70 s imports, checkpoint and load, ~3 s a variant, ~70 s
#                       of compile warm-ups, ~10 s of profiles), not yet measured; timeout 300
#   swap            60  FSDP qwen3-0.6b train() + sleep()/wake_up() through pinned vs pageable host buffers
#   train_megatron_4b  150  the same for qwen3-4b
#   train_megatron_base 200  qwen3-1.7b with the pre-issue-22 dense-mask attention (--attention-backend local) at
#                       4 micro-batches of 2 x 1024 a step (8 x 1024 OOMs: fp32 [16, T, T] probabilities per layer),
#                       then the packed attention on that same split: side by side
#   megatron_attention 40  one core attention fwd+bwd, dense mask vs packed, qwen3-1.7b heads, 8 x 1024 tokens
#   weight_sync    200  disk vs tensor push, qwen3-0.6b, on the shared engine (engine start 60-100 s once)
#   weight_sync_4b 300  the same for qwen3-4b (starts and stops its own engine)
#   weight_sync_delta 300  full vs --update-weight-mode delta pushes (disk; tensor delta needs the reference engine),
#                       qwen3-0.6b, 3 steps with half the tensors frozen, on the shared engine
#   rollout        150  slime rollout vs direct /generate, 64 prompts x 8 x 256 tokens, shared engine
#   e2e            420  apps/train GRPO, 4 rollouts of 32x8 (needs torch_memory_saver staged for SGLang)
#   e2e_fp8        450  the e2e run with FP8 rollout (bench_e2e.sh FP8=1: SGLang serves a 128x128 block-FP8 copy, the
#                       trainer trains BF16 and quantizes each push; label qwen3-0.6b-fsdp-fp8): run `e2e e2e_fp8` in
#                       one call (≈ 9 min) for tokens/s and first_step_logprob_abs_diff vs BF16 side by side
#   e2e_true_on_policy 450  the e2e run with --true-on-policy-mode (bench_e2e.sh TRUE_ON_POLICY=1, label
#                       qwen3-0.6b-fsdp-true-on-policy): run `e2e e2e_true_on_policy` in one call for tokens/s (>= 0.8x
#                       the plain row) and first_step_logprob_abs_diff (<= 1e-6) side by side (issue 29)
#   e2e_tuned      420  the e2e run with 16k-token micro-batches (TUNED_MAX_TOKENS) and --no-offload-train
#   e2e_tuned_long 480  e2e_tuned with 10 rollouts (TUNED_LONG_ROLLOUTS): the compile warm-up ends within the run, so
#                       e2e_report's tokens_per_s_compiled gives the steady state (a 4-rollout run trains eagerly)
#   e2e_disagg     420  the same on 2 GPUs: trainer on GPU 0, SGLang on GPU 1, NCCL weight sync
#   e2e_async_disagg 420  e2e_disagg with --async (one-step-ahead rollout): the baseline of e2e_fully_async
#   e2e_fully_async 420  e2e_disagg with the fully-async rollout (--max-weight-staleness 1, --partial-rollout): tokens/s
#                       and rollout/staleness_* vs e2e_disagg (sync) and e2e_async_disagg (2 GPUs)
#   e2e_resident   420  issue 30 item 1 on ONE GPU: e2e_tuned with --no-offload-rollout too (trainer and engine stay
#                       resident on the shared GPU; label -resident): the sync baseline of the two below
#   e2e_resident_async 420  e2e_resident with --async (rollout N+1 generates while N trains, on the same GPU)
#   e2e_resident_fully_async 420  e2e_resident with the fully-async rollout (--max-weight-staleness 1, --partial-rollout)
#   e2e_lora       420  the same with LoRA (rank 16, alpha 32, default target modules, lr 1e-5): memory and sync time vs e2e
#   e2e_megatron   420  the same (colocated, 1 GPU) with --train-backend megatron, 2048-token micro-batches
#   e2e_ppo        450  the e2e run with --advantage-estimator ppo (critic colocated, actor and critic offloaded in turn)
#   e2e_ppo_megatron 450  the same with --train-backend megatron
#   e2e_opd        450  the e2e run with --use-opd --opd-type sglang: the shared engine is the teacher (--rm-url)
#   e2e_opd_fsdp   450  the e2e run with --use-opd --opd-type fsdp: the trainer holds the teacher (the same model)
#   trl            420  TRL GRPOTrainer baseline (wheels from .whl, carried with the call)
#   acceptance     480  issue 25, every feature on SGLang, side by side on the one GPU, 3 rollouts of 16x4 each:
#                       GRPO, PPO, LoRA, VL, OPD (the shared engine as teacher; a trainer-side teacher), Megatron
#                       GRPO and Megatron Qwen3-MoE GRPO (qwen3-moe-tiny; each a bench_e2e.sh run with its own engine port range and a fixed KV cache), plus the
#                       SGLang wire recording and checksum cross-check (test_sglang_wire.py -> $OUT/wire/*.json)
#                       On a GPU under 100 GiB (H100) it runs in two waves of four (ACCEPT_WAVES=1|2 overrides): the
#                       eight side by side ran out of memory on an 80 GB H100 (1debb1d), four at a time passed
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
  AB=(--preset "$P06" --tokens-per-mb 64 --seq-len 32 --response-len 16)
else
  P06=qwen3-0.6b; ENGINE=sglang; DEV=(); WS_EXTRA=(); MM=(); MA=(); AB=(--preset qwen3-1.7b)
  RO_SIZE=(--num-prompts 64 --n 8 --max-new-tokens 256 --concurrency 256)
fi

ENGINE_PID=""
# Both paths can be moved (the CPU smoke test gives them its own temp dir: two runs at once must not share them).
ENGINE_URL_FILE="${ENGINE_URL_FILE:-/tmp/slime-bench-engine.url}"
WS_DISK_DIR="${WS_DISK_DIR:-/tmp/slime-bench-weight-sync}"

engine_up() {  # starts the shared qwen3-0.6b engine once (not in a subshell: ENGINE_PID must stick)
  if [[ -n "$ENGINE_PID" ]] && kill -0 "$ENGINE_PID" 2>/dev/null && [[ -s "$ENGINE_URL_FILE" ]]; then
    return 0
  fi
  rm -f "$ENGINE_URL_FILE"
  # SHARED_ENGINE_KV (tokens): a fixed KV cache, for when other runs share the GPU (acceptance).
  python3 "$HERE/_engine.py" --preset "$P06" --engine "$ENGINE" --url-file "$ENGINE_URL_FILE" \
    --mem-fraction "${SHARED_ENGINE_MEM:-0.3}" --max-bs 256 ${SHARED_ENGINE_KV:+--max-total-tokens $SHARED_ENGINE_KV} \
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

# ---- acceptance (issue 25): bench_e2e.sh runs side by side, each with its own engine ports and a fixed KV cache
# (--sglang-mem-fraction-static 0.9 + --sglang-max-total-tokens: an engine's memory then does not depend on what
# the other runs hold when it starts).
# Eight runs share 16 cores: two inductor compile workers each.
ACCEPT_ENV=(NUM_ROLLOUT=3 RBS=16 N=4 MAXLEN=256 ENGINE_MEM_FRACTION=0.9 ENGINE_MAX_TOTAL_TOKENS=30000 CUDA_GRAPH_BS=64
            MAX_TOKENS_PER_GPU=2048 TORCHINDUCTOR_COMPILE_THREADS=2)
if [[ "${BENCH_SMOKE:-0}" == 1 ]]; then  # CPU: the reference engine, a tiny model, 2 rollouts of 2x2
  ACCEPT_ENV=(NUM_ROLLOUT=2 RBS=2 N=2 MAXLEN=8 BENCH_DEVICE=cpu PRESET="$P06" PYTHON="${PYTHON:-python3}")
fi
accept_one() {  # accept_one NAME PORT VAR=VALUE... : one bench_e2e.sh run (its log: $BENCH_LOG_DIR/accept-NAME.log)
  local name="$1" port="$2"; shift 2
  local t0; t0=$(date +%s)
  local left=$(( SESSION_LIMIT - (t0 - SESSION_START) - 15 ))
  if (( left < 60 )); then
    printf '{"bench": "step", "step": "accept_%s", "rc": -2, "seconds": 0, "error": "no time left"}\n' "$name" >> "$BENCH_RESULTS"
    return 0
  fi
  env "${ACCEPT_ENV[@]}" SLIME_ENGINE_BASE_PORT="$port" RUN_DIR="/tmp/slime-bench-e2e/accept-$name" "$@" \
    timeout -k 15 "$left" bash "$HERE/bench_e2e.sh" > "$BENCH_LOG_DIR/accept-$name.log" 2>&1
  local rc=$?
  printf '{"bench": "step", "step": "accept_%s", "rc": %d, "seconds": %d}\n' "$name" "$rc" $(( $(date +%s) - t0 )) \
    >> "$BENCH_RESULTS"
}
accept_tests() {  # accept_tests NAME PYTEST-ARGS... : GPU tests in the background lane set (log accept-NAME.log)
  local name="$1"; shift
  local t0; t0=$(date +%s)
  local left=$(( SESSION_LIMIT - (t0 - SESSION_START) - 15 ))
  SLIME_TEST_LOG_DIR="$BENCH_LOG_DIR/$name" timeout -k 15 "$left" python3 -m pytest -q -rA -p no:cacheprovider \
    -o faulthandler_timeout=240 "$@" > "$BENCH_LOG_DIR/accept-$name.log" 2>&1
  local rc=$?
  printf '{"bench": "step", "step": "accept_%s", "rc": %d, "seconds": %d}\n' "$name" "$rc" $(( $(date +%s) - t0 )) \
    >> "$BENCH_RESULTS"
}
accept_waves() {  # ACCEPT_WAVES, else 2 on a GPU under 100 GiB (eight lanes side by side OOM on an H100), else 1
  if [[ -n "${ACCEPT_WAVES:-}" ]]; then echo "$ACCEPT_WAVES"; return; fi
  local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
  if [[ "$mib" =~ ^[0-9]+$ ]] && (( mib < 100 * 1024 )); then echo 2; else echo 1; fi
}
LANES=()
accept_wait() {  # waits for the lanes (not the shared engine), then appends their logs to logs.txt
  (( ${#LANES[@]} )) && wait "${LANES[@]}"
  LANES=()
  for f in "$BENCH_LOG_DIR"/accept-*.log; do
    [[ -e "$f" ]] || continue
    { echo "===== $(basename "$f") (last 60 lines) ====="; tail -60 "$f"; } >> "$LOGS"
  done
}
want() {  # want LANE: ACCEPT_ONLY="lane ..." runs only those lanes of `acceptance` (a rerun of one)
  [[ -z "${ACCEPT_ONLY:-}" || " $ACCEPT_ONLY " == *" $1 "* ]]
}
acceptance() {
  engine_down
  echo "===== acceptance $(date -u +%H:%M:%S) =====" | tee -a "$LOGS"
  local model; model="$(python3 "$HERE/_common.py" "$P06" "$SLIME_BENCH_MODELS")"  # once, before the runs read it
  mkdir -p "$OUT/wire"
  want wire && ( SLIME_WIRE_RECORD_DIR="$OUT/wire" accept_tests wire -m "sglang" tests/slime-rollout/test_sglang_wire.py ) &
  LANES+=($!)
  want grpo && ( accept_one grpo 16000 LABEL="accept-$P06-fsdp-grpo" ) &
  LANES+=($!)
  want ppo && ( accept_one ppo 17000 LABEL="accept-$P06-fsdp-ppo" \
      EXTRA_FLAGS="--advantage-estimator ppo --normalize-advantages --num-critic-only-steps 1" ) &
  LANES+=($!)
  want lora && ( accept_one lora 18000 LABEL="accept-$P06-fsdp-lora" EXTRA_FLAGS="--lora-rank 16 --lora-alpha 32 --lr 1e-5" ) &
  LANES+=($!)
  if (( $(accept_waves) > 1 )); then  # all eight OOM on one 80 GB H100 (1debb1d): the rest after these four
    (( ${#LANES[@]} )) && wait "${LANES[@]}"
    LANES=()
  fi
  want vl && ( accept_one vl 19000 LABEL="accept-qwen3-vl-fsdp-vl" VL=1 PRESET=qwen3-vl-tiny ) &
  LANES+=($!)
  want opd_trainer && ( accept_one opd_trainer 20000 LABEL="accept-$P06-fsdp-opd-trainer" \
      EXTRA_FLAGS="--use-opd --opd-type fsdp --opd-teacher-load $model" ) &
  LANES+=($!)
  want megatron && ( accept_one megatron 21000 LABEL="accept-$P06-megatron-grpo" TRAIN_BACKEND=megatron ) &
  LANES+=($!)
  # Qwen3-MoE (2 layers, 8 experts, top-2; router aux loss from config.json's router_aux_loss_coef) on Megatron
  want megatron_moe && ( accept_one megatron_moe 23000 LABEL="accept-qwen3-moe-small-megatron-grpo" \
      TRAIN_BACKEND=megatron PRESET=qwen3-moe-small ) &
  LANES+=($!)
  if ! want opd_sglang; then
    :
  elif SHARED_ENGINE_MEM=0.9 SHARED_ENGINE_KV=30000 engine_up 2>>"$LOGS"; then
    ( accept_one opd_sglang 22000 LABEL="accept-$P06-fsdp-opd-sglang" \
        EXTRA_FLAGS="--use-opd --opd-type sglang --rm-url $(cat "$ENGINE_URL_FILE")/generate" ) &
    LANES+=($!)
  else
    printf '{"bench": "step", "step": "accept_opd_sglang", "rc": -1, "seconds": 0, "error": "teacher start failed"}\n' \
      >> "$BENCH_RESULTS"
  fi
  accept_wait
  engine_down
}

[[ $# -gt 0 ]] || { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2; }  # the header comment: usage and steps
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv >> "$LOGS" 2>&1
for step in "$@"; do
  case "$step" in
    tests) run_step tests 600 python3 -m pytest -m "gpu or sglang" -q -x -p no:cacheprovider \
             --ignore tests/slime-train-fsdp/test_true_on_policy_gpu.py \
             tests/slime-core tests/slime-train-fsdp tests/slime-rollout ;;
    tests_true_on_policy) SLIME_TEST_LOG_DIR="$BENCH_LOG_DIR/true-on-policy-tests" run_step tests_true_on_policy 300 \
                    python3 -m pytest -m "gpu or sglang" -q -rA -p no:cacheprovider \
                    tests/slime-train-fsdp/test_true_on_policy_gpu.py ;;
    tests_sglang) SLIME_TEST_LOG_DIR="$BENCH_LOG_DIR/sglang-tests" run_step tests_sglang 300 python3 -m pytest \
                    -m "gpu or sglang" -q -rA -p no:cacheprovider -o faulthandler_timeout=120 \
                    tests/slime-rollout/test_sglang_engine.py tests/slime-rollout/test_routed_experts.py ;;
    # -v: a test's name and result as it ends (a step killed at its limit keeps the ones that finished); 8 tests
    # took > 360 s on one H100 (2026-12-07)
    tests_megatron) run_step tests_megatron 540 python3 -m pytest -m "gpu and megatron" -v -rA -p no:cacheprovider \
                      tests/slime-train-megatron ;;
    megatron_parallel) run_step megatron_parallel 400 python3 "$HERE/bench_megatron_parallel.py" --preset qwen3-0.6b \
                         --layouts 1,1,1 2,1,1 1,2,1 1,1,2 ;;
    matmul) run_step matmul 60 python3 "$HERE/bench_matmul.py" "${DEV[@]}" "${MM[@]}" ;;
    train)
      run_step train_0.6b 150 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-0.6b --swap --peak-tflops "$(peak_tflops)"
      run_step train_4b 300 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-4b --peak-tflops "$(peak_tflops)" ;;
    train_1.7b) run_step train_1.7b 200 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-1.7b \
                  --peak-tflops "$(peak_tflops)" ;;
    train_1.7b_profile) run_step train_1.7b_profile 200 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-1.7b \
                          --profile --peak-tflops "$(peak_tflops)"
      run_step train_1.7b_fp32out 200 python3 "$HERE/bench_train_fsdp.py" --preset qwen3-1.7b \
        --log-probs-head fp32out --profile --peak-tflops "$(peak_tflops)" ;;
    train_0.6b_e2e_profile) run_step train_0.6b_e2e_profile 200 python3 "$HERE/bench_train_fsdp.py" --preset "$P06" \
                              --seq-len 384 --response-len 256 --tokens-per-mb 16384 --mbs-per-step 6 \
                              --steps-per-rollout 1 --profile --peak-tflops "$(peak_tflops)" ;;
    train_0.6b_e2e_fused) run_step train_0.6b_e2e_fused 200 python3 "$HERE/bench_train_fsdp.py" --preset "$P06" \
                            --seq-len 384 --response-len 256 --tokens-per-mb 16384 --mbs-per-step 6 \
                            --steps-per-rollout 1 --profile --log-probs-head fused --peak-tflops "$(peak_tflops)" ;;
    train_0.6b_e2e_fp32out) run_step train_0.6b_e2e_fp32out 200 python3 "$HERE/bench_train_fsdp.py" --preset "$P06" \
                              --seq-len 384 --response-len 256 --tokens-per-mb 16384 --mbs-per-step 6 \
                              --steps-per-rollout 1 --profile --log-probs-head fp32out --peak-tflops "$(peak_tflops)" ;;
    logprob_gap) engine_down; run_step logprob_gap 420 python3 "$HERE/probe_logprob_gap.py" --preset "$P06" \
                   --engine "$ENGINE" "${DEV[@]}" ;;
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
    train_megatron_1.7b_ab) run_step train_megatron_1.7b_ab "${AB_LIMIT_S:-300}" python3 "$HERE/bench_train_megatron.py" \
                              "${AB[@]}" --repeats 2 "${DEV[@]}" \
                              --ab "${AB_VARIANTS:-base,head,adam,gradnorm,fusions,compile,all,eager_all}" \
                              --profile --profile-variants "${PROFILE_VARIANTS:-base,all}" \
                              ${PROFILE_GAPS:+--profile-gaps} --peak-tflops "$(peak_tflops)" ;;
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
                   --disk-dir "$WS_DISK_DIR" "${DEV[@]}" "${WS_EXTRA[@]}" ;;
    weight_sync_4b) run_step weight_sync_4b 450 python3 "$HERE/bench_weight_sync.py" --preset qwen3-4b --modes disk,tensor ;;
    weight_sync_delta) shared_engine_step weight_sync_delta 400 "$HERE/bench_weight_sync.py" --preset "$P06" \
                   --modes disk,tensor --repeats 3 --weight-modes full,delta "${DEV[@]}" "${WS_EXTRA[@]}" ;;
    rollout) shared_engine_step rollout 240 "$HERE/bench_rollout.py" --preset "$P06" "${RO_SIZE[@]}" ;;
    e2e) engine_down; RUN_DIR=/tmp/slime-bench-e2e/run run_step e2e 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_fp8) engine_down; FP8=1 RUN_DIR=/tmp/slime-bench-e2e/fp8 run_step e2e_fp8 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_true_on_policy) engine_down; TRUE_ON_POLICY=1 RUN_DIR=/tmp/slime-bench-e2e/true-on-policy \
                  run_step e2e_true_on_policy 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_tuned) engine_down; MAX_TOKENS_PER_GPU="${TUNED_MAX_TOKENS:-16384}" \
                 EXTRA_FLAGS="${EXTRA_FLAGS:-} --no-offload-train" RUN_DIR=/tmp/slime-bench-e2e/tuned-${TUNED_MAX_TOKENS:-16384} \
                 run_step e2e_tuned 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_tuned_long) engine_down; MAX_TOKENS_PER_GPU="${TUNED_MAX_TOKENS:-16384}" NUM_ROLLOUT="${TUNED_LONG_ROLLOUTS:-10}" \
                 EXTRA_FLAGS="${EXTRA_FLAGS:-} --no-offload-train" RUN_DIR=/tmp/slime-bench-e2e/tuned-long \
                 run_step e2e_tuned_long 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_disagg) engine_down; DISAGG=1 RUN_DIR=/tmp/slime-bench-e2e/disagg run_step e2e_disagg 600 \
                  bash "$HERE/bench_e2e.sh" ;;
    e2e_async_disagg) engine_down; DISAGG=1 EXTRA_FLAGS="${EXTRA_FLAGS:-} --async" LABEL="$P06-fsdp-disagg-async" \
                        RUN_DIR=/tmp/slime-bench-e2e/async-disagg run_step e2e_async_disagg 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_fully_async) engine_down; DISAGG=1 LABEL="$P06-fsdp-disagg-fully-async" RUN_DIR=/tmp/slime-bench-e2e/fully-async \
                       EXTRA_FLAGS="${EXTRA_FLAGS:-} --rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async --max-weight-staleness 1 --partial-rollout" \
                       run_step e2e_fully_async 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_resident|e2e_resident_async|e2e_resident_fully_async) engine_down
      case "$step" in
        e2e_resident) OVERLAP="" ;;
        e2e_resident_async) OVERLAP="--async" ;;
        *) OVERLAP="--rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async --max-weight-staleness 1 --partial-rollout" ;;
      esac
      MAX_TOKENS_PER_GPU="${TUNED_MAX_TOKENS:-16384}" LABEL="$P06-fsdp$(tr _ - <<< "${step#e2e}")" RUN_DIR="/tmp/slime-bench-e2e/${step#e2e_}" \
        EXTRA_FLAGS="${EXTRA_FLAGS:-} --no-offload-train --no-offload-rollout $OVERLAP" \
        run_step "$step" 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_lora) engine_down; EXTRA_FLAGS="${EXTRA_FLAGS:-} --lora-rank 16 --lora-alpha 32 --lr 1e-5" \
                RUN_DIR=/tmp/slime-bench-e2e/lora run_step e2e_lora 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_megatron) engine_down; TRAIN_BACKEND=megatron MAX_TOKENS_PER_GPU=2048 RUN_DIR=/tmp/slime-bench-e2e/megatron \
                    run_step e2e_megatron 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_ppo) engine_down; RUN_DIR=/tmp/slime-bench-e2e/ppo LABEL="$P06-fsdp-ppo" \
               EXTRA_FLAGS="--advantage-estimator ppo --normalize-advantages --num-critic-only-steps 1" \
               run_step e2e_ppo 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_ppo_megatron) engine_down; RUN_DIR=/tmp/slime-bench-e2e/ppo-megatron LABEL="$P06-megatron-ppo" \
                        TRAIN_BACKEND=megatron MAX_TOKENS_PER_GPU=2048 \
                        EXTRA_FLAGS="--advantage-estimator ppo --normalize-advantages --num-critic-only-steps 1" \
                        run_step e2e_ppo_megatron 600 bash "$HERE/bench_e2e.sh" ;;
    e2e_opd)
      if engine_up 2>>"$LOGS"; then
        RUN_DIR=/tmp/slime-bench-e2e/opd LABEL="$P06-fsdp-opd-sglang" \
          EXTRA_FLAGS="--use-opd --opd-type sglang --rm-url $(cat "$ENGINE_URL_FILE")/generate" \
          run_step e2e_opd 600 bash "$HERE/bench_e2e.sh"
      else
        printf '{"bench": "step", "step": "e2e_opd", "rc": -1, "seconds": 0, "error": "teacher engine start failed"}\n' \
          >> "$BENCH_RESULTS"
      fi ;;
    e2e_opd_fsdp) engine_down; RUN_DIR=/tmp/slime-bench-e2e/opd-fsdp LABEL="$P06-fsdp-opd-trainer" \
                    EXTRA_FLAGS="--use-opd --opd-type fsdp --opd-teacher-load $(python3 "$HERE/_common.py" "$P06" \
                    "$SLIME_BENCH_MODELS")" run_step e2e_opd_fsdp 600 bash "$HERE/bench_e2e.sh" ;;
    trl) engine_down
      # From the .whl wheels carried with the call, installed with their metadata (datasets asks
      # importlib.metadata for dill's version, which the staged site copy lacks); one visible GPU, since
      # GRPOTrainer refuses nn.DataParallel.
      run_step trl 600 bash -c "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/trl-site $REPO/.whl/*.whl && CUDA_VISIBLE_DEVICES=0 \
        PYTHONPATH=/tmp/trl-site:\$PYTHONPATH python3 $HERE/bench_trl_grpo.py --preset qwen3-0.6b" ;;
    acceptance) acceptance ;;
    *) echo "gpu_session: unknown step '$step'" | tee -a "$LOGS" ;;
  esac
done
