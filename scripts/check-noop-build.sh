#!/usr/bin/env bash
# A build with nothing changed must compile nothing (issue 38: `web/build.rs` once watched a
# folder that did not exist, so every `cargo build` reran it and relinked the 190 MB binary).
# Runs the cargo command once to settle, then again, and fails if the second prints a
# `Compiling` line. Arguments are the cargo command (default: `build --release -p infer-cli`,
# the binary that embeds the browser build and the chat page, whose build script was at
# issue); scripts/test.sh passes `test ... --no-run` with the test run's own flags, so the
# check costs no extra build there.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(build --release -p infer-cli)
cargo "${args[@]}" >/dev/null 2>&1 || cargo "${args[@]}"
second=$(cargo "${args[@]}" 2>&1)
if grep -E '^\s*Compiling ' <<<"$second"; then
    echo "check-noop-build: a second \`cargo ${args[*]}\` with nothing changed compiled the crates above" >&2
    echo "(a build script's rerun-if-changed names a path that is missing or rewritten by the build)" >&2
    exit 1
fi
echo "check-noop-build: a second \`cargo ${args[*]}\` compiled nothing"
