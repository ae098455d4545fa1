// Expert-indexed GEMV (a mixture of experts, `moe.rs`): the weights are an expert stack,
// `[experts][n][k]` as one matrix of experts * n rows; pair p (token t = p / div, slot
// p % used) multiplies expert ids[p]'s n rows with activation row p / div (div = used:
// every slot of a token reads the token's row; div = 1: each pair has its own row) into
// y[p][n]. Each output is `gemv_at`'s arithmetic for one activation row, so a pair's
// result does not depend on the other pairs of the launch. Grid: x the pairs, y blocks
// of output rows (one warp a row).

#define GEMV_ID(NAME, T)                                                                    \
    extern "C" __global__ void NAME(const u8* qs, const float* d, const float* m,           \
                                    const u8* aux, const i8* aq, const float* ad,           \
                                    const float* as, const int* abs, float* y,              \
                                    const float* bias, int n, int kb, int k,                \
                                    const int* ids, int div) {                              \
        const size_t p = blockIdx.x, r = p / div;                                           \
        const Args a = {qs, d, m, aux, aq + r * k, ad + r * kb, as + r * kb,                \
                        abs + r * (k / 16), y + p * n, n, kb, 1, bias};                     \
        gemv_at<T>(a, blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5), ids[p] * n);     \
    }

GEMV_ID(gemv_id_q4_0, 0)
GEMV_ID(gemv_id_q4_1, 1)
GEMV_ID(gemv_id_q5_0, 2)
GEMV_ID(gemv_id_q8_0, 3)
GEMV_ID(gemv_id_q4_k, 4)
GEMV_ID(gemv_id_q6_k, 5)
GEMV_ID(gemv_id_q5_1, 6)
GEMV_ID(gemv_id_iq4_nl, 7)
GEMV_ID(gemv_id_q5_k, 8)
GEMV_ID(gemv_id_q3_k, 9)
GEMV_ID(gemv_id_q2_k, 10)
GEMV_ID(gemv_id_iq4_xs, 11)
GEMV_ID(gemv_id_f16, 12)
GEMV_ID(gemv_id_bf16, 13)
