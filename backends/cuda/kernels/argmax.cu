// Each row's argmax (lowest index on ties), one block per row (blockDim.x = 1024, a power of
// two: a decode step's lone row spreads over the whole block).
extern "C" __global__ void argmax(const float* x, u32* out, u32 cols) {
    __shared__ float best_v[1024];
    __shared__ u32 best_i[1024];
    const float* row = x + (size_t)blockIdx.x * cols;
    float v = -INFINITY;
    u32 idx = 0xffffffffu;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        float y = row[c];
        if (y > v || idx == 0xffffffffu) { v = y; idx = c; }
    }
    best_v[threadIdx.x] = v;
    best_i[threadIdx.x] = idx;
    __syncthreads();
    for (u32 s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = best_v[threadIdx.x + s];
            u32 oi = best_i[threadIdx.x + s];
            if (oi != 0xffffffffu &&
                (best_i[threadIdx.x] == 0xffffffffu || ov > best_v[threadIdx.x] ||
                 (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x]))) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = best_i[0];
}
