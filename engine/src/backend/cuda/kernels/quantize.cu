// Activation quantization, the CPU engine's `quant::act` on the device:
// Q8_0 / Q8_1 blocks of 32 (d = amax/127 kept as f16, q = round-half-even(x * 127/amax),
// Q8_1 also f16(d * sum(q))), and Q8_K super-blocks of 256 (iscale = -127/max where max
// is the first value of largest magnitude, d = 1/iscale as f32, sums of 16).

// One warp per block of 32; lane l owns value l. `with_sum` selects Q8_1.
extern "C" __global__ void quantize_q8_32(const float* __restrict__ x, i8* __restrict__ qs,
                                          float* __restrict__ d_out, float* __restrict__ s_out,
                                          int nblocks, int with_sum) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= nblocks) return;
    const float v = x[(size_t)warp * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int q = __float2int_rn(__fmul_rn(v, id));
    q = max(-128, min(127, q));
    qs[(size_t)warp * 32 + lane] = (i8)q;
    const int sum = warp_sum_i(q);
    if (lane == 0) {
        d_out[warp] = h2f(f2h(d));
        s_out[warp] = with_sum ? h2f(f2h(__fmul_rn(d, (float)sum))) : 0.0f;
    }
}

// One warp per super-block of 256; lane l owns values 8l..8l+8 (half of sum group l/2).
extern "C" __global__ void quantize_q8_k(const float* __restrict__ x, i8* __restrict__ qs,
                                         float* __restrict__ d_out, int* __restrict__ bsums,
                                         int nblocks) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= nblocks) return;
    const float* xb = x + (size_t)warp * 256 + lane * 8;
    float v[8];
    float amax = 0.0f, maxv = 0.0f;
    int idx = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[i];
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
    i8* qb = qs + (size_t)warp * 256 + lane * 8;
    if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) qb[i] = 0;
        if (lane == 0) d_out[warp] = 0.0f;
        if ((lane & 1) == 0) bsums[(size_t)warp * 16 + lane / 2] = 0;
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
    if ((lane & 1) == 0) bsums[(size_t)warp * 16 + lane / 2] = s;
    if (lane == 0) d_out[warp] = 1.0f / iscale;
}
