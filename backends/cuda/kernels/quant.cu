// Weight matrices kept as GGUF stores them (ggml-common.h layouts) and computed on directly.
// Every type is read in units of 32 consecutive weights of a row: a whole Q8_0 / Q4_0 / Q4_1
// block, an eighth of a K-quant super-block, or 32 halves of an f16 row. Per type, a float
// dequantizer (`piece`) serves the f16 dequantization in front of cuBLAS for large batches and
// the embedding gather (and the f16 matvec), and an integer unpacker (`ints`) the decode
// matvec on q8_1 activations. Blocks are 2-byte aligned (every block size and field offset is
// even), so quants are read as 16-bit words; K-quant blocks of 144 and 176 bytes are
// 16-aligned and read in 16-byte loads.
typedef unsigned char u8;
typedef unsigned short u16;

// Rows of activations one matvec launch multiplies (the Rust side's MATVEC_MAX_ROWS).
#define MATVEC_MAX_ROWS 8

__device__ __forceinline__ float ld_f16(const u8* p) { return f16_to_f32(*(const u16*)p); }

// Four bytes at a 2-aligned address.
__device__ __forceinline__ u32 ld_u32(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// Each type reads weights 8p .. 8p + 8 (`piece` p, 0..4) of unit u of a block; a warp's lanes
// take consecutive pieces, so its loads of weights and activations are contiguous.
struct TF16 {
    static constexpr u32 PER_BLOCK = 32, BYTES = 64, UNITS = 1;
    // 16 bytes at a 16-aligned address (rows of a multiple of 32 halves).
    __device__ static void piece(const u8* b, u32, u32 p, float* w) {
        uint4 v = *(const uint4*)(b + 16 * p);
        u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            w[2 * t] = f16_to_f32((u16)(words[t] & 0xffff));
            w[2 * t + 1] = f16_to_f32((u16)(words[t] >> 16));
        }
    }
};

// Eight bytes at a 2-aligned address, as two words.
__device__ __forceinline__ void ld_8(const u8* p, u32* lo, u32* hi) {
    *lo = ld_u32(p);
    *hi = ld_u32(p + 4);
}

// d, then 32 signed bytes.
struct TQ8_0 {
    static constexpr u32 PER_BLOCK = 32, BYTES = 34, UNITS = 1;
    __device__ static void piece(const u8* b, u32, u32 p, float* w) {
        float d = ld_f16(b);
        u32 q[2];
        ld_8(b + 2 + 8 * p, &q[0], &q[1]);
#pragma unroll
        for (int t = 0; t < 8; ++t) w[t] = d * (float)(signed char)((q[t >> 2] >> (8 * (t & 3))) & 0xff);
    }
};

// Eight 4-bit codes: nibble `shift` of the eight bytes at q.
__device__ __forceinline__ void nibbles(const u8* q, u32 shift, u32* codes) {
    u32 v[2];
    ld_8(q, &v[0], &v[1]);
#pragma unroll
    for (int t = 0; t < 8; ++t) codes[t] = (v[t >> 2] >> (8 * (t & 3) + shift)) & 15;
}

// d, then 16 bytes: weight j in byte j's low nibble, weight j + 16 in its high one; codes
// centred on 8.
struct TQ4_0 {
    static constexpr u32 PER_BLOCK = 32, BYTES = 18, UNITS = 1;
    __device__ static void piece(const u8* b, u32, u32 p, float* w) {
        float d = ld_f16(b);
        u32 c[8];
        nibbles(b + 2 + 8 * (p & 1), 4 * (p >> 1), c);
#pragma unroll
        for (int t = 0; t < 8; ++t) w[t] = d * ((float)c[t] - 8.0f);
    }
};

// d, m, then nibbles as Q4_0: d * q + m.
struct TQ4_1 {
    static constexpr u32 PER_BLOCK = 32, BYTES = 20, UNITS = 1;
    __device__ static void piece(const u8* b, u32, u32 p, float* w) {
        float d = ld_f16(b), m = ld_f16(b + 2);
        u32 c[8];
        nibbles(b + 4 + 8 * (p & 1), 4 * (p >> 1), c);
#pragma unroll
        for (int t = 0; t < 8; ++t) w[t] = d * (float)c[t] + m;
    }
};

// Scale and min `j` (0..8) of a Q4_K / Q5_K super-block: 6 bits each in the 12 bytes at the
// 4-aligned `q`. Read as three words and selected without a branch: a warp's lanes take
// different sub-blocks, and a branch would run both sides.
__device__ __forceinline__ void scale_min_k4(u32 j, const u8* q, float* sc, float* mn) {
    const u32* w = (const u32*)q;
    u32 s0 = w[0], s1 = w[1], s2 = w[2], sh = 8 * (j & 3);
    u32 lo_sc = (s0 >> sh) & 63, lo_mn = (s1 >> sh) & 63;
    u32 b_hi = (s2 >> sh) & 0xff;  // byte j + 4, for j >= 4
    u32 hi_sc = (b_hi & 0x0f) | (((s0 >> sh) & 0xc0) >> 2);
    u32 hi_mn = (b_hi >> 4) | (((s1 >> sh) & 0xc0) >> 2);
    *sc = (float)(j < 4 ? lo_sc : hi_sc);
    *mn = (float)(j < 4 ? lo_mn : hi_mn);
}

// Sub-block u's multiplier d · scale and offset dmin · min in a Q4_K / Q5_K block (d, dmin,
// then the scales at byte 4).
__device__ __forceinline__ void k4_scale_min(const u8* b, u32 u, float* d, float* m) {
    float sc, mn;
    scale_min_k4(u, b + 4, &sc, &mn);
    *d = ld_f16(b) * sc;
    *m = ld_f16(b + 2) * mn;
}

// Eight 4-bit codes from the 8-aligned q (K-quant blocks are 16-aligned): one 8-byte load.
__device__ __forceinline__ void nibbles8(const u8* q, u32 shift, u32* codes) {
    uint2 v = *(const uint2*)q;
    u32 vv[2] = {v.x, v.y};
#pragma unroll
    for (int t = 0; t < 8; ++t) codes[t] = (vv[t >> 2] >> (8 * (t & 3) + shift)) & 15;
}

// d, dmin, scales[12], qs[128]. Unit u: sub-block u, whose quants are the low (u even) or
// high (u odd) nibbles of qs[32 * (u / 2) ..][0..32].
struct TQ4_K {
    static constexpr u32 PER_BLOCK = 256, BYTES = 144, UNITS = 8;
    __device__ static void piece(const u8* b, u32 u, u32 p, float* w) {
        float d, m;
        k4_scale_min(b, u, &d, &m);
        u32 c[8];
        nibbles8(b + 16 + 32 * (u >> 1) + 8 * p, 4 * (u & 1), c);
#pragma unroll
        for (int t = 0; t < 8; ++t) w[t] = d * (float)c[t] - m;
    }
};

// Q4_K with qh[32] after the scales: bit u of qh[l] is weight l's fifth bit.
struct TQ5_K {
    static constexpr u32 PER_BLOCK = 256, BYTES = 176, UNITS = 8;
    __device__ static void piece(const u8* b, u32 u, u32 p, float* w) {
        float d, m;
        k4_scale_min(b, u, &d, &m);
        u32 c[8];
        nibbles8(b + 48 + 32 * (u >> 1) + 8 * p, 4 * (u & 1), c);
        uint2 hv = *(const uint2*)(b + 16 + 8 * p);
        u32 h[2] = {hv.x, hv.y};
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            u32 code = c[t] | (((h[t >> 2] >> (8 * (t & 3) + u)) & 1) << 4);
            w[t] = d * (float)code - m;
        }
    }
};

// ql[128], qh[64], scales[16] (i8, one per 16 weights), d. Unit u = 4n + k covers weights
// 128n + 32k ..: low bits from the low (k < 2) or high nibble of ql[64n + 32 (k & 1) ..],
// high bits (qh[32n ..] >> 2k) & 3, codes centred on 32.
struct TQ6_K {
    static constexpr u32 PER_BLOCK = 256, BYTES = 210, UNITS = 8;
    __device__ static void piece(const u8* b, u32 u, u32 p, float* w) {
        u32 n = u >> 2, k = u & 3;
        float d = ld_f16(b + 208) * (float)((const signed char*)b)[192 + 8 * n + 2 * k + (p >> 1)];
        u32 c[8], h[2];
        nibbles(b + 64 * n + 32 * (k & 1) + 8 * p, 4 * (k >> 1), c);
        ld_8(b + 128 + 32 * n + 8 * p, &h[0], &h[1]);
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            int code = (int)(c[t] | (((h[t >> 2] >> (8 * (t & 3) + 2 * k)) & 3) << 4)) - 32;
            w[t] = d * (float)code;
        }
    }
};

// The 32 weights of unit u, as four pieces.
template <class T>
__device__ __forceinline__ void unit(const u8* b, u32 u, float* w) {
#pragma unroll
    for (u32 p = 0; p < 4; ++p) T::piece(b, u, p, w + 8 * p);
}

// ---- Integer dot products for decode (llama.cpp's MMVQ scheme) ----
// Activations are quantized once per matmul to q8_1 runs of 32: int8 codes q with
// d = max|x| / 127 (x ≈ d q) and s = d Σq. A unit of 32 weights unpacks to eight ints of four
// int8 codes each, with scales d0 (codes 0..16) and d1 (16..32) and an offset coefficient mw,
// so that Σ w x ≈ dx (d0 Σ₀..₁₆ wq xq + d1 Σ₁₆..₃₂ wq xq) + mw s: four multiply-adds per
// `__dp4a` instead of one per weight, and a quarter of the activation bytes.

// The 32 activations at x as codes (eight ints) and (d, s).
__device__ __forceinline__ void quantize_run_q8_1(const float* x, int* q, float* d_out, float* s_out) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        u32 packed = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int c = (int)rintf(x[4 * t + j] * inv);
            c = c > 127 ? 127 : (c < -127 ? -127 : c);
            sum += c;
            packed |= ((u32)c & 0xff) << (8 * j);
        }
        q[t] = (int)packed;
    }
    *d_out = d;
    *s_out = d * (float)sum;
}

// Four signed byte products added to c.
__device__ __forceinline__ int dot4(int a, int b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 610
    for (int j = 0; j < 4; ++j) c += (int)(signed char)(a >> (8 * j)) * (int)(signed char)(b >> (8 * j));
    return c;
#else
    return __dp4a(a, b, c);
#endif
}

// Each type's `ints(b, u, w, &d0, &d1, &mw)`: unit u of block b as eight ints of codes.
struct IQ8_0 {
    __device__ static void ints(const u8* b, u32, int* w, float* d0, float* d1, float* mw) {
#pragma unroll
        for (int t = 0; t < 8; ++t) w[t] = (int)ld_u32(b + 2 + 4 * t);
        *d0 = *d1 = ld_f16(b);
        *mw = 0.0f;
    }
};

// Q4_0 / Q4_1 nibbles at the 2-aligned q: weight j (< 16) low, j + 16 high.
__device__ __forceinline__ void nibble_ints(const u8* q, int* w) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        u32 v = ld_u32(q + 4 * t);
        w[t] = (int)(v & 0x0f0f0f0fu);
        w[t + 4] = (int)((v >> 4) & 0x0f0f0f0fu);
    }
}

// Codes 0..16 centred on 8: Σ d (q - 8) x = d Σ q x - 8 d Σ x.
struct IQ4_0 {
    __device__ static void ints(const u8* b, u32, int* w, float* d0, float* d1, float* mw) {
        nibble_ints(b + 2, w);
        float d = ld_f16(b);
        *d0 = *d1 = d;
        *mw = -8.0f * d;
    }
};

struct IQ4_1 {
    __device__ static void ints(const u8* b, u32, int* w, float* d0, float* d1, float* mw) {
        nibble_ints(b + 4, w);
        *d0 = *d1 = ld_f16(b);
        *mw = ld_f16(b + 2);
    }
};

// 32 bytes at a 16-aligned address as eight words (two 16-byte loads).
__device__ __forceinline__ void ld_32(const u8* p, u32* v) {
    uint4 a = ((const uint4*)p)[0], b = ((const uint4*)p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Sub-block u: bytes qs[32 (u / 2) ..][0..32], nibble u % 2 (K-quant blocks are 16-aligned).
struct IQ4_K {
    __device__ static void ints(const u8* b, u32 u, int* w, float* d0, float* d1, float* mw) {
        u32 q[8], shift = 4 * (u & 1);
        ld_32(b + 16 + 32 * (u >> 1), q);
#pragma unroll
        for (int t = 0; t < 8; ++t) w[t] = (int)((q[t] >> shift) & 0x0f0f0f0fu);
        float d, m;
        k4_scale_min(b, u, &d, &m);
        *d0 = *d1 = d;
        *mw = -m;
    }
};

// Q4_K's nibbles plus bit u of qh[l] as weight l's fifth bit.
struct IQ5_K {
    __device__ static void ints(const u8* b, u32 u, int* w, float* d0, float* d1, float* mw) {
        u32 q[8], h[8], shift = 4 * (u & 1);
        ld_32(b + 48 + 32 * (u >> 1), q);
        ld_32(b + 16, h);
#pragma unroll
        for (int t = 0; t < 8; ++t)
            w[t] = (int)(((q[t] >> shift) & 0x0f0f0f0fu) | (((h[t] >> u) & 0x01010101u) << 4));
        float d, m;
        k4_scale_min(b, u, &d, &m);
        *d0 = *d1 = d;
        *mw = -m;
    }
};

// Unit u = 4n + k: six-bit codes less 32 (they fit a signed byte), a scale per 16 weights.
struct IQ6_K {
    __device__ static void ints(const u8* b, u32 u, int* w, float* d0, float* d1, float* mw) {
        u32 n = u >> 2, k = u & 3;
        const u8* ql = b + 64 * n + 32 * (k & 1);
        const u8* qh = b + 128 + 32 * n;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            u32 lo = (ld_u32(ql + 4 * t) >> (4 * (k >> 1))) & 0x0f0f0f0fu;
            u32 hi = ((ld_u32(qh + 4 * t) >> (2 * k)) & 0x03030303u) << 4;
            // Each byte is 0..63, so subtracting 32 per byte never borrows across bytes
            // once 0x80 is added first and taken back: (v + 0x60) ^ 0x80 per byte = v - 32.
            w[t] = (int)(((lo | hi) + 0x60606060u) ^ 0x80808080u);
        }
        float d = ld_f16(b + 208);
        const signed char* sc = (const signed char*)b + 192 + 8 * n + 2 * k;
        *d0 = d * (float)sc[0];
        *d1 = d * (float)sc[1];
        *mw = 0.0f;
    }
};

// Σ w x over one unit: weights as ints (with d0, d1, mw) against activations q (eight ints)
// with (dx, sx).
__device__ __forceinline__ float unit_dot(const int* w, float d0, float d1, float mw, const int* q,
                                          float dx, float sx) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        s0 = dot4(w[t], q[t], s0);
        s1 = dot4(w[t + 4], q[t + 4], s1);
    }
    return dx * (d0 * (float)s0 + d1 * (float)s1) + mw * sx;
}

template <class T>
__device__ __forceinline__ const u8* unit_block(const u8* row, u32 g) {
    return row + (size_t)(g / T::UNITS) * T::BYTES;
}

// y[i, r] = x[i, :] · w[r, :] on f32 activations (the f16 matvec; packed types take
// `matvec_q8`) for the m (<= MATVEC_MAX_ROWS) rows of x: each warp takes
// MATVEC_ROWS_PER_WARP weight rows (their loads in flight together, each activation read once
// for them), so every weight is read once for all m rows. Lane l takes weights 8l .. 8l + 8 of
// each run of 256: the warp reads each run's blocks and activations as contiguous spans.
// blockDim.x = 128.
#define MATVEC_ROWS_PER_WARP 2
template <class T>
__device__ void matvec(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                       u32 rows, u32 cols, u32 m) {
    const u32 R = MATVEC_ROWS_PER_WARP;
    u32 lane = threadIdx.x & 31;
    u32 r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    if (r0 >= rows) return;
    size_t row_bytes = (size_t)(cols / T::PER_BLOCK) * T::BYTES;
    // A last warp with fewer rows repeats its last one (never stored).
    const u8* wrow[R];
#pragma unroll
    for (u32 j = 0; j < R; ++j) wrow[j] = w + (size_t)min(r0 + j, rows - 1) * row_bytes;
    float acc[MATVEC_MAX_ROWS][R];
#pragma unroll
    for (int i = 0; i < MATVEC_MAX_ROWS; ++i)
#pragma unroll
        for (u32 j = 0; j < R; ++j) acc[i][j] = 0.0f;
#pragma unroll 2
    for (u32 k0 = 8 * lane; k0 < cols; k0 += 256) {
        u32 g = k0 >> 5, u = g % T::UNITS, p = (k0 >> 3) & 3;
        float wv[R][8];
#pragma unroll
        for (u32 j = 0; j < R; ++j) T::piece(unit_block<T>(wrow[j], g), u, p, wv[j]);
#pragma unroll
        for (u32 i = 0; i < MATVEC_MAX_ROWS; ++i) {
            if (i < m) {
                const float4* xp = (const float4*)(x + (size_t)i * cols + k0);
                float4 a = xp[0], b = xp[1];
#pragma unroll
                for (u32 j = 0; j < R; ++j)
                    acc[i][j] += wv[j][0] * a.x + wv[j][1] * a.y + wv[j][2] * a.z + wv[j][3] * a.w +
                                 wv[j][4] * b.x + wv[j][5] * b.y + wv[j][6] * b.z + wv[j][7] * b.w;
            }
        }
    }
#pragma unroll
    for (u32 i = 0; i < MATVEC_MAX_ROWS; ++i) {
        if (i < m) {
#pragma unroll
            for (u32 j = 0; j < R; ++j) {
                float s = warp_sum(acc[i][j]);
                if (lane == 0 && r0 + j < rows) y[(size_t)i * rows + r0 + j] = s;
            }
        }
    }
}

// x [runs * 32] f32 to q8_1: codes q (eight ints a run) and ds (d, s) a run; a thread a run.
extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, int* __restrict__ q,
                                         float2* __restrict__ ds, u32 runs) {
    for (u32 r = blockIdx.x * blockDim.x + threadIdx.x; r < runs; r += gridDim.x * blockDim.x) {
        float v[32];
        const float4* xp = (const float4*)(x + (size_t)r * 32);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            float4 a = xp[k];
            v[4 * k] = a.x;
            v[4 * k + 1] = a.y;
            v[4 * k + 2] = a.z;
            v[4 * k + 3] = a.w;
        }
        int c[8];
        float d, sum;
        quantize_run_q8_1(v, c, &d, &sum);
        uint4* out = (uint4*)(q + (size_t)r * 8);
        out[0] = make_uint4((u32)c[0], (u32)c[1], (u32)c[2], (u32)c[3]);
        out[1] = make_uint4((u32)c[4], (u32)c[5], (u32)c[6], (u32)c[7]);
        ds[r] = make_float2(d, sum);
    }
}

// `matvec` on q8_1 activations (`quantize_q8_1`): lane l takes units l, l + 32, ... of its
// warp's rows (a unit's weights are one contiguous span of the block), unpacked once and
// dotted with each activation row's codes by `__dp4a`.
template <class T, class I>
__device__ void matvec_q8(const u8* __restrict__ w, const int* __restrict__ xq,
                          const float2* __restrict__ xds, float* __restrict__ y, u32 rows, u32 cols,
                          u32 m) {
    const u32 R = MATVEC_ROWS_PER_WARP;
    u32 lane = threadIdx.x & 31;
    u32 r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    if (r0 >= rows) return;
    size_t row_bytes = (size_t)(cols / T::PER_BLOCK) * T::BYTES;
    const u8* wrow[R];
#pragma unroll
    for (u32 j = 0; j < R; ++j) wrow[j] = w + (size_t)min(r0 + j, rows - 1) * row_bytes;
    float acc[MATVEC_MAX_ROWS][R];
#pragma unroll
    for (int i = 0; i < MATVEC_MAX_ROWS; ++i)
#pragma unroll
        for (u32 j = 0; j < R; ++j) acc[i][j] = 0.0f;
    u32 units = cols >> 5;
#pragma unroll 2
    for (u32 g = lane; g < units; g += 32) {
        u32 u = g % T::UNITS;
        int wv[R][8];
        float d0[R], d1[R], mw[R];
#pragma unroll
        for (u32 j = 0; j < R; ++j) I::ints(unit_block<T>(wrow[j], g), u, wv[j], &d0[j], &d1[j], &mw[j]);
#pragma unroll
        for (u32 i = 0; i < MATVEC_MAX_ROWS; ++i) {
            if (i < m) {
                const uint4* xp = (const uint4*)(xq + ((size_t)i * units + g) * 8);
                uint4 a = xp[0], b = xp[1];
                int qv[8] = {(int)a.x, (int)a.y, (int)a.z, (int)a.w, (int)b.x, (int)b.y, (int)b.z, (int)b.w};
                float2 ds = xds[(size_t)i * units + g];
#pragma unroll
                for (u32 j = 0; j < R; ++j) acc[i][j] += unit_dot(wv[j], d0[j], d1[j], mw[j], qv, ds.x, ds.y);
            }
        }
    }
#pragma unroll
    for (u32 i = 0; i < MATVEC_MAX_ROWS; ++i) {
        if (i < m) {
#pragma unroll
            for (u32 j = 0; j < R; ++j) {
                float s = warp_sum(acc[i][j]);
                if (lane == 0 && r0 + j < rows) y[(size_t)i * rows + r0 + j] = s;
            }
        }
    }
}

// The whole matrix as f16 [rows, cols] (a grid-stride loop over units), for cuBLAS.
template <class T>
__device__ void dequant(const u8* w, f16* out, u32 rows, u32 cols) {
    size_t units = cols / 32, total = (size_t)rows * units;
    size_t row_bytes = (size_t)(cols / T::PER_BLOCK) * T::BYTES;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / units;
        u32 g = (u32)(i % units);
        float wv[32];
        unit<T>(unit_block<T>(w + r * row_bytes, g), g % T::UNITS, wv);
        // 32 halves at a 64-byte aligned offset: four 16-byte stores.
        uint4* o = (uint4*)(out + r * cols + (size_t)g * 32);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            u32 p[4];
#pragma unroll
            for (int t = 0; t < 4; ++t)
                p[t] = (u32)f32_to_f16(wv[8 * k + 2 * t]) | ((u32)f32_to_f16(wv[8 * k + 2 * t + 1]) << 16);
            uint4 v;
            v.x = p[0];
            v.y = p[1];
            v.z = p[2];
            v.w = p[3];
            o[k] = v;
        }
    }
}

// out[t] = row ids[t] of the table, as f32; one block per token.
template <class T>
__device__ void embed(const u8* w, const u32* ids, float* out, u32 cols) {
    const u8* row = w + (size_t)ids[blockIdx.x] * (cols / T::PER_BLOCK) * T::BYTES;
    float* dst = out + (size_t)blockIdx.x * cols;
    for (u32 g = threadIdx.x; g < cols / 32; g += blockDim.x) {
        float wv[32];
        unit<T>(unit_block<T>(row, g), g % T::UNITS, wv);
#pragma unroll
        for (int k = 0; k < 32; ++k) dst[(size_t)g * 32 + k] = wv[k];
    }
}

#define MATVEC(NAME, T)                                                                       \
    extern "C" __global__ void matvec_##NAME(const u8* w, const float* x, float* y, u32 rows, \
                                             u32 cols, u32 m) {                               \
        matvec<T>(w, x, y, rows, cols, m);                                                    \
    }
#define QUANT(NAME, T, I)                                                                     \
    extern "C" __global__ void matvec_q8_##NAME(const u8* w, const int* xq, const float2* xds, \
                                                float* y, u32 rows, u32 cols, u32 m) {        \
        matvec_q8<T, I>(w, xq, xds, y, rows, cols, m);                                        \
    }                                                                                         \
    extern "C" __global__ void dequant_##NAME(const u8* w, f16* out, u32 rows, u32 cols) {    \
        dequant<T>(w, out, rows, cols);                                                       \
    }                                                                                         \
    extern "C" __global__ void embedding_##NAME(const u8* w, const u32* ids, float* out,      \
                                                u32 cols) {                                   \
        embed<T>(w, ids, out, cols);                                                          \
    }

MATVEC(f16, TF16)
QUANT(q8_0, TQ8_0, IQ8_0)
QUANT(q4_0, TQ4_0, IQ4_0)
QUANT(q4_1, TQ4_1, IQ4_1)
QUANT(q4_k, TQ4_K, IQ4_K)
QUANT(q5_k, TQ5_K, IQ5_K)
QUANT(q6_k, TQ6_K, IQ6_K)
