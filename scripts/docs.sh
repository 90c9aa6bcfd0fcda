#!/usr/bin/env bash
# The manual (docs/) as a static site with mdBook, into target/book, after checking every link
# of the README and the book (scripts/check_links.py: files, anchors, pages left out of
# SUMMARY.md, the README's length). Installs mdBook (no default features: just the builder)
# into target/tools when it is not on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/check_links.py
MDBOOK_VERSION=0.5.4
if command -v mdbook >/dev/null && mdbook --version | grep -q "v$MDBOOK_VERSION"; then
    mdbook=mdbook
else
    mdbook=target/tools/bin/mdbook
    if ! "$mdbook" --version 2>/dev/null | grep -q "v$MDBOOK_VERSION"; then
        cargo install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features \
            --root target/tools --quiet
    fi
fi
# mdBook warns (and still builds) on a chapter it cannot read or a broken include: fail on any
# warning or error instead.
log=$("$mdbook" build docs 2>&1) || { echo "$log"; exit 1; }
echo "$log"
if grep -qE '^\S*\s*(WARN|ERROR)' <<<"$log"; then
    echo "docs.sh: mdBook reported the problems above" >&2
    exit 1
fi
echo "docs.sh: the book is in target/book ($(find target/book -name '*.html' | wc -l) pages)"
