#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels a lent GPU machine lacks, into .whl/ (git-ignored):
#
#   bash bench/gpu_wheels.sh
#
# The lent machines run Python 3.12 with torch, accelerate, numpy, scipy, numba, matplotlib, tokenizers
# and huggingface_hub already installed and nothing reachable; soundfile, librosa, uroman and datasets
# (with what they need beyond the image) must travel. transformers travels too: the image's 5.17.0 is
# the release requirements.txt excludes; with it regex, which the image lists but its Python lacks.
# bench/gpu_session.sh installs them there. ~18 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl \
  transformers==5.24.0 regex soundfile==0.14.0 cffi pycparser librosa==0.11.0 audioread soxr pooch platformdirs \
  decorator uroman==1.3.1.1 datasets dill multiprocess
ls .whl
du -sh .whl
