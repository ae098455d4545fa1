// Grouped expert GEMV (a mixture of experts, `moe.rs`): the weights are an expert stack,
// `[experts][n][k]` as one matrix of experts * n rows; the activation rows arrive sorted
// by expert (`moe_sort`), and block x takes chunk x of the table `chunks` ([expert, first
// row, rows] with rows <= MAXM; rows 0: an unused slot of the launch), so an expert's
// weights are read once for up to eight of its rows. Each output is `gemv_at`'s
// arithmetic for its own activation row: a row's result does not depend on the rows it
// shares a chunk with. Grid: x the chunks, y blocks of output rows (one warp a row).

#define GEMV_ID(NAME, T)                                                                    \
    extern "C" __global__ void NAME(const u8* qs, const float* d, const float* m,           \
                                    const u8* aux, const i8* aq, const float* ad,           \
                                    const float* as, const int* abs, float* y,              \
                                    const float* bias, int n, int kb, int k,                \
                                    const int* chunks) {                                    \
        const int* c = chunks + 3 * blockIdx.x;                                             \
        if (c[2] == 0) return;                                                              \
        const size_t r = c[1];                                                              \
        const Args a = {qs, d, m, aux, aq + r * k, ad + r * kb, as + r * kb,                \
                        abs + r * (k / 16), y + r * n, n, kb, c[2], bias};                  \
        gemv_at<T>(a, blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5), c[0] * n);      \
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
GEMV_ID(gemv_id_mxfp4, 14)
