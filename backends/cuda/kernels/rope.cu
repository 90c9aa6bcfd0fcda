// Rotary embedding in place. x [tokens, heads * head_dim]; cos_sin [max_len, rotary_dim] holds
// cos in the first half of a row, sin in the second; the first rotary_dim dimensions of each
// head rotate, the rest pass through. style 0: adjacent pairs (2i, 2i+1), as GGUF stores Llama
// Q/K; style 1: halves (i, i + rotary_dim/2), as HF stores them.
// Grid: one block per token; threads over (head, pair).
extern "C" __global__ void rope(float* x, const u32* positions, const float* cos_sin, u32 heads,
                                u32 head_dim, u32 rotary_dim, u32 style) {
    u32 half = rotary_dim / 2;
    const float* cs = cos_sin + (size_t)positions[blockIdx.x] * rotary_dim;
    float* row = x + (size_t)blockIdx.x * heads * head_dim;
    for (u32 j = threadIdx.x; j < heads * half; j += blockDim.x) {
        u32 h = j / half, i = j % half;
        float* head = row + h * head_dim;
        u32 a = style == 0 ? 2 * i : i;
        u32 b = style == 0 ? 2 * i + 1 : i + half;
        float c = cs[i], s = cs[half + i];
        float x0 = head[a], x1 = head[b];
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
}
