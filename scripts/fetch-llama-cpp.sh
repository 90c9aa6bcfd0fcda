#!/usr/bin/env bash
# Fetches llama.cpp's sources as the llama-cpp-python 0.3.36 sdist ships them (the version the
# fixtures were converted with) from PyPI once, checks its sha256, and prints the directory
# (target/llama-cpp-0.3.36/llama.cpp). Only the files scripts/check_gguf_keys.py reads are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
DEST=target/llama-cpp-$VERSION
if [ ! -f "$DEST/llama.cpp/src/llama-arch.cpp" ]; then
  mkdir -p "$DEST"
  # The sdist from PyPI's simple index (or $PIP_INDEX_URL), as pip would find it; `pip
  # download` would first build the package's metadata, which needs CMake.
  python3 - "$VERSION" "$DEST/sdist.tar.gz" <<'PY'
import os, re, sys, urllib.parse, urllib.request
version, out = sys.argv[1], sys.argv[2]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
page = urllib.request.urlopen(f"{index}/llama-cpp-python/", timeout=60).read().decode()
links = re.findall(rf'href="([^"#]*llama_cpp_python-{re.escape(version)}\.tar\.gz)', page)
if not links:
    sys.exit(f"fetch-llama-cpp: no llama-cpp-python {version} sdist at {index}")
url = urllib.parse.urljoin(f"{index}/llama-cpp-python/", links[0])
with urllib.request.urlopen(url, timeout=300) as src, open(out, "wb") as dst:
    while chunk := src.read(1 << 20):
        dst.write(chunk)
PY
  echo "$SHA256  $DEST/sdist.tar.gz" | sha256sum -c --quiet - >&2
  prefix="llama_cpp_python-$VERSION/vendor/llama.cpp"
  # GNU tar's `*` crosses `/`: src/*.cpp takes src/models/ too.
  tar -xzf "$DEST/sdist.tar.gz" -C "$DEST" --wildcards "$prefix/src/*.cpp" \
    "$prefix/gguf-py/gguf/constants.py" "$prefix/tools/quantize/quantize.cpp"
  rm -rf "$DEST/llama.cpp"
  mv "$DEST/$prefix" "$DEST/llama.cpp"
  rm -rf "$DEST/sdist.tar.gz" "$DEST/llama_cpp_python-$VERSION"
fi
echo "$(pwd)/$DEST/llama.cpp"
