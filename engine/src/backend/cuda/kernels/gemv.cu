// Quantized GEMV / small-m GEMM: y[r][row] = W[row] . x[r] for up to MAXM activation rows,
// weights read once for all of them. One warp per output row; lane i takes the i-th work
// item (a block of 32; Q4_K, Q5_K and IQ4_XS 16 quant bytes; Q6_K, Q3_K and Q2_K 64 values
// of a 256 super-block; F16 / BF16 8 values), so the 32 lanes of a warp read one
// contiguous span of the repacked quant bytes (coalesced). Integer sums go through dp4a
// and are exact; each item adds d_w * d_a * isum in f32. The program is this file (the
// blocks of 32 and Q4_K / Q6_K), gemv_k.cu (Q5_K, Q3_K, Q2_K, IQ4_XS), gemv_f.cu (F16,
// BF16), gemv_rows.cu (the kernels) and gemv1.cu (the one-row kernels).
//
// Repacked weight layout (struct of arrays, `weights.rs`), per block in row-major order:
//   qs:  the quant bytes as in the GGUF block, QB bytes a block (Q6_K: ql then qh; Q3_K:
//        hmask then the low bits; F16 / BF16: the values);
//   d:   f32 scale;  m: f32 (Q4_1 / Q5_1 min, Q4_K / Q5_K / Q2_K dmin);
//   aux: Q5_0 / Q5_1 the 32 high bits; Q4_K 8 six-bit scales then 8 mins, unpacked; Q5_K
//        those then the 32 bytes of fifth bits; Q6_K scales; Q3_K 16 signed scales;
//        Q2_K the 16 packed scale / min bytes; IQ4_XS 8 signed scales.
// Activations: int8 values row after row, one f32 scale per block, Q8_1 sums, Q8_K bsums
// (F16 / BF16: f32 values in the scales' array, one per value).
// Types (`KERNEL_TYPES`): 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q8_0, 4 Q4_K, 5 Q6_K, 6 Q5_1,
// 7 IQ4_NL, 8 Q5_K, 9 Q3_K, 10 Q2_K, 11 IQ4_XS, 12 F16, 13 BF16, 14 MXFP4 (IQ4_NL's layout:
// the f32 scale is the E8M0 exponent's `e8m0_half`, the nibbles index MXFP4's table).

#define MAXM 8

struct Args {
    const u8* qs; const float* d; const float* m; const u8* aux;
    const i8* aq; const float* ad; const float* as; const int* abs;
    float* y; int n; int kb; int rows;
    // Added to each output (qwen2's Q/K/V biases), or null: the matmul's epilogue.
    const float* bias;
};

__device__ __forceinline__ int sum_bytes(int a) { return __dp4a(a, 0x01010101, 0); }


// Blocks of 32 against Q8_0 / Q8_1 blocks: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q8_0, 6 Q5_1 (Q4_1
// with Q5_0's fifth bits), 7 IQ4_NL and 14 MXFP4 (the nibbles index a table of signed
// bytes: the IQ4 one, MXFP4's doubled E2M1 values).
template <int T>
__device__ __forceinline__ void item32(const Args& a, int row, int b, float* acc) {
    const size_t blk = (size_t)row * a.kb + b;
    int w[8];
    if (T == 3) {
        const uint4 w0 = *(const uint4*)(a.qs + blk * 32);
        const uint4 w1 = *(const uint4*)(a.qs + blk * 32 + 16);
        w[0] = w0.x; w[1] = w0.y; w[2] = w0.z; w[3] = w0.w;
        w[4] = w1.x; w[5] = w1.y; w[6] = w1.z; w[7] = w1.w;
    } else {
        const uint4 p = *(const uint4*)(a.qs + blk * 16);
        const u32 pw[4] = {p.x, p.y, p.z, p.w};
        constexpr bool fifth = T == 2 || T == 6;
        u32 qh = 0;
        if (fifth) qh = *(const u32*)(a.aux + blk * 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[i] = pw[i] & 0x0f0f0f0fu;
            w[4 + i] = (pw[i] >> 4) & 0x0f0f0f0fu;
            if (fifth) {
                w[i] |= spread4((qh >> (4 * i)) & 0xfu);
                w[4 + i] |= spread4((qh >> (16 + 4 * i)) & 0xfu);
            }
            if (T == 7) {
                w[i] = iq4_lookup4((u32)w[i]);
                w[4 + i] = iq4_lookup4((u32)w[4 + i]);
            }
            if (T == 14) {
                w[i] = mxfp4_lookup4((u32)w[i]);
                w[4 + i] = mxfp4_lookup4((u32)w[4 + i]);
            }
        }
    }
    const float dw = a.d[blk];
    for (int r = 0; r < a.rows; r++) {
        const size_t ab = (size_t)r * a.kb + b;
        const uint4 x0 = *(const uint4*)(a.aq + ab * 32);
        const uint4 x1 = *(const uint4*)(a.aq + ab * 32 + 16);
        const int x[8] = {(int)x0.x, (int)x0.y, (int)x0.z, (int)x0.w,
                          (int)x1.x, (int)x1.y, (int)x1.z, (int)x1.w};
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) s = __dp4a(w[i], x[i], s);
        if (T == 0 || T == 2) {
            int sx = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) sx = __dp4a(x[i], 0x01010101, sx);
            s -= (T == 0 ? 8 : 16) * sx;
        }
        const float dd = __fmul_rn(dw, a.ad[ab]);
        acc[r] = fmaf(dd, (float)s, acc[r]);
        if (T == 1 || T == 6) acc[r] = fmaf(a.m[blk], a.as[ab], acc[r]);
    }
}

// Q4_K: item = (super-block sb, 16-byte slice q = 2p + h): its low nibbles are values
// 64p + 16h .. +16 (sub-block 2p), its high nibbles values 64p + 32 + 16h .. +16
// (sub-block 2p + 1). Sixteen-byte items keep every lane's loads like Q4_0's.
__device__ __forceinline__ void item_q4k(const Args& a, int row, int it, float* acc) {
    const int sb = it >> 3, q16 = it & 7, p = q16 >> 1, h = q16 & 1;
    const size_t blk = (size_t)row * a.kb + sb;
    const uint4 qv = *(const uint4*)(a.qs + blk * 128 + 16 * q16);
    const u32 q[4] = {qv.x, qv.y, qv.z, qv.w};
    const uchar2 sc4 = *(const uchar2*)(a.aux + blk * 16 + 2 * p);
    const uchar2 mn4 = *(const uchar2*)(a.aux + blk * 16 + 8 + 2 * p);
    const int sc0 = sc4.x, sc1 = sc4.y, mn0 = mn4.x, mn1 = mn4.y;
    const float d = a.d[blk], dmin = a.m[blk];
    for (int r = 0; r < a.rows; r++) {
        const size_t ab = (size_t)r * a.kb + sb;
        const int4 xl = *(const int4*)(a.aq + ab * 256 + 64 * p + 16 * h);
        const int4 xh = *(const int4*)(a.aq + ab * 256 + 64 * p + 32 + 16 * h);
        const int xlo[4] = {xl.x, xl.y, xl.z, xl.w}, xhi[4] = {xh.x, xh.y, xh.z, xh.w};
        int slo = 0, shi = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            slo = __dp4a((int)(q[i] & 0x0f0f0f0fu), xlo[i], slo);
            shi = __dp4a((int)((q[i] >> 4) & 0x0f0f0f0fu), xhi[i], shi);
        }
        const int* bs = a.abs + ab * 16 + 4 * p + h;
        const int isum = sc0 * slo + sc1 * shi;
        const int imin = mn0 * bs[0] + mn1 * bs[2];
        const float da = a.ad[ab];
        acc[r] = fmaf(__fmul_rn(d, da), (float)isum, acc[r]);
        acc[r] = fmaf(-__fmul_rn(dmin, da), (float)imin, acc[r]);
    }
}

// Q6_K: item = (super-block sb, half j, 16-value slice h) covers the four groups
// k = 0..3 of that slice (64 values) so each ql/qh byte is loaded once (16-value items
// that re-read ql twice and qh four times ran at 1.59 TB/s on the H200, these at 2.1):
// ql[64j + 16h + l] holds k = 0 (low) and 2 (high), ql[64j + 32 + 16h + l] k = 1 and 3,
// qh[32j + 16h + l] bits 2k..2k+2 the high bits of group k; scale and bsum 8j + 2k + h.
__device__ __forceinline__ void item_q6k(const Args& a, int row, int it, float* acc) {
    const int sb = it >> 2, j = (it >> 1) & 1, h = it & 1;
    const size_t blk = (size_t)row * a.kb + sb;
    const u8* base = a.qs + blk * 192;
    const uint4 l0 = *(const uint4*)(base + 64 * j + 16 * h);
    const uint4 l1 = *(const uint4*)(base + 64 * j + 32 + 16 * h);
    const uint4 hv = *(const uint4*)(base + 128 + 32 * j + 16 * h);
    const u32 ql0[4] = {l0.x, l0.y, l0.z, l0.w}, ql1[4] = {l1.x, l1.y, l1.z, l1.w};
    const u32 qh[4] = {hv.x, hv.y, hv.z, hv.w};
    int q[4][4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 lo = (((k & 1) ? ql1[i] : ql0[i]) >> (4 * (k >> 1))) & 0x0f0f0f0fu;
            q[k][i] = (int)(lo | (((qh[i] >> (2 * k)) & 0x03030303u) << 4));
        }
    }
    const i8* sc = (const i8*)(a.aux + blk * 16) + 8 * j + h;
    const float d = a.d[blk];
    for (int r = 0; r < a.rows; r++) {
        const size_t ab = (size_t)r * a.kb + sb;
        const int* bs = a.abs + ab * 16 + 8 * j + h;
        int isum = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int4 xv = *(const int4*)(a.aq + ab * 256 + 128 * j + 32 * k + 16 * h);
            int s = __dp4a(q[k][0], xv.x, 0);
            s = __dp4a(q[k][1], xv.y, s);
            s = __dp4a(q[k][2], xv.z, s);
            s = __dp4a(q[k][3], xv.w, s);
            isum += sc[2 * k] * (s - 32 * bs[2 * k]);
        }
        acc[r] = fmaf(__fmul_rn(d, a.ad[ab]), (float)isum, acc[r]);
    }
}
