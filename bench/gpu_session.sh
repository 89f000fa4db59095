#!/usr/bin/env bash
# One call on a lent GPU machine: the carried wheels installed, bench/gpu_check.sh's stages run inside
# the call's limit, every log packed into one file that comes back.
#
#   bash bench/gpu_session.sh OUT_DIR SECONDS [STAGE ...]
#
# OUT_DIR   where gpu_logs.tar.gz and summary.txt go (a lent machine returns few files: one archive)
# SECONDS   the call's limit: gpu_check.sh ends 30 s before it (CALL_SECONDS), so the archive is made
# STAGE     gpu_check.sh's stages; none: probe defaults fp16 loop compiled tests, ordered for a
#           15-minute lease (a ~10-minute call, then a ~4-minute one on the still-warm machine with the
#           stages the first did not reach): first the runner at default flags against the naive loop,
#           with `--compile auto` trying "graphs" (CUDA graphs for the utterance parts too: 3.09x the
#           eager step in bench_compile.py on an H100; in the run it must replay recorded paths of
#           shapes, docs/performance.md), 100 steps so that it reaches them, with its compilation
#           inside (~7 min on an H200); then the same in fp16 with its loss scaler, eager (whether the
#           MMS-size model trains as on a T4: ~2 min); then the runner's loop alone (what the host spends
#           per step besides the networks: about a minute); then the CUDA tests of the compiled step, then
#           all of them, whose log names each test as it ends. The shorter call runs the stages left
#           (e.g. `fp16 loop compiled tests`): the compiled tests compile for minutes, and outlasted calls of 116 s,
#           128 s and 190 s before. `ops` and `nhwc` (how much of an eager micro-step the GPU is busy,
#           about 30 s each on an H200) ran on an H200 with the current eager step.
#
# Here, first: `bash bench/gpu_wheels.sh`; then the device's run with carry [".whl"] and
# `bash bench/gpu_session.sh $OUT 570`, timeout_s 600.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash bench/gpu_session.sh OUT_DIR SECONDS [STAGE ...]}
limit=${2:?usage: bash bench/gpu_session.sh OUT_DIR SECONDS [STAGE ...]}
shift 2
[ $# -gt 0 ] || set -- probe defaults fp16 loop compiled tests
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { echo "the carried wheels did not install"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  echo "no .whl/ carried: soundfile, librosa and a usable transformers may be missing (bash bench/gpu_wheels.sh)"
fi
# gpu_check.sh's stages call `python`; the lent machines name the interpreter python3, a venv's, which a
# symbolic link to it would leave (no torch): a script that runs it
bin=$(mktemp -d)
printf '#!/bin/sh\nexec python3 "$@"\n' >"$bin/python"
chmod +x "$bin/python"
export PATH=$bin:$PATH
logs=$(mktemp -d)
CALL_SECONDS=$((limit - SECONDS)) bash bench/gpu_check.sh "$logs" "$@"
status=$?
cp "$logs/summary.txt" "$out/" 2>/dev/null
tar -czf "$out/gpu_logs.tar.gz" -C "$logs" .
echo "logs: $out/gpu_logs.tar.gz ($(du -h "$out/gpu_logs.tar.gz" | cut -f1))"
exit $status
