// Shared helpers, prepended by the host to every program (NVRTC gets no include path).
// Compiled with --fmad=false: every fused multiply-add below is an explicit fmaf, as in
// the CPU kernels, so no product is silently left unrounded.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ggml_v_expf lane by lane (see `kernels::ops::expf`).
__device__ __forceinline__ float ggml_expf(float x) {
    const float r = __int_as_float(0x4b400000);
    const float z = fmaf(x, __int_as_float(0x3fb8aa3b), r);
    const float n = z - r;
    const float b = fmaf(-n, __int_as_float(0x35bfbe8e), fmaf(-n, __int_as_float(0x3f317200), x));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : __int_as_float(0x7f800000);
    const float u = __fmul_rn(b, b);
    const float j = fmaf(fmaf(fmaf(__int_as_float(0x3c072010), b, __int_as_float(0x3d2b9f17)), u,
                              fmaf(__int_as_float(0x3e2aaf33), b, __int_as_float(0x3efffedb))),
                         u, fmaf(__int_as_float(0x3f7ffff6), b, 1.0f));
    const double pow2 = __longlong_as_double((long long)((int)n + 1023) << 52);
    return (float)((double)j * pow2);
}

// Spread 4 bits into bit 4 of each of 4 bytes (Q5_0's high bits).
__device__ __forceinline__ int spread4(u32 b) {
    return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}
