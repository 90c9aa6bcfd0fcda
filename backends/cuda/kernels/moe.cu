// The routed MLP: router top-k, grouping by expert, the expert-grouped matmul and the
// weighted combine. Nothing goes back to the host; the step stays asynchronous.

// Each token's top-k experts (ties to the lower expert) and weights; one thread per token.
// Selecting on logits equals selecting on softmax probabilities; a weight is exp(l - max)
// over the sum of all experts' (softmax, then top-k) or of the chosen k (renormalised, or
// top-k then softmax: the same numbers).
extern "C" __global__ void moe_route(const float* logits, u32* ids, float* weights, u32 tokens,
                                     u32 experts, u32 top_k, u32 renormalize) {
    u32 t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const float* row = logits + (size_t)t * experts;
    u32* id = ids + (size_t)t * top_k;
    float* w = weights + (size_t)t * top_k;
    float mx = row[0];
    for (u32 e = 1; e < experts; e++) mx = fmaxf(mx, row[e]);
    float total = 0.0f;
    for (u32 e = 0; e < experts; e++) total += expf(row[e] - mx);
    float picked = 0.0f;
    for (u32 s = 0; s < top_k; s++) {
        u32 best = 0xffffffffu;
        float best_v = 0.0f;
        for (u32 e = 0; e < experts; e++) {
            bool taken = false;
            for (u32 j = 0; j < s; j++) taken |= id[j] == e;
            if (!taken && (best == 0xffffffffu || row[e] > best_v)) {
                best = e;
                best_v = row[e];
            }
        }
        id[s] = best;
        w[s] = expf(best_v - mx);
        picked += w[s];
    }
    float denom = renormalize ? picked : total;
    for (u32 s = 0; s < top_k; s++) w[s] /= denom;
}

#define MOE_MAX_EXPERTS 4096

// A counting sort of the assignments by expert, in one block of 256: expert e's assignments,
// in assignment order, are order[offsets[e]..offsets[e + 1]].
extern "C" __global__ void moe_group(const u32* ids, u32* offsets, u32* order, u32 assignments,
                                     u32 experts) {
    __shared__ u32 starts[MOE_MAX_EXPERTS];
    for (u32 e = threadIdx.x; e < experts; e += blockDim.x) {
        u32 n = 0;
        for (u32 a = 0; a < assignments; a++) n += ids[a] == e;
        starts[e] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 sum = 0;
        offsets[0] = 0;
        for (u32 e = 0; e < experts; e++) {
            u32 n = starts[e];
            starts[e] = sum;
            sum += n;
            offsets[e + 1] = sum;
        }
    }
    __syncthreads();
    for (u32 e = threadIdx.x; e < experts; e += blockDim.x) {
        u32 at = starts[e];
        for (u32 a = 0; a < assignments; a++)
            if (ids[a] == e) order[at++] = a;
    }
}

#define MOE_ROWS 8

// out[a, col] = x[row(a)] · w[e, col] for every assignment a routed to expert e (row(a): a's
// token when x has a row per token, else a). Block (blockIdx.x: 8 columns, blockIdx.y: the
// expert), a warp per column; the expert's group goes 8 assignments at a time, so each
// weight row is read once per 8 tokens routed to it and an expert without tokens costs one
// load.
template <typename W, typename Load>
__device__ void moe_matmul(const float* x, const W* w, float* out, const u32* offsets,
                           const u32* order, u32 n, u32 k, u32 top_k, u32 per_token, Load load) {
    u32 e = blockIdx.y;
    u32 col = blockIdx.x * 8 + (threadIdx.x >> 5);
    u32 lane = threadIdx.x & 31;
    if (col >= n) return;
    const W* wrow = w + ((size_t)e * n + col) * k;
    u32 begin = offsets[e], end = offsets[e + 1];
    for (u32 c = begin; c < end; c += MOE_ROWS) {
        u32 m = min((u32)MOE_ROWS, end - c);
        const float* xs[MOE_ROWS];
        float acc[MOE_ROWS];
        for (u32 r = 0; r < MOE_ROWS; r++) {
            u32 a = order[c + min(r, m - 1)];
            xs[r] = x + (size_t)(per_token ? a / top_k : a) * k;
            acc[r] = 0.0f;
        }
        for (u32 i = lane; i < k; i += 32) {
            float wv = load(wrow, i);
            for (u32 r = 0; r < MOE_ROWS; r++)
                if (r < m) acc[r] += wv * xs[r][i];
        }
        for (u32 r = 0; r < m; r++) {
            float v = warp_sum(acc[r]);
            if (lane == 0) out[(size_t)order[c + r] * n + col] = v;
        }
    }
}

extern "C" __global__ void moe_matmul_f32(const float* x, const float* w, float* out,
                                          const u32* offsets, const u32* order, u32 n, u32 k,
                                          u32 top_k, u32 per_token) {
    moe_matmul(x, w, out, offsets, order, n, k, top_k, per_token,
               [](const float* p, u32 i) { return p[i]; });
}

extern "C" __global__ void moe_matmul_f16(const float* x, const f16* w, float* out,
                                          const u32* offsets, const u32* order, u32 n, u32 k,
                                          u32 top_k, u32 per_token) {
    moe_matmul(x, w, out, offsets, order, n, k, top_k, per_token,
               [](const f16* p, u32 i) { return f16_to_f32(p[i]); });
}

// out[t, c] = Σ_s weights[t·k + s] · y[t·k + s, c], grid-stride.
extern "C" __global__ void moe_combine(const float* y, const float* weights, float* out,
                                       u32 len, u32 cols, u32 top_k) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < len; i += gridDim.x * blockDim.x) {
        u32 t = i / cols, c = i % cols;
        float sum = 0.0f;
        for (u32 s = 0; s < top_k; s++) {
            u32 a = t * top_k + s;
            sum += weights[a] * y[(size_t)a * cols + c];
        }
        out[i] = sum;
    }
}

// The experts' biases: y[a, c] += bias[ids[a], c] for every assignment a (gpt-oss).
extern "C" __global__ void moe_add_bias(float* y, const float* bias, const u32* ids, u32 len,
                                        u32 cols) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < len; i += gridDim.x * blockDim.x)
        y[i] += bias[(size_t)ids[i / cols] * cols + i % cols];
}
