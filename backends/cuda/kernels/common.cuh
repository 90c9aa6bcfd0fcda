// Prepended to every kernel file. NVRTC compiles without the toolkit's headers, so half
// floats are plain 16-bit words converted with PTX instructions (round to nearest even).
typedef unsigned int u32;
typedef unsigned short f16;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

__device__ __forceinline__ float f16_to_f32(f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ f16 f32_to_f16(float f) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (or max) over the block (blockDim.x a multiple of 32, at most 1024); every thread gets
// it. The leading barrier lets consecutive calls share the scratch array.
__device__ float block_reduce(float v, bool take_max) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = take_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int warps = blockDim.x >> 5;
    float identity = take_max ? -INFINITY : 0.0f;
    v = lane < warps ? partial[lane] : identity;
    return take_max ? warp_max(v) : warp_sum(v);
}

__device__ __forceinline__ float block_sum(float v) { return block_reduce(v, false); }
__device__ __forceinline__ float block_max(float v) { return block_reduce(v, true); }
