// Quantized GEMV / small-m GEMM: y[r][row] = W[row] . x[r] for up to MAXM activation rows,
// weights read once for all of them. One warp per output row; lane i takes the i-th work
// item (a block of 32; Q4_K 16 quant bytes, Q6_K 64 values of a 256 super-block), so the
// 32 lanes of a warp read one contiguous span of the repacked quant bytes (coalesced).
// Integer sums go through dp4a and are exact; each item adds d_w * d_a * isum in f32.
//
// Repacked weight layout (struct of arrays, `weights.rs`), per block in row-major order:
//   qs:  the quant bytes as in the GGUF block (Q6_K: ql then qh), QB bytes a block;
//   d:   f32 scale;  m: f32 (Q4_1 min, Q4_K dmin);
//   aux: Q5_0 the 32 high bits; Q4_K 8 six-bit scales then 8 mins, unpacked; Q6_K scales.
// Activations: int8 values row after row, one f32 scale per block, Q8_1 sums, Q8_K bsums.

#define MAXM 8

struct Args {
    const u8* qs; const float* d; const float* m; const u8* aux;
    const i8* aq; const float* ad; const float* as; const int* abs;
    float* y; int n; int kb; int rows;
};

__device__ __forceinline__ int sum_bytes(int a) { return __dp4a(a, 0x01010101, 0); }


// Types: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q8_0 (blocks of 32 against Q8_0/Q8_1 blocks).
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
        u32 qh = 0;
        if (T == 2) qh = *(const u32*)(a.aux + blk * 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[i] = pw[i] & 0x0f0f0f0fu;
            w[4 + i] = (pw[i] >> 4) & 0x0f0f0f0fu;
            if (T == 2) {
                w[i] |= spread4((qh >> (4 * i)) & 0xfu);
                w[4 + i] |= spread4((qh >> (16 + 4 * i)) & 0xfu);
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
        if (T == 1) acc[r] = fmaf(a.m[blk], a.as[ab], acc[r]);
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

template <int T>
__device__ __forceinline__ void gemv_at(const Args& a, int row) {
    const int lane = threadIdx.x & 31;
    if (row >= a.n) return;
    float acc[MAXM];
#pragma unroll
    for (int r = 0; r < MAXM; r++) acc[r] = 0.0f;
    const int items = T == 4 ? a.kb * 8 : T == 5 ? a.kb * 4 : a.kb;
#pragma unroll 4
    for (int it = lane; it < items; it += 32) {
        if (T == 4) item_q4k(a, row, it, acc);
        else if (T == 5) item_q6k(a, row, it, acc);
        else item32<T>(a, row, it, acc);
    }
    for (int r = 0; r < a.rows; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0) a.y[(size_t)r * a.n + row] = s;
    }
}

#define GEMV(NAME, T)                                                                       \
    extern "C" __global__ void NAME(const u8* qs, const float* d, const float* m,           \
                                    const u8* aux, const i8* aq, const float* ad,           \
                                    const float* as, const int* abs, float* y, int n,       \
                                    int kb, int rows) {                                     \
        const Args a = {qs, d, m, aux, aq, ad, as, abs, y, n, kb, rows};                    \
        gemv_at<T>(a, blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));                 \
    }

GEMV(gemv_q4_0, 0)
GEMV(gemv_q4_1, 1)
GEMV(gemv_q5_0, 2)
GEMV(gemv_q8_0, 3)
GEMV(gemv_q4_k, 4)
GEMV(gemv_q6_k, 5)

// Up to three matrices of one format against the same activations in one launch (Q, K
// and V; gate and up): warps past matrix 0's rows take matrix 1's, then matrix 2's.
struct Mat { const u8* qs; const float* d; const float* m; const u8* aux; float* y; int n; };

#define GEMV3(NAME, T)                                                                      \
    extern "C" __global__ void NAME(Mat w0, Mat w1, Mat w2, const i8* aq, const float* ad,  \
                                    const float* as, const int* abs, int kb, int rows) {    \
        int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                      \
        Mat w = w0;                                                                         \
        if (row >= w0.n) { row -= w0.n; w = w1;                                             \
            if (row >= w1.n) { row -= w1.n; w = w2; } }                                     \
        const Args a = {w.qs, w.d, w.m, w.aux, aq, ad, as, abs, w.y, w.n, kb, rows};        \
        gemv_at<T>(a, row);                                                                 \
    }

GEMV3(gemv3_q4_0, 0)
GEMV3(gemv3_q4_1, 1)
GEMV3(gemv3_q5_0, 2)
GEMV3(gemv3_q8_0, 3)
GEMV3(gemv3_q4_k, 4)
GEMV3(gemv3_q6_k, 5)
