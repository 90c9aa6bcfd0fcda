// PagedAttention, vLLM's v2 scheme: one block per (head, token, partition of PARTITION keys);
// keys and values are read through the sequence's block table from the f16 cache. Causal: the
// query at position p sees keys 0..=p, so prefill chunks and decode tokens share the kernel.
// Each partition writes its unnormalized output with its max and exp-sum; `attention_reduce`
// combines the partitions. `window` > 0 limits a query to its last `window` keys (sliding
// layers); `softcap` > 0 caps scores to softcap * tanh(s / softcap) (Gemma 2).
#define PARTITION 512
#define MAX_HEAD_DIM 256
// Warps in a block (blockDim.x = 32 * ATTENTION_WARPS; the Rust side's ATTENTION_THREADS).
#define ATTENTION_WARPS 8

extern "C" __global__ void paged_attention(
    const float* q,            // [tokens, heads * head_dim]
    const f16* k_cache,        // [slots, kv_heads * head_dim]
    const f16* v_cache,
    const u32* token_seq,      // [tokens] sequence index
    const u32* positions,      // [tokens]
    const u32* block_tables,   // [seqs, max_blocks]
    u32 max_blocks, u32 block_size, u32 heads, u32 kv_heads, u32 head_dim, float scale,
    u32 window, float softcap,
    float* part_out,           // [tokens, heads, parts, head_dim]
    float* part_max,           // [tokens, heads, parts]
    float* part_sum) {
    __shared__ float qs[MAX_HEAD_DIM];
    __shared__ float scores[PARTITION];
    u32 h = blockIdx.x, t = blockIdx.y, p = blockIdx.z, parts = gridDim.z;
    size_t part = ((size_t)t * heads + h) * parts + p;
    u32 ctx = positions[t] + 1;
    u32 first = (window > 0 && ctx > window) ? ctx - window : 0;
    u32 start = max(p * PARTITION, first);
    if (start >= ctx || start >= p * PARTITION + PARTITION) {
        for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) part_out[part * head_dim + d] = 0.0f;
        if (threadIdx.x == 0) {
            part_max[part] = -INFINITY;
            part_sum[part] = 0.0f;
        }
        return;
    }
    u32 end = min(ctx, p * PARTITION + PARTITION);
    u32 n = end - start;
    const float* qrow = q + ((size_t)t * heads + h) * head_dim;
    for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = qrow[d] * scale;
    __syncthreads();

    u32 kvh = h / (heads / kv_heads);
    u32 width = kv_heads * head_dim;
    const u32* table = block_tables + (size_t)token_seq[t] * max_blocks;
    // A warp per key: lanes split the head dimension.
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    // Unrolled so a warp has several keys' loads in flight instead of one at a time.
#pragma unroll 4
    for (u32 j = start + warp; j < end; j += warps) {
        size_t slot = (size_t)table[j / block_size] * block_size + j % block_size;
        const f16* k = k_cache + slot * width + kvh * head_dim;
        float s = 0.0f;
        for (u32 d = lane; d < head_dim; d += 32) s += qs[d] * f16_to_f32(k[d]);
        s = warp_sum(s);
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        if (lane == 0) scores[j - start] = s;
    }
    __syncthreads();
    float m = -INFINITY;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, scores[i]);
    m = block_max(m);
    float sum = 0.0f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(scores[i] - m);
        scores[i] = e;
        sum += e;
    }
    sum = block_sum(sum);
    __syncthreads();
    // Values as the keys: warp w takes keys start + w, start + w + warps, ..., its lanes the
    // head dimension (consecutive lanes read consecutive values of a row); then the warps'
    // partial sums are added.
    __shared__ float vpart[ATTENTION_WARPS][MAX_HEAD_DIM];
    float acc[MAX_HEAD_DIM / 32];
#pragma unroll
    for (u32 i = 0; i < MAX_HEAD_DIM / 32; ++i) acc[i] = 0.0f;
#pragma unroll 4
    for (u32 j = start + warp; j < end; j += warps) {
        size_t slot = (size_t)table[j / block_size] * block_size + j % block_size;
        const f16* v = v_cache + slot * width + kvh * head_dim;
        float sj = scores[j - start];
#pragma unroll
        for (u32 i = 0; i < MAX_HEAD_DIM / 32; ++i) {
            u32 d = lane + 32 * i;
            if (d < head_dim) acc[i] += sj * f16_to_f32(v[d]);
        }
    }
#pragma unroll
    for (u32 i = 0; i < MAX_HEAD_DIM / 32; ++i) {
        u32 d = lane + 32 * i;
        if (d < head_dim) vpart[warp][d] = acc[i];
    }
    __syncthreads();
    for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (u32 w = 0; w < warps; ++w) a += vpart[w][d];
        part_out[part * head_dim + d] = a;
    }
    if (threadIdx.x == 0) {
        part_max[part] = m;
        part_sum[part] = sum;
    }
}

// out [tokens, heads * head_dim] from the partitions; one block per (head, token).
// With `has_sinks`, head h's sink logit joins the denominator (gpt-oss) and attends to nothing.
extern "C" __global__ void attention_reduce(const float* part_out, const float* part_max,
                                            const float* part_sum, float* out, u32 heads,
                                            u32 head_dim, u32 parts, const float* sinks,
                                            u32 has_sinks) {
    u32 h = blockIdx.x, t = blockIdx.y;
    size_t base = ((size_t)t * heads + h) * parts;
    float m = -INFINITY;
    for (u32 p = 0; p < parts; ++p) m = fmaxf(m, part_max[base + p]);
    if (has_sinks) m = fmaxf(m, sinks[h]);
    float total = has_sinks ? expf(sinks[h] - m) : 0.0f;
    for (u32 p = 0; p < parts; ++p)
        if (part_sum[base + p] > 0.0f) total += part_sum[base + p] * expf(part_max[base + p] - m);
    float* dst = out + ((size_t)t * heads + h) * head_dim;
    for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (u32 p = 0; p < parts; ++p)
            if (part_sum[base + p] > 0.0f)
                acc += part_out[(base + p) * head_dim + d] * expf(part_max[base + p] - m);
        dst[d] = acc / total;
    }
}
