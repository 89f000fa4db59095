#!/usr/bin/env bash
# Everything that needs a GPU, run once on a machine with one; each stage's log goes to LOG_DIR.
#
#   bash bench/gpu_check.sh LOG_DIR [STAGE ...]      (no STAGE: all of them, in this order)
#
# probe    each import and the first CUDA work, timed (bench/gpu_probe.py); always first: if it fails,
#          nothing else runs
# tests    the CUDA tests: tests/test_gpu.py and the CUDA alignment backends (tests/test_alignment.py)
# compiled the CUDA tests of what `--compile auto` keeps on an H100, first: the "graphs" step (and a
#          cycle of two micro-batches) against the eager one, and the runner compiling (minutes each:
#          inductor compiles the tiny model)
# compile  the compiled step ("segments" and "graphs", the scopes the run itself measures) against the
#          eager one, MMS size, micro-batch 32 (what the trial chose on an H100), bf16
#          (bench_compile.py)
# step     where an MMS-size step goes, eager, fp32 and bf16 (bench_step.py)
# syncs    where an MMS-size step waits for the GPU (bench_syncs.py)
# ops      an MMS-size micro-step's operators, kernels and GPU time by part, and the share of the step
#          the GPU is busy (bench_ops.py --device cuda)
# nhwc     as ops, with the discriminator's 2-D convolutions in NHWC (bench_ops.py --channels_last):
#          on an H100 cuDNN's NCHW<->NHWC conversions took 21 % of the micro-step's kernel time
# eager    the runner at default flags but --compile off, MMS size, against the naive loop (minutes
#          sooner than defaults: no compilation)
# cudnn    as eager, with cuDNN's benchmark mode on (the trainer keeps it off): whether tuning each
#          convolution's algorithm pays on the length-bucketed shapes (the decoder's and the
#          discriminator's, ~88 % of the arithmetic, have one shape per micro-batch size)
# defaults the runner at train_vits.py's default flags, MMS size, against the naive loop (bench_train.py defaults)
# fp16     as defaults, in fp16 with its loss scaler (what a T4 trains in) and --compile off: whether the
#          MMS-size model trains so (its loss at the start and the end, the steps skipped)
# naive    the runner against a naive loop, MMS size, fp32 batch 16 (bench_train.py baseline)
# loop     the runner's loop alone, its step replaced by a wait of 0 or 100 ms: what reading, merging
#          and copying a step's batches and the bookkeeping cost the host per step (bench_train.py
#          loop; about a minute)
# demo     train_vits.py --demo on the GPU with its defaults
# budget   a 10-minute budget on the GPU (bench_train.py budget; BUDGET_MINUTES sets another)
#
# Stages are independent: a failing one is reported and the next one runs. A borrowed machine's call
# has a time limit, and what a call that outruns it printed may never come back, so:
#   STAGE_SECONDS  a stage still running after this many seconds gets SIGABRT (PYTHONFAULTHANDLER
#                  prints where each Python thread was), SIGKILL ten seconds later, and the script goes
#                  on without waiting for it (a process stuck in the driver ignores even SIGKILL);
#   CALL_SECONDS   the whole script ends 30 s before this many seconds: each stage's limit is cut to
#                  what is left, and a stage with less than a minute left is skipped.
# Neither is set by default (no limit). Each stage's start, end and last log lines also go to standard
# output, for when the log files cannot be fetched.
set -uo pipefail
set -m  # each stage in its own process group, so that stopping it stops its workers too
cd "$(dirname "$0")/.."
out=${1:?usage: bash bench/gpu_check.sh LOG_DIR [STAGE ...]}
shift
mkdir -p "$out"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(probe tests compiled eager cudnn syncs ops nhwc defaults fp16 compile step naive loop demo budget)
[ "${stages[0]}" = probe ] || stages=(probe "${stages[@]}")
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONFAULTHANDLER=1
timeout -k 5 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1

run() {  # run STAGE COMMAND...: the command's output into LOG_DIR/STAGE.log, its exit status reported
  local stage=$1
  shift
  local start=$SECONDS limit=${STAGE_SECONDS:-0} status="" i left
  if [ "${CALL_SECONDS:-0}" -gt 0 ]; then
    left=$((CALL_SECONDS - 30 - SECONDS))
    if [ "$left" -lt 60 ]; then
      echo "$stage: skipped, ${left} s left of CALL_SECONDS=$CALL_SECONDS" | tee -a "$out/summary.txt"
      return 1
    fi
    [ "$limit" -gt 0 ] && [ "$limit" -le "$left" ] || limit=$left
  fi
  echo "$(date +%T) $stage: start$([ "$limit" -gt 0 ] && echo ", at most $limit s") ($*)"
  "$@" >"$out/$stage.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$limit" -gt 0 ] && [ $((SECONDS - start)) -ge "$limit" ]; then
      status="stopped after $limit s, "
      kill -ABRT -- "-$pid" 2>/dev/null
      for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null && sleep 1; done
      kill -KILL -- "-$pid" 2>/dev/null
      sleep 1
      break
    fi
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then
    status+="still running after SIGKILL (stuck in the kernel or driver), left behind"
  else
    wait "$pid"
    status+="exit $?"
  fi
  echo "$stage: $status in $((SECONDS - start)) s ($*)" | tee -a "$out/summary.txt"
  tail -n 12 "$out/$stage.log" | sed "s/^/  $stage | /"
  [ "$status" = "exit 0" ]
}

# pytest without pyproject.toml's addopts (-n auto): the lent machines have no pytest-xdist, and the
# tests share one GPU, so they run in one process
for stage in "${stages[@]}"; do
  case $stage in
    probe) run probe python bench/gpu_probe.py --seconds 120 ;;
    tests) run tests python -m pytest --override-ini=addopts= -v tests/test_gpu.py tests/test_alignment.py ;;
    compiled) run compiled python -m pytest --override-ini=addopts= -v \
      "tests/test_gpu.py::test_compiled_step_with_cuda_graphs_gives_the_eager_losses[graphs]" \
      tests/test_gpu.py::test_runner_with_compile_on_the_gpu ;;
    eager) run eager python bench/bench_train.py defaults --models mms --steps 40 --clips 640 --compile off ;;
    cudnn) run cudnn python bench/bench_train.py defaults --models mms --steps 40 --clips 640 --compile off \
      --cudnn_benchmark on ;;
    syncs) run syncs python bench/bench_syncs.py --device cuda --models mms --batch_size 16 --precision bf16 \
      --out "$out/syncs.json" ;;
    ops) run ops python bench/bench_ops.py --device cuda --models mms --batch_size 16 --precision bf16 \
      --label gpu --top 30 --out "$out/ops.json" ;;
    nhwc) run nhwc python bench/bench_ops.py --device cuda --models mms --batch_size 16 --precision bf16 \
      --channels_last --label gpu_nhwc --top 30 --out "$out/ops.json" ;;
    defaults) run defaults python bench/bench_train.py defaults --models mms --steps 100 --clips 640 ;;
    fp16) run fp16 python bench/bench_train.py defaults --models mms --steps 40 --clips 640 --compile off \
      --precision fp16 ;;
    compile) run compile python bench/bench_compile.py --device cuda --models mms --batch_sizes 32 \
      --scopes segments,graphs --precision bf16 --steps 9 --out "$out/compile.json" ;;
    step) run step python bench/bench_step.py --device cuda --models mms --precisions no,bf16 \
      --mms_batch_sizes 8,16,32 --steps 4 --warmup 2 --out "$out/step.json" ;;
    naive) run naive python bench/bench_train.py baseline --models mms --batch_sizes 16 --steps 10 ;;
    loop) run loop python bench/bench_train.py loop --steps 200 --clips 640 ;;
    demo) run demo python train_vits.py --demo ;;
    budget) run budget python bench/bench_train.py budget --minutes "${BUDGET_MINUTES:-10}" ;;
    *) echo "unknown stage: $stage" | tee -a "$out/summary.txt" ;;
  esac || { [ "$stage" = probe ] && echo "the probe failed: no other stage can run" && exit 1; }
done
