// out = x / sqrt(mean(x^2) + eps) * weight, one block per row.
extern "C" __global__ void rms_norm(const float* x, const float* weight, float* out, u32 cols,
                                    float eps) {
    const float* row = x + (size_t)blockIdx.x * cols;
    float* dst = out + (size_t)blockIdx.x * cols;
    float ss = 0.0f;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) ss += row[c] * row[c];
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)cols + eps);
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = row[c] * inv * weight[c];
}

// x += y, then out = rms_norm(x) * weight over whole rows: the residual add and the next
// block's norm in one pass. One block per row.
extern "C" __global__ void add_rms_norm(float* x, const float* y, const float* weight, float* out,
                                        u32 cols, float eps) {
    float* row = x + (size_t)blockIdx.x * cols;
    const float* add = y + (size_t)blockIdx.x * cols;
    float* dst = out + (size_t)blockIdx.x * cols;
    float ss = 0.0f;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = row[c] + add[c];
        row[c] = v;
        ss += v * v;
    }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)cols + eps);
    // Each thread reads back only the elements it wrote.
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = row[c] * inv * weight[c];
}
