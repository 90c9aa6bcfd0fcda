#!/usr/bin/env python3
"""Checks the links of the README and the book (docs/): every relative link names a file or
folder that exists, and every `#anchor` a heading of its target (GitHub's and mdBook's slugs:
lower case, punctuation dropped, spaces to hyphens). Links to the web are not fetched (CI has
no access to most of them). Also fails on a docs/ page SUMMARY.md does not list, which mdBook
would leave out of the site, and on a README over 300 lines.

  python3 scripts/check_links.py
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
README_MAX_LINES = 300


def strip_code(text):
    """The text without fenced blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"`", "", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    found, text = set(), open(path, encoding="utf-8").read()
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    seen = {}
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    return found


def check(path, errors):
    text = strip_code(open(path, encoding="utf-8").read())
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target) or target.startswith("//"):
            continue
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        where = os.path.relpath(path, ROOT)
        if not os.path.exists(dest):
            errors.append(f"{where}: link to a missing file: {target}")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            errors.append(f"{where}: no heading `#{anchor}` in {os.path.relpath(dest, ROOT)}")


def main():
    errors = []
    docs = os.path.join(ROOT, "docs")
    pages = sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    for path in [os.path.join(ROOT, "README.md")] + pages:
        check(path, errors)
    summary = open(os.path.join(docs, "SUMMARY.md"), encoding="utf-8").read()
    listed = set(re.findall(r"\]\(([^)#]+)", summary))
    for path in pages:
        name = os.path.basename(path)
        if name != "SUMMARY.md" and name not in listed:
            errors.append(f"docs/{name} is not in docs/SUMMARY.md (the book would leave it out)")
    n = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().count("\n")
    if n > README_MAX_LINES:
        errors.append(f"README.md has {n} lines; keep it a front door (≤ {README_MAX_LINES}) and move detail to docs/")
    for e in errors:
        print(e)
    print(f"{len(errors)} link error(s) in README.md and {len(pages)} docs pages", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
