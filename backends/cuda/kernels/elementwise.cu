// Element-wise ops over f32 activations, grid-stride loops (any length, any grid).

extern "C" __global__ void add_assign(float* x, const float* y, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] += y[i];
}

// x [rows, cols] += bias [cols] on every row.
extern "C" __global__ void add_bias(float* x, const float* bias, u32 n, u32 cols) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] += bias[i % cols];
}

extern "C" __global__ void silu_mul(const float* gate, const float* up, float* out, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// GELU (tanh approximation) of gate, times up (GeGLU: Gemma).
extern "C" __global__ void gelu_tanh_mul(const float* gate, const float* up, float* out, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(0.7978846f * (g + 0.044715f * g * g * g))) * up[i];
    }
}

// gpt-oss's SwiGLU: (clamp(up, ±limit) + 1) · g · σ(alpha · g), g = min(gate, limit).
extern "C" __global__ void swiglu_clamped(const float* gate, const float* up, float* out,
                                          float alpha, float limit, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float g = fminf(gate[i], limit);
        float u = fminf(fmaxf(up[i], -limit), limit);
        out[i] = (u + 1.0f) * g / (1.0f + expf(-alpha * g));
    }
}

// x *= s (embedding, residual and logit multipliers).
extern "C" __global__ void scale(float* x, float s, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] *= s;
}

// x = cap * tanh(x / cap) (final logit soft-capping).
extern "C" __global__ void softcap(float* x, float cap, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

// Activations to f16 for the tensor-core GEMM.
extern "C" __global__ void cast_f32_f16(const float* x, f16* out, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = f32_to_f16(x[i]);
}

// out[r] = x[rows[r]] for rows of `cols` floats; one block per output row.
extern "C" __global__ void gather_rows(const float* x, const u32* rows, float* out, u32 cols) {
    const float* src = x + (size_t)rows[blockIdx.x] * cols;
    float* dst = out + (size_t)blockIdx.x * cols;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
}
