// Grouped MMQ (a mixture of experts' prefill, `mmq_id.rs`), after mmq.cu in one program:
// the weights are an expert stack, `[experts][n][k]` as one matrix of experts * n rows;
// the activation rows arrive sorted by expert (`moe_sort`), and block (x, y) takes
// weight rows 64x.. of tile y of the table `tiles` ([expert, first row, rows] with
// rows <= 64, `moe_tiles`; rows 0: an unused slot of the launch). The tile's rows are
// multiplied by its expert's rows with mmq.cu's bodies, so each output has the dense
// MMQ's arithmetic for its own activation row: a row's result does not depend on the
// rows it shares a tile with, nor on how many rows its expert got. gpt-oss's expert
// biases (`bias`, `[experts][n]`, or null) are added as each output is stored.
// Grid: x the 64-row tiles of the n weight rows, y the tile slots; 128 threads.

#define MMQ_ID(NAME, BODY)                                                                  \
    extern "C" __global__ void __launch_bounds__(128)                                       \
        NAME(const u8* qs, const float* d, const float* m, const u8* aux, const i8* aq,     \
             const float* ad, const float* as, const int* abs, float* y, const float* bias, \
             int n, int kb, int k, const int* tiles) {                                      \
        const int* c = tiles + 3 * blockIdx.y;                                              \
        if (c[2] == 0) return;                                                              \
        const size_t r = c[1];                                                              \
        const MArgs a = {qs, d, m, aux, aq + r * k, ad + r * kb, as + r * kb,               \
                         abs + r * (k / 16), y + r * n, n, kb, c[2], bias, c[0] * n, 0};    \
        MMQ_BODY(BODY);                                                                     \
    }

MMQ_ID(mmq_id_q4_0, mmq32<0>(a))
MMQ_ID(mmq_id_q4_1, mmq32<1>(a))
MMQ_ID(mmq_id_q5_0, mmq32<2>(a))
MMQ_ID(mmq_id_q8_0, mmq32<3>(a))
MMQ_ID(mmq_id_q4_k, mmq_q4k(a))
MMQ_ID(mmq_id_q6_k, mmq_q6k(a))
MMQ_ID(mmq_id_iq4_nl, mmq32<7>(a))
MMQ_ID(mmq_id_mxfp4, mmq32<14>(a))
