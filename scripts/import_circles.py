#!/usr/bin/env python3
"""Fails on an import circle between files inside a crate of the workspace: modules that
name each other (`crate::b::…`, `super::b::…`), directly or through others, neither inside the
other (a parent and its child modules may name each other). Each circle is printed as the
files it runs through. Test files (`tests.rs`, `tests/` folders) are left out. CI runs it
(scripts/test.sh); the workspace has none since issue 38.

  python3 scripts/import_circles.py
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


def circles(graph):
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main():
    if len(sys.argv) > 1:
        sys.exit("usage: import_circles.py")
    found = []
    for src in sorted(crates()):
        known = modules(src)
        graph = {m: edges(m, f, known) for m, f in known.items()}
        for component in circles(graph):
            files = sorted(os.path.relpath(known[m], ROOT) for m in component)
            found.append(" <-> ".join(files))
    for line in found:
        print(f"import circle: {line} (break it: move what they share below them)")
    print(f"{len(found)} import circle(s)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
