// Shared helpers, prepended by the host to every program (NVRTC gets no include path).
// Compiled with --fmad=false: every fused multiply-add below is an explicit fmaf, as in
// the CPU kernels, so no product is silently left unrounded.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned int u32;

#define NEG_INF __int_as_float(0xff800000)

// Row r's K (which 0) or V (1) of `layer` in its device KV mirror (attention.cu), from
// query head h's KV head on: position p's head_dim values start at [p * n_kv * hd].
__device__ __forceinline__ const unsigned short* kv_plane(const unsigned long long* bases, const int* caps, int r,
                                                          int layer, int which, int n_heads, int n_kv, int hd,
                                                          int h) {
    const size_t kv_dim = (size_t)n_kv * hd, cap = (size_t)caps[r];
    const int kvh = h / (n_heads / n_kv);
    return (const unsigned short*)bases[r] + ((size_t)layer * 2 + which) * cap * kv_dim + (size_t)kvh * hd;
}

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

// Two floats rounded to f16, packed low then high (an f16 mma operand).
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    return (u32)f2h(lo) | ((u32)f2h(hi) << 16);
}

// D += A·B on the tensor cores (sm_80 and later), m16n8k16, f16 operands, f32 sums;
// fragment layouts as in prefill.cu.
__device__ __forceinline__ void mma_f16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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

// Activation quantization of one block of 32 (warp-wide; `quantize.cu`): lane l holds
// value l. `with_sum` selects Q8_1.
__device__ __forceinline__ void quant32(float v, int lane, size_t blk, i8* __restrict__ qs,
                                        float* __restrict__ d_out, float* __restrict__ s_out, int with_sum) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int q = __float2int_rn(__fmul_rn(v, id));
    q = max(-128, min(127, q));
    qs[blk * 32 + lane] = (i8)q;
    const int sum = warp_sum_i(q);
    if (lane == 0) {
        d_out[blk] = h2f(f2h(d));
        s_out[blk] = with_sum ? h2f(f2h(__fmul_rn(d, (float)sum))) : 0.0f;
    }
}

// ggml's MAX(max, sink) of a row's score maximum and its head's sink (the CPU's
// `sink_max`): the sink takes part in the maximum, and exp(sink - max) (libm's) in the
// softmax's sum, weighing no value (gpt-oss's `attn_sinks`; the attention kernels'
// `sinks` null: none).
__device__ __forceinline__ float sink_max(float mx, float sink) {
    return mx > sink ? mx : sink;
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

// A 16-entry table of signed bytes (four words, entries 0..3 in t0's bytes, ...) looked
// up for four 4-bit indices, one in each byte of `idx`: the four values, packed.
// `__byte_perm` picks each byte from the low or high half by the index's low three bits,
// its bit 3 chooses the half.
__device__ __forceinline__ int lookup4(u32 idx, u32 t0, u32 t1, u32 t2, u32 t3) {
    const u32 sel = (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) | ((idx >> 12) & 0x7000u);
    const u32 lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const u32 high = ((idx & 0x08080808u) >> 3) * 0xffu;
    return (int)((lo & ~high) | (hi & high));
}

// IQ4_NL's and IQ4_XS's 16 values (ggml's `kvalues_iq4nl`).
__device__ __forceinline__ int iq4_lookup4(u32 idx) {
    return lookup4(idx, 0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);
}

// MXFP4's E2M1 values doubled to integers (ggml's `kvalues_mxfp4`: 0 1 2 3 4 6 8 12, then
// their negatives); the block scale `d` is the E8M0 power of two halved (`weights.rs`).
__device__ __forceinline__ int mxfp4_lookup4(u32 idx) {
    return lookup4(idx, 0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu);
}

// One IQ4 table value.
__device__ __forceinline__ int iq4_value(int idx) {
    return (int)(i8)(iq4_lookup4((u32)idx) & 0xffu);
}

// One MXFP4 table value (doubled).
__device__ __forceinline__ int mxfp4_value(int idx) {
    return (int)(i8)(mxfp4_lookup4((u32)idx) & 0xffu);
}

// x / rms(x) scale of one row from each thread's f64 partial sum of squares (values
// i = threadIdx.x, + blockDim.x, ... in order): the partials summed across the block,
// the mean rounded to f32, 1 / sqrt(mean + eps). Every thread of the block calls it and
// gets the scale; it synchronizes the block (so shared-memory writes before it are seen
// after it).
__device__ __forceinline__ float block_rms_finish(double s, int width, float eps) {
    __shared__ double part[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        double t = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    const float mean = (float)(part[0] / (double)width);
    return 1.0f / sqrtf(mean + eps);
}

// x / rms(x) scale of one row, as the CPU: f64 sum of f32 squares, mean rounded to f32,
// 1 / sqrt(mean + eps). Every thread of the block calls it and gets the scale.
__device__ __forceinline__ float block_rms_scale(const float* __restrict__ xr, int width, float eps) {
    double s = 0.0;
#pragma unroll 4
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = xr[i];
        s += (double)__fmul_rn(v, v);
    }
    return block_rms_finish(s, width, eps);
}

// silu(a) * u: ggml's exp where the CPU vectorizes (`simd`), libm's on the tail.
__device__ __forceinline__ float silu_val(float a, float u, bool simd) {
    const float e = simd ? ggml_expf(0.0f - a) : expf(-a);
    return __fmul_rn(a / (1.0f + e), u);
}

// gelu(x) * u, gelu evaluated at f16(x) and rounded to f16 (ggml's table).
__device__ __forceinline__ float gelu_val(float x, float u) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return __fmul_rn(x, u);
    const float h = h2f(f2h(x));
    const float inner = __fmul_rn(__fmul_rn(0.7978846f, h), fmaf(__fmul_rn(0.044715f, h), h, 1.0f));
    const float gl = h2f(f2h(__fmul_rn(__fmul_rn(0.5f, h), 1.0f + tanhf(inner))));
    return __fmul_rn(gl, u);
}

// gpt-oss's SwiGLU-OAI of gate g and up u, as the CPU's `ops::swiglu_oai` (ggml's op):
// the gate capped at 7 (a NaN kept), u clamped to ±7, g / (1 + exp(1.702 * -g)) * (u + 1),
// libm's exp.
__device__ __forceinline__ float swiglu_oai_val(float g, float u) {
    const float x = 7.0f < g ? 7.0f : g;
    const float y = u < -7.0f ? -7.0f : (u > 7.0f ? 7.0f : u);
    const float e = expf(__fmul_rn(1.702f, -x));
    return __fmul_rn(__fdiv_rn(x, __fadd_rn(1.0f, e)), __fadd_rn(y, 1.0f));
}

// The gated activation of an MLP by kind (`Gate` in `backend/mod.rs`, the kernels' `kind`
// argument): 0 silu(g) * u (ggml's exp when `simd`), 1 gelu(g) * u, 2 SwiGLU-OAI.
__device__ __forceinline__ float gate_val(int kind, float g, float u, bool simd) {
    return kind == 1 ? gelu_val(g, u) : kind == 2 ? swiglu_oai_val(g, u) : silu_val(g, u, simd);
}

// Rotate pair i of a head (RoPE) at position `pos`, angle pos * theta_scale^i by the
// CPU's repeated f32 multiplication: (a, b) -> (a cos - b sin, a sin + b cos). A scaled
// table (`pairs` not null: `half` frequency factors, then `half` YaRN mixes) takes the
// CPU's `RopeTable::scaled` steps: the angle divided by its factor, blended with its
// `freq_scale` multiple, cos and sin times `mscale`.
__device__ __forceinline__ void rope_pair(int pos, int i, float theta_scale, const float* __restrict__ pairs,
                                          int half, float freq_scale, float mscale, float* a, float* b) {
    float theta = (float)pos;
    for (int k = 0; k < i; k++) theta = __fmul_rn(theta, theta_scale);
    float c, s;
    if (pairs) {
        const float extrap = __fdiv_rn(theta, pairs[i]);
        const float mix = pairs[half + i];
        const float t = fmaf(__fmul_rn(freq_scale, extrap), __fsub_rn(1.0f, mix), __fmul_rn(extrap, mix));
        c = __fmul_rn(cosf(t), mscale);
        s = __fmul_rn(sinf(t), mscale);
    } else {
        c = cosf(theta);
        s = sinf(theta);
    }
    const float x = *a, y = *b;
    *a = fmaf(x, c, -__fmul_rn(y, s));
    *b = fmaf(x, s, __fmul_rn(y, c));
}
