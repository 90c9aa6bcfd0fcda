#!/usr/bin/env bash
# The chat page's npm packages (web/chat-page: marked and DOMPurify, which web/build.rs embeds
# into the server, and playwright-core for its test), at the lockfile's versions. Installs
# only when missing or out of date, so builds that embed them are not redone for nothing.
set -euo pipefail
cd "$(dirname "$0")/../web/chat-page"
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
