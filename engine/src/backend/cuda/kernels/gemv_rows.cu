// The GEMV kernels of every format (`gemv_<type>`, `gemv3_<type>`), after the per-item
// sums of gemv.cu, gemv_k.cu and gemv_f.cu: one warp a row, lane i the items i, i + 32, ...

// Work items a row: `kb` blocks of the activation format (values for F16 / BF16).
__host__ __device__ constexpr int gemv_items(int type, int kb) {
    return type == 4 || type == 8 || type == 11 ? kb * 8
           : type == 5 || type == 9 || type == 10 ? kb * 4
           : type == 12 || type == 13 ? kb / 8
           : kb;
}

// Output row `row` of `a`; its weights (and bias) are row `w0 + row` of the matrix (a
// mixture of experts' stacked matrices: `w0` is the chosen expert's first row).
template <int T>
__device__ __forceinline__ void gemv_at(const Args& a, int row, int w0 = 0) {
    const int lane = threadIdx.x & 31;
    if (row >= a.n) return;
    const int wrow = w0 + row;
    float acc[MAXM];
#pragma unroll
    for (int r = 0; r < MAXM; r++) acc[r] = 0.0f;
    const int items = gemv_items(T, a.kb);
#pragma unroll 4
    for (int it = lane; it < items; it += 32) {
        if constexpr (T == 4) item_q4k(a, wrow, it, acc);
        else if constexpr (T == 5) item_q6k(a, wrow, it, acc);
        else if constexpr (T == 8) item_q5k(a, wrow, it, acc);
        else if constexpr (T == 9) item_q3k(a, wrow, it, acc);
        else if constexpr (T == 10) item_q2k(a, wrow, it, acc);
        else if constexpr (T == 11) item_iq4xs(a, wrow, it, acc);
        else if constexpr (T == 12 || T == 13) item_float<T == 13>(a, wrow, it, acc);
        else item32<T>(a, wrow, it, acc);
    }
    for (int r = 0; r < a.rows; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0) a.y[(size_t)r * a.n + row] = a.bias ? s + a.bias[wrow] : s;
    }
}

#define GEMV(NAME, T)                                                                       \
    extern "C" __global__ void NAME(const u8* qs, const float* d, const float* m,           \
                                    const u8* aux, const i8* aq, const float* ad,           \
                                    const float* as, const int* abs, float* y,              \
                                    const float* bias, int n, int kb, int rows) {           \
        const Args a = {qs, d, m, aux, aq, ad, as, abs, y, n, kb, rows, bias};              \
        gemv_at<T>(a, blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));                 \
    }

GEMV(gemv_q4_0, 0)
GEMV(gemv_q4_1, 1)
GEMV(gemv_q5_0, 2)
GEMV(gemv_q8_0, 3)
GEMV(gemv_q4_k, 4)
GEMV(gemv_q6_k, 5)
GEMV(gemv_q5_1, 6)
GEMV(gemv_iq4_nl, 7)
GEMV(gemv_q5_k, 8)
GEMV(gemv_q3_k, 9)
GEMV(gemv_q2_k, 10)
GEMV(gemv_iq4_xs, 11)
GEMV(gemv_f16, 12)
GEMV(gemv_bf16, 13)
GEMV(gemv_mxfp4, 14)

// Up to three matrices of one format against the same activations in one launch (Q, K
// and V; gate and up): warps past matrix 0's rows take matrix 1's, then matrix 2's.
struct Mat { const u8* qs; const float* d; const float* m; const u8* aux; float* y; const float* b; int n; };

#define GEMV3(NAME, T)                                                                      \
    extern "C" __global__ void NAME(Mat w0, Mat w1, Mat w2, const i8* aq, const float* ad,  \
                                    const float* as, const int* abs, int kb, int rows) {    \
        int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                      \
        Mat w = w0;                                                                         \
        if (row >= w0.n) { row -= w0.n; w = w1;                                             \
            if (row >= w1.n) { row -= w1.n; w = w2; } }                                     \
        const Args a = {w.qs, w.d, w.m, w.aux, aq, ad, as, abs, w.y, w.n, kb, rows, w.b};   \
        gemv_at<T>(a, row);                                                                 \
    }

GEMV3(gemv3_q4_0, 0)
GEMV3(gemv3_q4_1, 1)
GEMV3(gemv3_q5_0, 2)
GEMV3(gemv3_q8_0, 3)
GEMV3(gemv3_q4_k, 4)
GEMV3(gemv3_q6_k, 5)
GEMV3(gemv3_q5_1, 6)
GEMV3(gemv3_iq4_nl, 7)
GEMV3(gemv3_q5_k, 8)
GEMV3(gemv3_q3_k, 9)
GEMV3(gemv3_q2_k, 10)
GEMV3(gemv3_iq4_xs, 11)
GEMV3(gemv3_f16, 12)
GEMV3(gemv3_bf16, 13)
GEMV3(gemv3_mxfp4, 14)
