#!/usr/bin/env bash
# Fetches NVRTC (CUDA 12's run-time compiler, no GPU needed) from PyPI into target/nvrtc, so
# the CUDA kernels' compile test runs on machines without CUDA. Prints the library directory.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=target/nvrtc
LIB=$DIR/nvidia/cuda_nvrtc/lib
if [ ! -f "$LIB/libnvrtc.so.12" ]; then
  echo "nvrtc: downloading nvidia-cuda-nvrtc-cu12 from PyPI" >&2
  python3 -m pip install --quiet --no-deps --disable-pip-version-check --target "$DIR" \
    nvidia-cuda-nvrtc-cu12==12.9.86 >&2
fi
echo "$PWD/$LIB"
