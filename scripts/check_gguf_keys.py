#!/usr/bin/env python3
"""Checks infer's GGUF key table (core/src/model/gguf_keys/table.rs) against llama.cpp's own
constants in the llama-cpp-python sdist the project converts with (scripts/fetch-llama-cpp.sh
fetches it once; no other network):

1. every key llama.cpp's loader names (src/llama-arch.cpp, LLM_KV_NAMES), gguf-py writes
   (gguf-py/gguf/constants.py, Keys) or llama-quantize records has a row: read, refused unless
   neutral, or inert with a reason;
2. every row names a key one of them knows (no typo, nothing stale);
3. no key llama.cpp's loader reads for an architecture infer accepts (llama_model_base::
   load_hparams and the architecture's load_arch_hparams) is listed as inert.

It also prints, per architecture, the keys llama.cpp's load_arch_hparams reads there that
infer's family refuses (docs/models.md's "GGUF metadata" section is written from it).

    scripts/check_gguf_keys.py [LLAMA_CPP_DIR]
"""
import ast
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE = ROOT / "core/src/model/gguf_keys/table.rs"
FAMILIES = ROOT / "core/src/model/families"


def llama_cpp_dir():
    if len(sys.argv) > 1:
        return pathlib.Path(sys.argv[1])
    out = subprocess.run([str(ROOT / "scripts/fetch-llama-cpp.sh")], check=True, capture_output=True, text=True)
    return pathlib.Path(out.stdout.strip())


def table_rows():
    """(key, kind, in_arch_table, families) for each row of the Rust table; `families` is
    None for every family (`read`), else the families that read it."""
    text = TABLE.read_text()
    groups = {name: re.findall(r"\w+", body)
              for name, body in re.findall(r"const (\w+): &\[Family\] = &\[([^\]]*)\]", text)}
    split = text.index("pub const GLOBAL_KEYS")
    rows = []
    pattern = r'\b(read|read_by|unread|inert)\(\s*"([^"]+)"(?:\s*,\s*(&\[[^\]]*\]|\w+))?'
    for m in re.finditer(pattern, text):
        if m.start() < text.index("pub const ARCH_KEYS"):
            continue  # the constructors' own definitions
        kind, key, who = m.group(1), m.group(2), m.group(3)
        families = None if kind == "read" else []
        if kind == "read_by":
            families = re.findall(r"\w+", who) if who.startswith("&") else groups[who]
        rows.append((key, kind, m.start() < split, families))
    return rows


def llama_kv_names(src):
    """LLM_KV_* enum name -> key ('%s.' replaced by '{arch}.')."""
    text = (src / "src/llama-arch.cpp").read_text()
    body = text[text.index("LLM_KV_NAMES"):]
    body = body[:body.index("};")]
    return {e: k.replace("%s.", "{arch}.") for e, k in re.findall(r'\{\s*(LLM_KV_\w+)\s*,\s*"([^"]+)"\s*\}', body)}


def gguf_py_keys(src):
    """Every string constant of gguf-py's `Keys` classes."""
    tree = ast.parse((src / "gguf-py/gguf/constants.py").read_text())
    keys = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Keys":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Assign) and isinstance(inner.value, ast.Constant) \
                        and isinstance(inner.value.value, str):
                    keys.add(inner.value.value)
    return keys


def quantize_keys(src):
    text = (src / "tools/quantize/quantize.cpp").read_text()
    return set(re.findall(r'"(quantize\.[a-z_.]+)"', text))


def instantiate(key):
    """A concrete key for a templated one (gguf-py's `{id}`, `{name}`, `{dense}`)."""
    return key.replace("{id}", "0").replace("{name}", "tool_use").replace("{dense}", "dense_2")


def matches(row_key, in_arch, key):
    if in_arch:
        if not key.startswith("{arch}."):
            return False
        key = key[len("{arch}."):]
    elif key.startswith("{arch}."):
        return False
    if row_key.endswith("."):
        return key.startswith(row_key)
    return key == row_key


def function_body(text, signature):
    at = text.find(signature)
    if at < 0:
        return ""
    depth, i = 0, text.index("{", at)
    start = i
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return text[start:i]


def our_archs():
    """GGUF architecture -> the family (its `Family` variant) that reads it."""
    archs = {}
    for f in FAMILIES.glob("*.rs"):
        text = f.read_text()
        m = re.search(r"gguf_archs:\s*&\[([^\]]*)\]", text)
        family = re.search(r"family:\s*Family::(\w+)", text)
        if m and family:
            for arch in re.findall(r'"([^"]+)"', m.group(1)):
                archs[arch] = family.group(1)
    return archs


def main():
    src = llama_cpp_dir()
    rows = table_rows()
    kv = llama_kv_names(src)
    known = {instantiate(k) for k in set(kv.values()) | gguf_py_keys(src) | quantize_keys(src)}
    failures = []
    for key in sorted(known):
        if not any(matches(r, a, key) for r, _, a, _ in rows):
            failures.append(f"no row for `{key}` (llama.cpp / gguf-py know it)")
    for row, kind, in_arch, _ in rows:
        if not any(matches(row, in_arch, k) for k in known):
            failures.append(f"row `{row}` ({kind}) names no key llama.cpp or gguf-py knows")

    arch_names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+)\s*,\s*"([^"]+)"\s*\}',
                                 (src / "src/llama-arch.cpp").read_text()))
    by_name = {v: k for k, v in arch_names.items()}
    base = function_body((src / "src/llama-model.cpp").read_text(), "void llama_model_base::load_hparams(")
    models = {f: f.read_text() for f in (src / "src/models").glob("*.cpp")}
    inert = [(r, a) for r, kind, a, _ in rows if kind == "inert"]
    for arch, family in sorted(our_archs().items()):
        enum = by_name.get(arch)
        if enum is None:
            print(f"{arch}: not a llama.cpp architecture (other writers' name)")
            continue
        cls = "llama_model_" + enum[len("LLM_ARCH_"):].lower()
        body = next((function_body(t, f"void {cls}::load_arch_hparams(") for t in models.values()
                     if f"{cls}::load_arch_hparams" in t), "")
        read = {kv[e] for e in re.findall(r"\b(LLM_KV_\w+)\b", base + body) if e in kv}
        # `general.name` is read as a label only.
        bad = [k for k in read if k.startswith("{arch}.") and any(matches(r, a, k) for r, a in inert)]
        failures += [f"{arch}: llama.cpp reads `{k}` but the table calls it inert" for k in bad]
        own = {kv[e] for e in re.findall(r"\b(LLM_KV_\w+)\b", body) if e in kv}
        refused = sorted(k[len("{arch}."):] for k in own for r, kind, a, fams in rows
                         if matches(r, a, k) and kind != "inert" and fams is not None and family not in fams)
        print(f"{arch} ({family}): llama.cpp reads {len(read)} keys; of its architecture's own, infer refuses "
              "(unless neutral): "
              + (", ".join(refused) or "none"))
    print(f"{len(rows)} rows, {len(known)} keys known to llama.cpp 0.3.36 / gguf-py")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
