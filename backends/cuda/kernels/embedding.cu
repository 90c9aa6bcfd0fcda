// out[t] = table[ids[t]] for an f16 table [vocab, hidden]; one block per token.
extern "C" __global__ void embedding_f16(const f16* table, const u32* ids, float* out,
                                         u32 hidden) {
    const f16* src = table + (size_t)ids[blockIdx.x] * hidden;
    float* dst = out + (size_t)blockIdx.x * hidden;
    for (u32 c = threadIdx.x; c < hidden; c += blockDim.x) dst[c] = f16_to_f32(src[c]);
}

// The same over an f32 table.
extern "C" __global__ void embedding_f32(const float* table, const u32* ids, float* out,
                                         u32 hidden) {
    const float* src = table + (size_t)ids[blockIdx.x] * hidden;
    float* dst = out + (size_t)blockIdx.x * hidden;
    for (u32 c = threadIdx.x; c < hidden; c += blockDim.x) dst[c] = src[c];
}
