// Quantized GEMM for prefill chunks on the tensor cores: y[t][r] = W[r] . x[t]. The
// integer sum of each block (weights as small signed ints, activations int8) comes from
// mma.sync (exact, the same integers the GEMV's dp4a sums), then is scaled and added in
// f32 per block as the GEMV does, so the two differ only in the order of the f32 adds.
// Weights as repacked by weights.rs (see gemv.cu), activations as quantize.cu leaves them.
//
// A CTA is 4 warps over 64 weight rows x 64 activation rows; a warp covers 32 x 32 as
// MT x NT tiles of mma m16n8 (M: weight rows, N: activation rows, K: 32 values of one
// block; Q6_K's groups of 16 take the k16 shape). Fragments are loaded from global
// memory (L1 and L2 serve the reuse between warps and CTAs). Rows past the end read the
// last row and are not stored, so every lane takes part in every mma. Each output is
// the same f32 sequence whatever its tile neighbours: per block (or super-block) in
// order, acc = fma(d_w * d_a, exact integer sum, acc), so a row's result does not depend
// on the other rows of the launch. The grouped kernels (`mmq_id.cu`) take the same
// bodies with the weights offset to an expert's rows (`w0`) and a gpt-oss bias added as
// each output is stored.
//
// Fragment layouts (PTX ISA, mma.m16n8k32 .s8; g = lane / 4, q = lane % 4):
//   A (16 x 32, row-major): a0 = row g, k 4q..4q+3; a1 = row g+8, same k;
//                           a2 = row g, k 16+4q..; a3 = row g+8, k 16+4q..
//   B (32 x 8, column n):   b0 = k 4q..4q+3 of column g; b1 = k 16+4q.. of column g
//   C (16 x 8):             c0 = (g, 2q), c1 = (g, 2q+1), c2 = (g+8, 2q), c3 = (g+8, 2q+1)
// k16 takes a0, a1 and b0 only.

#define MT 2
#define NT 4

struct MArgs {
    const u8* qs; const float* d; const float* m; const u8* aux;
    const i8* aq; const float* ad; const float* as; const int* abs;
    float* y; int n; int kb; int rows;
    // Added to each output as it is stored (row w0 + r of a stacked `[experts][n]` bias),
    // or null.
    const float* bias;
    // The weights' first row (an expert's in a stack of experts * n rows); the tile of 64
    // activation rows this CTA covers.
    int w0; int ty;
};

__device__ __forceinline__ void mma_k32(int (&c)[4], const int (&a)[4], int b0, int b1) {
    c[0] = c[1] = c[2] = c[3] = 0;
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
    c[0] = c[1] = c[2] = c[3] = 0;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

template <typename T>
__device__ __forceinline__ void zero(T (&v)[MT][NT][4]) {
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) v[mi][ni][e] = 0;
}

// Which rows and activation rows this lane touches.
struct Tile {
    int g, q;
    int rbase, tbase;
    int wr[MT][2];  // weight row of (m tile, g / g+8), clamped
    int tb[NT];     // activation row of B column g, clamped
    int tc[NT][2];  // activation row of C columns 2q, 2q+1, clamped
};

__device__ __forceinline__ Tile tile(const MArgs& a) {
    Tile t;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    t.g = lane >> 2;
    t.q = lane & 3;
    t.rbase = blockIdx.x * 64 + (warp >> 1) * 32;
    t.tbase = a.ty * 64 + (warp & 1) * 32;
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) t.wr[mi][h] = a.w0 + min(t.rbase + 16 * mi + t.g + 8 * h, a.n - 1);
#pragma unroll
    for (int ni = 0; ni < NT; ni++) {
        t.tb[ni] = min(t.tbase + 8 * ni + t.g, a.rows - 1);
#pragma unroll
        for (int e = 0; e < 2; e++) t.tc[ni][e] = min(t.tbase + 8 * ni + 2 * t.q + e, a.rows - 1);
    }
    return t;
}

__device__ __forceinline__ void store(const MArgs& a, const Tile& t, const float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e4 = 0; e4 < 4; e4++) {
                const int row = t.rbase + 16 * mi + t.g + 8 * (e4 >> 1);
                const int tok = t.tbase + 8 * ni + 2 * t.q + (e4 & 1);
                if (row < a.n && tok < a.rows) {
                    const float v = acc[mi][ni][e4];
                    a.y[(size_t)tok * a.n + row] = a.bias ? __fadd_rn(v, a.bias[a.w0 + row]) : v;
                }
            }
}

// Values 4q..4q+3 (lo) and 16+4q..16+4q+3 (hi) of block `blk` as signed bytes.
// Types: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q8_0, 7 IQ4_NL, 14 MXFP4 (the nibbles index their
// tables of signed bytes, as in the GEMV's `item32`).
template <int T>
__device__ __forceinline__ void wfrag32(const MArgs& a, size_t blk, int q, int& lo, int& hi) {
    if (T == 3) {
        lo = *(const int*)(a.qs + blk * 32 + 4 * q);
        hi = *(const int*)(a.qs + blk * 32 + 16 + 4 * q);
        return;
    }
    const u32 x = *(const u32*)(a.qs + blk * 16 + 4 * q);
    u32 l = x & 0x0f0f0f0fu, h = (x >> 4) & 0x0f0f0f0fu;
    if (T == 2) {
        const u32 qh = *(const u32*)(a.aux + blk * 4);
        l = __vsub4(l | spread4((qh >> (4 * q)) & 0xfu), 0x10101010u);
        h = __vsub4(h | spread4((qh >> (16 + 4 * q)) & 0xfu), 0x10101010u);
    }
    if (T == 0) {
        l = __vsub4(l, 0x08080808u);
        h = __vsub4(h, 0x08080808u);
    }
    if (T == 7) {
        l = (u32)iq4_lookup4(l);
        h = (u32)iq4_lookup4(h);
    }
    if (T == 14) {
        l = (u32)mxfp4_lookup4(l);
        h = (u32)mxfp4_lookup4(h);
    }
    lo = (int)l;
    hi = (int)h;
}

template <int T>
__device__ __forceinline__ void mmq32(const MArgs& a) {
    const Tile t = tile(a);
    const size_t K = (size_t)a.kb * 32;
    float acc[MT][NT][4];
    zero(acc);
    for (int b = 0; b < a.kb; b++) {
        int A[MT][4];
        float dw[MT][2], mw[MT][2];
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const size_t blk = (size_t)t.wr[mi][h] * a.kb + b;
                wfrag32<T>(a, blk, t.q, A[mi][h], A[mi][2 + h]);
                dw[mi][h] = a.d[blk];
                mw[mi][h] = T == 1 ? a.m[blk] : 0.0f;
            }
#pragma unroll
        for (int ni = 0; ni < NT; ni++) {
            const i8* xp = a.aq + (size_t)t.tb[ni] * K + (size_t)b * 32 + 4 * t.q;
            const int b0 = *(const int*)xp, b1 = *(const int*)(xp + 16);
            float da[2], sa[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const size_t ab = (size_t)t.tc[ni][e] * a.kb + b;
                da[e] = a.ad[ab];
                sa[e] = T == 1 ? a.as[ab] : 0.0f;
            }
#pragma unroll
            for (int mi = 0; mi < MT; mi++) {
                int c[4];
                mma_k32(c, A[mi], b0, b1);
#pragma unroll
                for (int e4 = 0; e4 < 4; e4++) {
                    const int h = e4 >> 1, e = e4 & 1;
                    float v = fmaf(__fmul_rn(dw[mi][h], da[e]), (float)c[e4], acc[mi][ni][e4]);
                    if (T == 1) v = fmaf(mw[mi][h], sa[e], v);
                    acc[mi][ni][e4] = v;
                }
            }
        }
    }
    store(a, t, acc);
}

// Q4_K against Q8_K: per super-block, isum = sum over sub-blocks s of scale_s * (q . x)_s
// (q unsigned 4-bit) and imin = sum of min_s * (x sum)_s, both exact integers; then
// acc += d*da*isum - dmin*da*imin, as the GEMV.
__device__ __forceinline__ void mmq_q4k(const MArgs& a) {
    const Tile t = tile(a);
    const size_t K = (size_t)a.kb * 256;
    float acc[MT][NT][4];
    zero(acc);
    for (int sb = 0; sb < a.kb; sb++) {
        int isum[MT][NT][4];
        zero(isum);
#pragma unroll 1
        for (int p = 0; p < 4; p++) {
            u32 xl[MT][2], xh[MT][2];
            int sc[MT][2][2];
#pragma unroll
            for (int mi = 0; mi < MT; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const size_t blk = (size_t)t.wr[mi][h] * a.kb + sb;
                    xl[mi][h] = *(const u32*)(a.qs + blk * 128 + 32 * p + 4 * t.q);
                    xh[mi][h] = *(const u32*)(a.qs + blk * 128 + 32 * p + 16 + 4 * t.q);
                    sc[mi][h][0] = a.aux[blk * 16 + 2 * p];
                    sc[mi][h][1] = a.aux[blk * 16 + 2 * p + 1];
                }
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int s = 2 * p + half;
                int A[MT][4];
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        A[mi][h] = (int)((xl[mi][h] >> (4 * half)) & 0x0f0f0f0fu);
                        A[mi][2 + h] = (int)((xh[mi][h] >> (4 * half)) & 0x0f0f0f0fu);
                    }
#pragma unroll
                for (int ni = 0; ni < NT; ni++) {
                    const i8* xp = a.aq + (size_t)t.tb[ni] * K + (size_t)sb * 256 + 32 * s + 4 * t.q;
                    const int b0 = *(const int*)xp, b1 = *(const int*)(xp + 16);
#pragma unroll
                    for (int mi = 0; mi < MT; mi++) {
                        int c[4];
                        mma_k32(c, A[mi], b0, b1);
#pragma unroll
                        for (int e4 = 0; e4 < 4; e4++) isum[mi][ni][e4] += sc[mi][e4 >> 1][half] * c[e4];
                    }
                }
            }
        }
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const size_t ab = (size_t)t.tc[ni][e] * a.kb + sb;
                const float da = a.ad[ab];
                const int* bs = a.abs + ab * 16;
                int xs[8];
#pragma unroll
                for (int s = 0; s < 8; s++) xs[s] = bs[2 * s] + bs[2 * s + 1];
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const size_t blk = (size_t)t.wr[mi][h] * a.kb + sb;
                        const u8* mn = a.aux + blk * 16 + 8;
                        int imin = 0;
#pragma unroll
                        for (int s = 0; s < 8; s++) imin += mn[s] * xs[s];
                        const int e4 = 2 * h + e;
                        float v = fmaf(__fmul_rn(a.d[blk], da), (float)isum[mi][ni][e4], acc[mi][ni][e4]);
                        acc[mi][ni][e4] = fmaf(-__fmul_rn(a.m[blk], da), (float)imin, v);
                    }
            }
    }
    store(a, t, acc);
}

// Q6_K against Q8_K: sixteen groups of 16 values, each (q - 32) . x through the k16 mma
// times its int8 scale, summed as integers over the super-block; acc += d*da*isum.
// Group G = 8j + 2k + h: value 128j + 32k + 16h + l takes ql[64j + 32(k&1) + 16h + l]
// (nibble k >> 1) and qh[32j + 16h + l] (bits 2k, 2k+1).
__device__ __forceinline__ void mmq_q6k(const MArgs& a) {
    const Tile t = tile(a);
    const size_t K = (size_t)a.kb * 256;
    float acc[MT][NT][4];
    zero(acc);
    for (int sb = 0; sb < a.kb; sb++) {
        int isum[MT][NT][4];
        zero(isum);
#pragma unroll 1
        for (int G = 0; G < 16; G++) {
            const int j = G >> 3, k = (G >> 1) & 3, h16 = G & 1;
            const int l = 16 * h16 + 4 * t.q;
            int A[MT][2], sc[MT][2];
#pragma unroll
            for (int mi = 0; mi < MT; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const size_t blk = (size_t)t.wr[mi][h] * a.kb + sb;
                    const u8* base = a.qs + blk * 192;
                    const u32 ql = *(const u32*)(base + 64 * j + 32 * (k & 1) + l);
                    const u32 qh = *(const u32*)(base + 128 + 32 * j + l);
                    const u32 v = ((ql >> (4 * (k >> 1))) & 0x0f0f0f0fu) | (((qh >> (2 * k)) & 0x03030303u) << 4);
                    A[mi][h] = (int)__vsub4(v, 0x20202020u);
                    sc[mi][h] = ((const i8*)a.aux)[blk * 16 + G];
                }
#pragma unroll
            for (int ni = 0; ni < NT; ni++) {
                const int b0 = *(const int*)(a.aq + (size_t)t.tb[ni] * K + (size_t)sb * 256 + 16 * G + 4 * t.q);
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    int c[4];
                    mma_k16(c, A[mi][0], A[mi][1], b0);
#pragma unroll
                    for (int e4 = 0; e4 < 4; e4++) isum[mi][ni][e4] += sc[mi][e4 >> 1] * c[e4];
                }
            }
        }
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float da = a.ad[(size_t)t.tc[ni][e] * a.kb + sb];
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const size_t blk = (size_t)t.wr[mi][h] * a.kb + sb;
                        const int e4 = 2 * h + e;
                        acc[mi][ni][e4] = fmaf(__fmul_rn(a.d[blk], da), (float)isum[mi][ni][e4], acc[mi][ni][e4]);
                    }
            }
    }
    store(a, t, acc);
}

// int8 mma needs sm_80; older devices compile an empty kernel the host never launches
// (`Gpu::has_mmq`).
#if __CUDA_ARCH__ >= 800
#define MMQ_BODY(BODY) BODY
#else
#define MMQ_BODY(BODY)
#endif

#define MMQ(NAME, BODY)                                                                     \
    extern "C" __global__ void __launch_bounds__(128)                                       \
        NAME(const u8* qs, const float* d, const float* m, const u8* aux, const i8* aq,     \
             const float* ad, const float* as, const int* abs, float* y, int n, int kb,     \
             int rows) {                                                                    \
        const MArgs a = {qs, d, m, aux, aq, ad, as, abs, y, n, kb, rows, nullptr, 0,        \
                         (int)blockIdx.y};                                                  \
        MMQ_BODY(BODY);                                                                     \
    }

MMQ(mmq_q4_0, mmq32<0>(a))
MMQ(mmq_q4_1, mmq32<1>(a))
MMQ(mmq_q5_0, mmq32<2>(a))
MMQ(mmq_q8_0, mmq32<3>(a))
MMQ(mmq_q4_k, mmq_q4k(a))
MMQ(mmq_q6_k, mmq_q6k(a))
