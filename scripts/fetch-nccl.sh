#!/usr/bin/env bash
# Fetches NCCL (for tensor parallelism on CUDA) from PyPI into target/nccl and adds the
# `libnccl.so` name cudarc opens next to the wheel's `libnccl.so.2`. Prints the library
# directory: put it on LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=target/nccl
LIB=$DIR/nvidia/nccl/lib
if [ ! -f "$LIB/libnccl.so.2" ]; then
  echo "nccl: downloading nvidia-nccl-cu12 from PyPI" >&2
  python3 -m pip install --quiet --no-deps --disable-pip-version-check --target "$DIR" \
    nvidia-nccl-cu12 >&2
fi
ln -sf libnccl.so.2 "$LIB/libnccl.so"
echo "$PWD/$LIB"
