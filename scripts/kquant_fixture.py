#!/usr/bin/env python3
"""Random K-quant blocks (Q2_K..Q6_K) and their f32 values as dequantized by the `gguf`
package, stored together in fixtures/kquants.gguf: tensor `<type>` holds the blocks and
`<type>.expected` the f32 values. Re-run:  python3 scripts/kquant_fixture.py
"""
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

ROWS, COLS = 3, 512
# byte offsets of the f16 scales inside each block (kept finite and small)
F16_FIELDS = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def main():
    rng = np.random.default_rng(7)
    out = pathlib.Path(__file__).parent.parent / "fixtures" / "kquants.gguf"
    w = GGUFWriter(str(out), "kquant-fixture")
    for qtype, fields in F16_FIELDS.items():
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        n_blocks = ROWS * COLS // block_elems
        raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for at in fields:
            scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
            raw[:, at:at + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
        raw = raw.reshape(ROWS, COLS // block_elems * block_bytes)
        expected = dequantize(raw, qtype).reshape(ROWS, COLS).astype(np.float32)
        assert np.isfinite(expected).all()
        w.add_tensor(qtype.name.lower(), raw, raw_dtype=qtype)
        w.add_tensor(qtype.name.lower() + ".expected", expected)
        print(qtype.name, raw.shape, float(np.abs(expected).max()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
