#!/usr/bin/env bash
# Everything that needs a GPU, run once on a machine with one; each stage's log goes to LOG_DIR.
#
#   bash bench/gpu_check.sh LOG_DIR [STAGE ...]      (no STAGE: all of them, in this order)
#
# tests    the CUDA tests (tests/test_gpu.py) and the compiled-step tests
# compile  the compiled step (three scopes) against the eager one, MMS size, bf16 (bench_compile.py)
# step     where an MMS-size step goes, eager, fp32 and bf16 (bench_step.py)
# syncs    where an MMS-size step waits for the GPU (bench_syncs.py)
# defaults the runner at train_vits.py's default flags, MMS size, against the naive loop (bench_train.py defaults)
# naive    the runner against a naive loop, MMS size, fp32 batch 16 (bench_train.py baseline)
# demo     train_vits.py --demo on the GPU with its defaults
# budget   a 10-minute budget on the GPU (bench_train.py budget)
# Stages are independent: a failing one is reported and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash bench/gpu_check.sh LOG_DIR [STAGE ...]}
shift
mkdir -p "$out"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests syncs defaults compile step naive demo budget)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" >>"$out/gpu.txt" 2>&1

run() {  # run STAGE COMMAND...: the command's output into LOG_DIR/STAGE.log, its exit status reported
  local stage=$1
  shift
  local start=$SECONDS
  "$@" >"$out/$stage.log" 2>&1
  echo "$stage: exit $? in $((SECONDS - start)) s ($*)" | tee -a "$out/summary.txt"
}

for stage in "${stages[@]}"; do
  case $stage in
    tests) run tests python -m pytest -q -x tests/test_gpu.py tests/test_compile.py ;;
    syncs) run syncs python bench/bench_syncs.py --device cuda --models mms --batch_size 16 --precision bf16 \
      --out "$out/syncs.json" ;;
    defaults) run defaults python bench/bench_train.py defaults --models mms --steps 60 --clips 640 ;;
    compile) run compile python bench/bench_compile.py --device cuda --models mms --batch_sizes 16,32 \
      --scopes segments,fused,graphs --precision bf16 --steps 6 --out "$out/compile.json" ;;
    step) run step python bench/bench_step.py --device cuda --models mms --precisions no,bf16 \
      --mms_batch_sizes 8,16,32 --steps 4 --warmup 2 --out "$out/step.json" ;;
    naive) run naive python bench/bench_train.py baseline --models mms --batch_sizes 16 --steps 10 ;;
    demo) run demo python train_vits.py --demo ;;
    budget) run budget python bench/bench_train.py budget --minutes 10 ;;
    *) echo "unknown stage: $stage" | tee -a "$out/summary.txt" ;;
  esac
done
