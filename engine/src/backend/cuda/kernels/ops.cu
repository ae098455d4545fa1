// Row ops of the transformer block, with the CPU's `kernels::ops` numerics: RMSNorm with
// an f64 sum of squares, rotary angles by repeated f32 multiplication, SiLU through
// ggml's polynomial exp, GELU (tanh form) rounded through f16 as ggml's table is,
// SwiGLU-OAI, and residual add; plus argmax (first index of the largest value).

// One block per row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ out, int width, float eps) {
    const float* xr = x + (size_t)blockIdx.x * width;
    float* orow = out + (size_t)blockIdx.x * width;
    const float scale = block_rms_scale(xr, width, eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < width; i += blockDim.x) orow[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

// x is [rows][heads][2 * half]; grid (rows, heads), one thread per rotated pair.
// theta_scale = base^(-2/head_dim) is computed on the host with the CPU's powf.
__device__ __forceinline__ void rope_head(float* __restrict__ x, const int* __restrict__ pos, int heads, int h,
                                          int half, float theta_scale, const float* __restrict__ pairs,
                                          float freq_scale, float mscale, int neox) {
    const int i = threadIdx.x;
    if (i >= half) return;
    float* head = x + ((size_t)blockIdx.x * heads + h) * (size_t)(2 * half);
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    rope_pair(pos[blockIdx.x], i, theta_scale, pairs, half, freq_scale, mscale, &head[ia], &head[ib]);
}

extern "C" __global__ void rope(float* __restrict__ x, const int* __restrict__ pos, int heads, int half,
                                float theta_scale, const float* __restrict__ pairs, float freq_scale, float mscale,
                                int neox) {
    rope_head(x, pos, heads, blockIdx.y, half, theta_scale, pairs, freq_scale, mscale, neox);
}

// rope of the queries (heads 0..hq of grid y) and of the keys (the next hk) in one launch.
extern "C" __global__ void rope_qk(float* __restrict__ q, float* __restrict__ k, const int* __restrict__ pos,
                                   int hq, int hk, int half, float theta_scale, const float* __restrict__ pairs,
                                   float freq_scale, float mscale, int neox) {
    const int y = blockIdx.y;
    if (y < hq) rope_head(q, pos, hq, y, half, theta_scale, pairs, freq_scale, mscale, neox);
    else rope_head(k, pos, hk, y - hq, half, theta_scale, pairs, freq_scale, mscale, neox);
}

// g = silu(g) * u over n values; the first `simd` take ggml's exp, the tail libm's.
extern "C" __global__ void silu_mul(float* __restrict__ g, const float* __restrict__ u, int n, int simd) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu_val(g[i], u[i], i < simd);
}

// g = gelu(g) * u.
extern "C" __global__ void gelu_mul(float* __restrict__ g, const float* __restrict__ u, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = gelu_val(g[i], u[i]);
}

// g = SwiGLU-OAI(g, u) (gpt-oss's experts).
extern "C" __global__ void swiglu_oai(float* __restrict__ g, const float* __restrict__ u, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = swiglu_oai_val(g[i], u[i]);
}

// x[r][i] += b[i] over n values of rows `width` wide (Q/K/V biases).
extern "C" __global__ void add_rows(float* __restrict__ x, const float* __restrict__ b, int width, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + b[i % width];
}

// Llama 4's attention temperature on the queries (rows `width` wide): row r times
// ln(floor(pos[r] / floor_) + 1) * scale + 1, the quotient in f32 and the rest in f64 as
// the CPU's `AttnTemperature::at`.
extern "C" __global__ void attn_temperature(float* __restrict__ x, const int* __restrict__ pos, int width, int n,
                                            float floor_, float scale) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float q = floorf(__fdiv_rn((float)pos[i / width], floor_));
    const float t = (float)(log((double)q + 1.0) * (double)scale + 1.0);
    x[i] = __fmul_rn(x[i], t);
}

extern "C" __global__ void add_inplace(float* __restrict__ x, const float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + y[i];
}

// One block per row of `n` values: out[row] = first index of the largest value.
extern "C" __global__ void argmax(const float* __restrict__ x, int n, int* __restrict__ out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float best = -__int_as_float(0x7f800000);
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i];
        if (v > best || bi == 0x7fffffff) { best = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        if (v2 > best || (v2 == best && i2 < bi)) { best = v2; bi = i2; }
    }
    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = best; si[threadIdx.x >> 5] = bi; }
    __syncthreads();
    if (threadIdx.x < 32) {
        const bool live = threadIdx.x < (blockDim.x >> 5);
        best = live ? sv[threadIdx.x] : -__int_as_float(0x7f800000);
        bi = live ? si[threadIdx.x] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (v2 > best || (v2 == best && i2 < bi)) { best = v2; bi = i2; }
        }
        if (threadIdx.x == 0) out[blockIdx.x] = bi;
    }
}

// x *= s over n values.
extern "C" __global__ void scale_inplace(float* __restrict__ x, float s, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], s);
}
