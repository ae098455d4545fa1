// GEMV items of the unquantized formats (one program with gemv.cu): F16 weights against
// f32 activations (the CPU widens F16 weights to f32: candle's `QMatMul`), BF16 weights
// against activations rounded to bf16 (the CPU's `bf16` kernel); the activations' f32
// values are in `ad`, and `kb` is the row length. Item = 8 consecutive values (16 bytes
// of weights, so a warp reads 512 contiguous bytes), one f32 FMA each, as the CPU's
// kernels do (in another order: the sums agree to f32 rounding, not bit for bit).

template <bool BF16>
__device__ __forceinline__ float widen16(u32 word, int half) {
    const u32 v = half ? word >> 16 : word & 0xffffu;
    return BF16 ? __uint_as_float(v << 16) : h2f((unsigned short)v);
}

template <bool BF16>
__device__ __forceinline__ void item_float(const Args& a, int row, int it, float* acc) {
    const size_t at = (size_t)row * a.kb + 8 * (size_t)it;
    const uint4 wv = *(const uint4*)(a.qs + 2 * at);
    const u32 ww[4] = {wv.x, wv.y, wv.z, wv.w};
    float w[8];
#pragma unroll
    for (int e = 0; e < 8; e++) w[e] = widen16<BF16>(ww[e >> 1], e & 1);
    for (int r = 0; r < a.rows; r++) {
        const float* x = a.ad + (size_t)r * a.kb + 8 * (size_t)it;
        const float4 x0 = *(const float4*)x, x1 = *(const float4*)(x + 4);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float s = acc[r];
#pragma unroll
        for (int e = 0; e < 8; e++) s = fmaf(w[e], xv[e], s);
        acc[r] = s;
    }
}
