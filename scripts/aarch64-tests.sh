#!/usr/bin/env bash
# The CPU backend's tests built for aarch64 and run under qemu-user: the NEON kernels (plain
# and with the dot-product extension, which qemu reports) against the scalar reference, as on
# Graviton, Ampere or Apple silicon. Needs Debian's gcc-aarch64-linux-gnu, libc6-dev-arm64-cross
# and qemu-user, and `rustup target add aarch64-unknown-linux-gnu` (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
# No debug info: these binaries only run the tests, and CI's disk is not large.
export CARGO_PROFILE_RELEASE_DEBUG=false
target=aarch64-unknown-linux-gnu
cargo clippy -p infer-cpu --all-targets --release --target "$target" -- -D warnings
cargo test -p infer-cpu --release --target "$target"
