#!/usr/bin/env python3
"""Lists two-file import circles inside each crate of the workspace: module A names module B
(`crate::b::…`, `super::b::…`) while B names A, neither inside the other (a parent and its
child modules may name each other). Test files (`tests.rs`, `tests/` folders) are left out.
CI runs it with `--known scripts/import_circles.txt`, the circles not yet broken (issue 38):
it fails on any circle not listed there, and on a listed one that is gone (take it off the
list), so the list only shrinks.

  python3 scripts/import_circles.py                                      # list them all
  python3 scripts/import_circles.py --known scripts/import_circles.txt   # CI's check
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {"target", "node_modules", ".git", "shared"}
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*?)\}", re.S)


def crates():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        if "Cargo.toml" in filenames and os.path.isdir(os.path.join(dirpath, "src")):
            yield os.path.join(dirpath, "src")


def modules(src):
    """Module path (tuple) -> file, for every file of the crate's module tree."""
    out = {}
    for dirpath, _, filenames in os.walk(src):
        for f in filenames:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)[:-3].split(os.sep)
            if rel[-1] in ("lib", "main", "mod"):
                rel = rel[:-1]
            if rel and rel[0] == "bin":
                continue
            if "tests" in rel:
                continue
            out[tuple(rel)] = os.path.join(dirpath, f)
    return out


def strip_tests(text):
    """The file without its `#[cfg(test)] mod … { … }` blocks and comments."""
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def resolve(module, head, parts, known):
    """The longest known module a path from `module` names."""
    if head == "crate":
        base = ()
    elif head == "self":
        base = module
    else:
        base = module[:-1]
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
    path = base + tuple(parts)
    while path and path not in known:
        path = path[:-1]
    return path


def edges(module, file, known):
    text = strip_tests(open(file, encoding="utf-8").read())
    found = set()
    paths = [(m.group(1), m.group(2)) for m in PATH.finditer(text)]
    for m in GROUP.finditer(text):
        for item in re.split(r"[,\s]+", m.group(3)):
            item = item.split("::")[0].strip("{} ")
            if re.fullmatch(r"[A-Za-z_]\w*", item or ""):
                paths.append((m.group(1), m.group(2) + "::" + item))
    for head, rest in paths:
        parts = [p for p in rest.split("::") if p]
        target = resolve(module, head, parts, known)
        inside = target[: len(module)] == module or module[: len(target)] == target
        if not inside:
            found.add(target)
    return found


def main():
    known_file = sys.argv[2] if len(sys.argv) == 3 and sys.argv[1] == "--known" else None
    if len(sys.argv) > 1 and not known_file:
        sys.exit("usage: import_circles.py [--known FILE]")
    circles = []
    for src in sorted(crates()):
        known = modules(src)
        graph = {m: edges(m, f, known) for m, f in known.items()}
        for a, targets in graph.items():
            for b in targets:
                if a < b and a in graph.get(b, ()):
                    circles.append((os.path.relpath(known[a], ROOT), os.path.relpath(known[b], ROOT)))
    found = {f"{a} <-> {b}" for a, b in circles}
    if not known_file:
        for line in sorted(found):
            print(line)
        print(f"{len(found)} circle(s)", file=sys.stderr)
        return 1 if found else 0
    with open(known_file, encoding="utf-8") as f:
        known = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    new, gone = sorted(found - known), sorted(known - found)
    for line in new:
        print(f"new import circle: {line} (break it: move what both need below them)")
    for line in gone:
        print(f"no longer a circle, take it off {known_file}: {line}")
    print(f"{len(found)} known circle(s) left", file=sys.stderr)
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main())
