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
