#!/usr/bin/env python3
"""Random blocks of every GGUF quant type we read (Q4_0 .. Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4)
and their f32 values as dequantized by the `gguf` package's numpy code, stored together in
fixtures/quants.gguf: tensor `<type>` holds the blocks and `<type>.expected` the f32 values.
Re-run:  python3 -m venv /tmp/gg && /tmp/gg/bin/pip install gguf numpy
         /tmp/gg/bin/python scripts/quant_fixture.py
"""
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

ROWS, COLS = 3, 512
# Byte offsets of the f16 scales inside each block, set to finite small values (random bytes
# elsewhere: every bit pattern of the codes and sub-block scales is a valid block).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: [],
}


def main():
    rng = np.random.default_rng(7)
    out = pathlib.Path(__file__).parent.parent / "fixtures" / "quants.gguf"
    w = GGUFWriter(str(out), "quant-fixture")
    for qtype, fields in F16_FIELDS.items():
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        n_blocks = ROWS * COLS // block_elems
        raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for at in fields:
            scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
            raw[:, at:at + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
        if qtype == T.MXFP4:
            raw[:, 0] = rng.integers(115, 130, size=n_blocks, dtype=np.uint8)
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
