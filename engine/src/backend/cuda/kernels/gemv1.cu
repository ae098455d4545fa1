// GEMV of one activation row (`gemv1_*`, `gemv1x3_*`), compiled after gemv_rows.cu in one
// program (`Args`, `Mat` and the per-item sums are its): a lane loads GEMV_U items'
// weight bytes first, then does their sums. The same items in the same order and the
// same arithmetic per item as `gemv_at`, so the outputs are bit-identical to it at one
// row; with the run-time row count of `gemv_at` the compiler issues each item's loads
// only as it reaches the item (on an H200 this form reads an 8B FFN matrix at 2.8 TB/s
// against 2.2). With 8 rows the two-phase form was slower (more registers), so several
// rows keep `gemv_at`.

#define GEMV_U 4

struct WItem { uint4 q0, q1, q2; u32 e0, e1; float d, m; };

template <int T>
__device__ __forceinline__ WItem load_item(const Args& a, int row, int it) {
    WItem w;
    if (T <= 3) {
        const size_t blk = (size_t)row * a.kb + it;
        if (T == 3) {
            w.q0 = *(const uint4*)(a.qs + blk * 32);
            w.q1 = *(const uint4*)(a.qs + blk * 32 + 16);
        } else {
            w.q0 = *(const uint4*)(a.qs + blk * 16);
        }
        if (T == 2) w.e0 = *(const u32*)(a.aux + blk * 4);
        w.d = a.d[blk];
        if (T == 1) w.m = a.m[blk];
    } else if (T == 4) {
        const int sb = it >> 3, q16 = it & 7, p = q16 >> 1;
        const size_t blk = (size_t)row * a.kb + sb;
        w.q0 = *(const uint4*)(a.qs + blk * 128 + 16 * q16);
        w.e0 = *(const unsigned short*)(a.aux + blk * 16 + 2 * p);
        w.e1 = *(const unsigned short*)(a.aux + blk * 16 + 8 + 2 * p);
        w.d = a.d[blk];
        w.m = a.m[blk];
    } else {
        const int sb = it >> 2, j = (it >> 1) & 1, h = it & 1;
        const size_t blk = (size_t)row * a.kb + sb;
        const u8* base = a.qs + blk * 192;
        w.q0 = *(const uint4*)(base + 64 * j + 16 * h);
        w.q1 = *(const uint4*)(base + 64 * j + 32 + 16 * h);
        w.q2 = *(const uint4*)(base + 128 + 32 * j + 16 * h);
        const uint2 sc = *(const uint2*)(a.aux + blk * 16 + 8 * j);
        w.e0 = sc.x;
        w.e1 = sc.y;
        w.d = a.d[blk];
    }
    return w;
}

// Item `it`'s contribution to activation row r, exactly as `item32` / `item_q4k` /
// `item_q6k` compute it.
template <int T>
__device__ __forceinline__ float dot_item(const Args& a, const WItem& w, int it, int r, float acc) {
    if (T <= 3) {
        int wv[8];
        if (T == 3) {
            wv[0] = w.q0.x; wv[1] = w.q0.y; wv[2] = w.q0.z; wv[3] = w.q0.w;
            wv[4] = w.q1.x; wv[5] = w.q1.y; wv[6] = w.q1.z; wv[7] = w.q1.w;
        } else {
            const u32 pw[4] = {w.q0.x, w.q0.y, w.q0.z, w.q0.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                wv[i] = pw[i] & 0x0f0f0f0fu;
                wv[4 + i] = (pw[i] >> 4) & 0x0f0f0f0fu;
                if (T == 2) {
                    wv[i] |= spread4((w.e0 >> (4 * i)) & 0xfu);
                    wv[4 + i] |= spread4((w.e0 >> (16 + 4 * i)) & 0xfu);
                }
            }
        }
        const size_t ab = (size_t)r * a.kb + it;
        const uint4 x0 = *(const uint4*)(a.aq + ab * 32);
        const uint4 x1 = *(const uint4*)(a.aq + ab * 32 + 16);
        const int x[8] = {(int)x0.x, (int)x0.y, (int)x0.z, (int)x0.w,
                          (int)x1.x, (int)x1.y, (int)x1.z, (int)x1.w};
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) s = __dp4a(wv[i], x[i], s);
        if (T == 0 || T == 2) {
            int sx = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) sx = __dp4a(x[i], 0x01010101, sx);
            s -= (T == 0 ? 8 : 16) * sx;
        }
        acc = fmaf(__fmul_rn(w.d, a.ad[ab]), (float)s, acc);
        if (T == 1) acc = fmaf(w.m, a.as[ab], acc);
        return acc;
    } else if (T == 4) {
        const int sb = it >> 3, q16 = it & 7, p = q16 >> 1, h = q16 & 1;
        const u32 q[4] = {w.q0.x, w.q0.y, w.q0.z, w.q0.w};
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
        const int isum = (int)(w.e0 & 0xff) * slo + (int)(w.e0 >> 8) * shi;
        const int imin = (int)(w.e1 & 0xff) * bs[0] + (int)(w.e1 >> 8) * bs[2];
        const float da = a.ad[ab];
        acc = fmaf(__fmul_rn(w.d, da), (float)isum, acc);
        return fmaf(-__fmul_rn(w.m, da), (float)imin, acc);
    } else {
        const int sb = it >> 2, j = (it >> 1) & 1, h = it & 1;
        const u32 ql0[4] = {w.q0.x, w.q0.y, w.q0.z, w.q0.w}, ql1[4] = {w.q1.x, w.q1.y, w.q1.z, w.q1.w};
        const u32 qh[4] = {w.q2.x, w.q2.y, w.q2.z, w.q2.w};
        const size_t ab = (size_t)r * a.kb + sb;
        const int* bs = a.abs + ab * 16 + 8 * j + h;
        int isum = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int q[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const u32 lo = (((k & 1) ? ql1[i] : ql0[i]) >> (4 * (k >> 1))) & 0x0f0f0f0fu;
                q[i] = (int)(lo | (((qh[i] >> (2 * k)) & 0x03030303u) << 4));
            }
            // scale 8j + 2k + h: byte h + 2k of the 8 loaded from 8j.
            const u32 word = k < 2 ? w.e0 : w.e1;
            const int sc = (int)(signed char)((word >> (8 * (h + 2 * (k & 1)))) & 0xffu);
            const int4 xv = *(const int4*)(a.aq + ab * 256 + 128 * j + 32 * k + 16 * h);
            int s = __dp4a(q[0], xv.x, 0);
            s = __dp4a(q[1], xv.y, s);
            s = __dp4a(q[2], xv.z, s);
            s = __dp4a(q[3], xv.w, s);
            isum += sc * (s - 32 * bs[2 * k]);
        }
        return fmaf(__fmul_rn(w.d, a.ad[ab]), (float)isum, acc);
    }
}

template <int T>
__device__ __forceinline__ void gemv1_two_phase(const Args& a, int row) {
    const int lane = threadIdx.x & 31;
    if (row >= a.n) return;
    float acc = 0.0f;
    const int items = T == 4 ? a.kb * 8 : T == 5 ? a.kb * 4 : a.kb;
    for (int it0 = lane; it0 < items; it0 += 32 * GEMV_U) {
        WItem w[GEMV_U];
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            if (it0 + 32 * u < items) w[u] = load_item<T>(a, row, it0 + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            if (it0 + 32 * u < items) acc = dot_item<T>(a, w[u], it0 + 32 * u, 0, acc);
        }
    }
    const float s = warp_sum(acc);
    if (lane == 0) a.y[row] = a.bias ? s + a.bias[row] : s;
}

// The two-phase form for the six formats it was tuned on; the formats added later take
// `gemv_at` at one row (the same code as their several-row launches, so the same outputs).
template <int T>
__device__ __forceinline__ void gemv1_at(const Args& a, int row) {
    if constexpr (T <= 5) gemv1_two_phase<T>(a, row);
    else gemv_at<T>(a, row);
}

#define GEMV1(NAME, NAME3, T)                                                               \
    extern "C" __global__ void NAME(const u8* qs, const float* d, const float* m,           \
                                    const u8* aux, const i8* aq, const float* ad,           \
                                    const float* as, const int* abs, float* y,              \
                                    const float* bias, int n, int kb) {                     \
        const Args a = {qs, d, m, aux, aq, ad, as, abs, y, n, kb, 1, bias};                 \
        gemv1_at<T>(a, blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));                \
    }                                                                                       \
    extern "C" __global__ void NAME3(Mat w0, Mat w1, Mat w2, const i8* aq, const float* ad, \
                                     const float* as, const int* abs, int kb) {             \
        int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                      \
        Mat w = w0;                                                                         \
        if (row >= w0.n) { row -= w0.n; w = w1;                                             \
            if (row >= w1.n) { row -= w1.n; w = w2; } }                                     \
        const Args a = {w.qs, w.d, w.m, w.aux, aq, ad, as, abs, w.y, w.n, kb, 1, w.b};      \
        gemv1_at<T>(a, row);                                                                \
    }

GEMV1(gemv1_q4_0, gemv1x3_q4_0, 0)
GEMV1(gemv1_q4_1, gemv1x3_q4_1, 1)
GEMV1(gemv1_q5_0, gemv1x3_q5_0, 2)
GEMV1(gemv1_q8_0, gemv1x3_q8_0, 3)
GEMV1(gemv1_q4_k, gemv1x3_q4_k, 4)
GEMV1(gemv1_q6_k, gemv1x3_q6_k, 5)
GEMV1(gemv1_q5_1, gemv1x3_q5_1, 6)
GEMV1(gemv1_iq4_nl, gemv1x3_iq4_nl, 7)
GEMV1(gemv1_q5_k, gemv1x3_q5_k, 8)
GEMV1(gemv1_q3_k, gemv1x3_q3_k, 9)
GEMV1(gemv1_q2_k, gemv1x3_q2_k, 10)
GEMV1(gemv1_iq4_xs, gemv1x3_iq4_xs, 11)
GEMV1(gemv1_f16, gemv1x3_f16, 12)
GEMV1(gemv1_bf16, gemv1x3_bf16, 13)
GEMV1(gemv1_mxfp4, gemv1x3_mxfp4, 14)
