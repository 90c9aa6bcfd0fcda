#!/usr/bin/env bash
# A build with nothing changed must compile nothing (issue 38: `web/build.rs` once watched a
# folder that did not exist, so every `cargo build` reran it and relinked the 190 MB binary).
# Builds once to settle, then again, and fails if the second prints a `Compiling` line.
# Arguments go to both `cargo build` calls (default: the workspace as scripts/test.sh tests it).
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--workspace --release --features infer-cli/mpi)
cargo build "${args[@]}" >/dev/null 2>&1 || cargo build "${args[@]}"
second=$(cargo build "${args[@]}" 2>&1)
if grep -E '^\s*Compiling ' <<<"$second"; then
    echo "check-noop-build: a second \`cargo build ${args[*]}\` with nothing changed compiled the crates above" >&2
    echo "(a build script's rerun-if-changed names a path that is missing or rewritten by the build)" >&2
    exit 1
fi
echo "check-noop-build: second build compiled nothing"
