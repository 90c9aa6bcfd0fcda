// The paged KV cache of one layer: K and V each [num_blocks * block_size, width] in f16, where
// width = kv_heads * head_dim and a slot is block * block_size + offset.

// Stores this step's K and V rows [tokens, width] at their slots; one block per token. Slot
// 0xFFFFFFFF pads a CUDA graph's batch and stores nothing.
extern "C" __global__ void write_kv(const float* k, const float* v, f16* k_cache, f16* v_cache,
                                    const u32* slots, u32 width) {
    if (slots[blockIdx.x] == 0xFFFFFFFFu) return;
    size_t dst = (size_t)slots[blockIdx.x] * width;
    size_t src = (size_t)blockIdx.x * width;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) {
        k_cache[dst + c] = f32_to_f16(k[src + c]);
        v_cache[dst + c] = f32_to_f16(v[src + c]);
    }
}

// Copy-on-write: whole blocks (from, to) pairs; one block of threads per pair.
extern "C" __global__ void copy_blocks(f16* cache, const u32* pairs, u32 block_elems) {
    size_t from = (size_t)pairs[2 * blockIdx.x] * block_elems;
    size_t to = (size_t)pairs[2 * blockIdx.x + 1] * block_elems;
    for (u32 i = threadIdx.x; i < block_elems; i += blockDim.x) cache[to + i] = cache[from + i];
}
