// Activation quantization, the CPU engine's `quant::act` on the device:
// Q8_0 / Q8_1 blocks of 32 (d = amax/127 kept as f16, q = round-half-even(x * 127/amax),
// Q8_1 also f16(d * sum(q))), and Q8_K super-blocks of 256 (iscale = -127/max where max
// is the first value of largest magnitude, d = 1/iscale as f32, sums of 16).
// `quant32` (one block of 32) is in common.cuh: the attention kernel uses it too.

// One super-block of 256 (warp-wide): lane l holds values 8l..8l+8 (half of sum group l/2).
__device__ __forceinline__ void quant256(const float (&v)[8], int lane, size_t blk, i8* __restrict__ qs,
                                         float* __restrict__ d_out, int* __restrict__ bsums) {
    float amax = 0.0f, maxv = 0.0f;
    int idx = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (fabsf(v[i]) > amax) { amax = fabsf(v[i]); maxv = v[i]; idx = lane * 8 + i; }
    }
    // The first value of largest magnitude wins, as in the CPU's sequential scan.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, o);
        const float m2 = __shfl_xor_sync(0xffffffffu, maxv, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) { amax = a2; maxv = m2; idx = i2; }
    }
    i8* qb = qs + blk * 256 + lane * 8;
    if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) qb[i] = 0;
        if (lane == 0) d_out[blk] = 0.0f;
        if ((lane & 1) == 0) bsums[blk * 16 + lane / 2] = 0;
        return;
    }
    const float iscale = -127.0f / maxv;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int q = min(127, __float2int_rn(__fmul_rn(iscale, v[i])));
        qb[i] = (i8)q;
        s += q;
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if ((lane & 1) == 0) bsums[blk * 16 + lane / 2] = s;
    if (lane == 0) d_out[blk] = 1.0f / iscale;
}

// One warp per block of 32.
extern "C" __global__ void quantize_q8_32(const float* __restrict__ x, i8* __restrict__ qs,
                                          float* __restrict__ d_out, float* __restrict__ s_out,
                                          int nblocks, int with_sum) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= nblocks) return;
    quant32(x[(size_t)warp * 32 + lane], lane, warp, qs, d_out, s_out, with_sum);
}

// One warp per super-block of 256.
extern "C" __global__ void quantize_q8_k(const float* __restrict__ x, i8* __restrict__ qs,
                                         float* __restrict__ d_out, int* __restrict__ bsums,
                                         int nblocks) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= nblocks) return;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = x[(size_t)warp * 256 + lane * 8 + i];
    quant256(v, lane, warp, qs, d_out, bsums);
}

// Fused: RMSNorm of each row (one block a row, as `rms_norm`) straight into its
// quantized blocks, the normalized values never stored. `block` is 32 (Q8_0/Q8_1) or
// 256 (Q8_K; `s_out` is then the bsums, as int). `quantize_row` is the second half: the
// row's values x[i] * scale * w[i] into blocks, read from `xr` and `w`.
__device__ __forceinline__ void quantize_row(const float* xr, const float* w, float scale, int width, int block,
                                             i8* __restrict__ qs, float* __restrict__ d_out,
                                             float* __restrict__ s_out, int with_sum) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int per_row = width / block;
    for (int b = warp; b < per_row; b += warps) {
        const size_t blk = (size_t)blockIdx.x * per_row + b;
        if (block == 32) {
            const int i = b * 32 + lane;
            quant32(__fmul_rn(__fmul_rn(xr[i], scale), w[i]), lane, blk, qs, d_out, s_out, with_sum);
        } else {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int i = b * 256 + lane * 8 + e;
                v[e] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
            }
            quant256(v, lane, blk, qs, d_out, (int*)s_out);
        }
    }
}

// Shared memory of a staged row: its values, then the norm weights (2 * width floats).
extern __shared__ float staged_row[];

// One row `x` (plus `y`, the sum stored back to `x`, when `y` is given) normalized and
// quantized. With `staged` (the launch gave 2 * width floats of shared memory) the row
// and the weights are read from global memory once, in one pass, kept in shared memory
// for the quantization (a decode step's row is one block on one multiprocessor, so each
// round trip to memory is on the step's critical path); otherwise they are read again.
// The same values and sums either way.
__device__ __forceinline__ void norm_quantize_one(float* __restrict__ x, const float* __restrict__ y,
                                                  const float* __restrict__ w, int width, float eps, int block,
                                                  i8* __restrict__ qs, float* __restrict__ d_out,
                                                  float* __restrict__ s_out, int with_sum, int staged) {
    float* xr = x + (size_t)blockIdx.x * width;
    const float* yr = y ? y + (size_t)blockIdx.x * width : nullptr;
    if (staged) {
        float* sx = staged_row;
        float* sw = staged_row + width;
        double s = 0.0;
#pragma unroll 4
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            float v = xr[i];
            if (yr) {
                v = v + yr[i];
                xr[i] = v;
            }
            sx[i] = v;
            sw[i] = w[i];
            s += (double)__fmul_rn(v, v);
        }
        const float scale = block_rms_finish(s, width, eps);
        quantize_row(sx, sw, scale, width, block, qs, d_out, s_out, with_sum);
        return;
    }
    if (yr) {
        for (int i = threadIdx.x; i < width; i += blockDim.x) xr[i] = xr[i] + yr[i];
        __syncthreads();
    }
    const float scale = block_rms_scale(xr, width, eps);
    quantize_row(xr, w, scale, width, block, qs, d_out, s_out, with_sum);
}

extern "C" __global__ void norm_quantize(const float* __restrict__ x, const float* __restrict__ w, int width,
                                         float eps, int block, i8* __restrict__ qs, float* __restrict__ d_out,
                                         float* __restrict__ s_out, int with_sum, int staged) {
    // x is only read (no y).
    norm_quantize_one((float*)x, nullptr, w, width, eps, block, qs, d_out, s_out, with_sum, staged);
}

// Fused: x += y (as add_inplace), then norm_quantize of the new row; one block a row.
extern "C" __global__ void add_norm_quantize(float* __restrict__ x, const float* __restrict__ y,
                                             const float* __restrict__ w, int width, float eps, int block,
                                             i8* __restrict__ qs, float* __restrict__ d_out,
                                             float* __restrict__ s_out, int with_sum, int staged) {
    norm_quantize_one(x, y, w, width, eps, block, qs, d_out, s_out, with_sum, staged);
}

// Fused: the gated activation (`gate_val` of `kind`: 0 silu(g) * u, ggml's exp below
// `simd`; 1 gelu(g) * u; 2 SwiGLU-OAI) straight into quantized blocks; one warp per block
// of `block` values.
extern "C" __global__ void gate_quantize(const float* __restrict__ g, const float* __restrict__ u, int nblocks,
                                         int simd, int kind, int block, i8* __restrict__ qs,
                                         float* __restrict__ d_out, float* __restrict__ s_out, int with_sum) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= nblocks) return;
    if (block == 32) {
        const size_t i = (size_t)warp * 32 + lane;
        quant32(gate_val(kind, g[i], u[i], i < (size_t)simd), lane, warp, qs, d_out, s_out, with_sum);
    } else {
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const size_t i = (size_t)warp * 256 + lane * 8 + e;
            v[e] = gate_val(kind, g[i], u[i], i < (size_t)simd);
        }
        quant256(v, lane, warp, qs, d_out, (int*)s_out);
    }
}

// bf16 rounding as the CPU's `round_bf16` (`GGML_FP32_TO_BF16`): to nearest, ties to
// even; a NaN kept quiet.
__device__ __forceinline__ float bf16_round(float x) {
    const u32 u = __float_as_uint(x);
    const u32 bits = (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 64u) : ((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
    return __uint_as_float(bits << 16);
}

// The float activation formats (F16 / BF16 weights): the values themselves, stored in
// the activation's scale array, rounded to bf16 when `bf16`. One thread a value.
extern "C" __global__ void float_act(const float* __restrict__ x, float* __restrict__ d, int n, int bf16) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = bf16 ? bf16_round(x[i]) : x[i];
}

// `float_act`'s rounding in place, after a fused op wrote the values (`fused.rs`).
extern "C" __global__ void round_bf16(float* __restrict__ d, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = bf16_round(d[i]);
}
