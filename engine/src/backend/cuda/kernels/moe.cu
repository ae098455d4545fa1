// A mixture of experts' routing and combination (`moe.rs`); the experts' matrices run in
// `gemv_id.cu`. Arithmetic as the CPU's (`kernels/moe`): each router logit the tinyBLAS
// dot product (`dot_lanes`: 16 FMA chains, lane l taking elements l, l + 16, ..., reduced
// halves, quarters, pairs) plus the router's bias if it has one; `moe_softmax` as
// `route::softmax`. qwen3moe (`kind` 0): the softmax of every logit, the `used` largest
// probabilities (ties to the lower expert, then the first two swapped, as ggml orders
// them), renormalized by their f64 sum rounded once. gpt-oss (`kind` 1): the `used`
// largest logits (ties to the lower expert), weighted by the softmax of those alone.

#define MOE_MAX_EXPERTS 512

// ggml_soft_max of p[0..n) in place, as the CPU's `route::softmax`: the maximum, whole
// chunks of 16 through ggml's exp with each chunk's sum reduced halves, quarters, pairs
// and added in f64, the tail through libm's exp added one by one in f64; then every
// value times (f32)(1 / sum).
__device__ __forceinline__ void moe_softmax(float* p, int n) {
    float mx = NEG_INF;
    for (int e = 0; e < n; e++) mx = mx > p[e] ? mx : p[e];
    const int whole = n / 16 * 16;
    double sum = 0.0;
    for (int c = 0; c < whole; c += 16) {
        float t3[8];
        for (int i = 0; i < 16; i++) p[c + i] = ggml_expf(p[c + i] - mx);
        for (int i = 0; i < 8; i++) t3[i] = p[c + i + 8] + p[c + i];
        const float t6[4] = {t3[4] + t3[0], t3[5] + t3[1], t3[6] + t3[2], t3[7] + t3[3]};
        sum += (double)((t6[0] + t6[2]) + (t6[1] + t6[3]));
    }
    for (int e = whole; e < n; e++) {
        p[e] = expf(p[e] - mx);
        sum += (double)p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < n; e++) p[e] = __fmul_rn(p[e], inv);
}

// One block a token: warps take experts e, e + warps, ... for the router's dot products
// (`hidden` a multiple of 16; lanes 0..15 the tinyBLAS lanes), then thread 0 routes.
// `bias`: the router's, or null. ids / weights: [tokens][used].
extern "C" __global__ void moe_route(const float* __restrict__ x, const float* __restrict__ router,
                                     const float* __restrict__ bias, int hidden, int experts, int used, int kind,
                                     int* __restrict__ ids, float* __restrict__ weights) {
    __shared__ float p[MOE_MAX_EXPERTS];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float* xr = x + (size_t)t * hidden;
    for (int e = warp; e < experts; e += warps) {
        const float* w = router + (size_t)e * hidden;
        float s = 0.0f;
        if (lane < 16)
            for (int i = lane; i < hidden; i += 16) s = fmaf(w[i], xr[i], s);
        // Lane i < 8 adds lane i + 8's chain, then i < 4 the next half, and so on: lane 0
        // ends with (t6[0] + t6[2]) + (t6[1] + t6[3]), GCC's `_mm512_reduce_add_ps`.
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) s = s + __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) p[e] = bias ? __fadd_rn(s, bias[e]) : s;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    // qwen3moe chooses by probability, gpt-oss by logit.
    if (kind == 0) moe_softmax(p, experts);
    int* id = ids + (size_t)t * used;
    float* wt = weights + (size_t)t * used;
    u32 taken[MOE_MAX_EXPERTS / 32] = {0};
    for (int s = 0; s < used; s++) {
        int best = -1;
        for (int e = 0; e < experts; e++) {
            if ((taken[e >> 5] >> (e & 31)) & 1u) continue;
            if (best < 0 || p[e] > p[best]) best = e;
        }
        taken[best >> 5] |= 1u << (best & 31);
        id[s] = best;
    }
    if (kind == 1) {
        for (int s = 0; s < used; s++) wt[s] = p[id[s]];
        moe_softmax(wt, used);
        return;
    }
    if (used > 1) {
        const int first = id[0];
        id[0] = id[1];
        id[1] = first;
    }
    double total = 0.0;
    for (int s = 0; s < used; s++) total += (double)p[id[s]];
    const float tot = (float)total;
    for (int s = 0; s < used; s++) wt[s] = __fdiv_rn(p[id[s]], tot);
}

// The (token, slot) pairs sorted by expert, for the grouped GEMV (`gemv_id.cu`): one
// thread, pairs in order within an expert. pos[p]: pair p's row in the sorted order;
// sorted[i]: the pair at row i; chunks: [expert, first row, rows <= 8] per chunk, every
// slot past the last chunk zeroed (`max_chunks` slots).
extern "C" __global__ void moe_sort(const int* __restrict__ ids, int pairs, int experts, int max_chunks,
                                    int* __restrict__ pos, int* __restrict__ sorted, int* __restrict__ chunks) {
    __shared__ int start[MOE_MAX_EXPERTS + 1];
    if (threadIdx.x != 0) return;
    for (int e = 0; e <= experts; e++) start[e] = 0;
    for (int p = 0; p < pairs; p++) start[ids[p] + 1]++;
    for (int e = 0; e < experts; e++) start[e + 1] += start[e];
    int c = 0;
    for (int e = 0; e < experts; e++) {
        for (int r = start[e]; r < start[e + 1]; r += 8) {
            chunks[3 * c] = e;
            chunks[3 * c + 1] = r;
            chunks[3 * c + 2] = min(8, start[e + 1] - r);
            c++;
        }
    }
    for (; c < max_chunks; c++) chunks[3 * c] = chunks[3 * c + 1] = chunks[3 * c + 2] = 0;
    for (int p = 0; p < pairs; p++) {
        const int at = start[ids[p]]++;
        pos[p] = at;
        sorted[at] = p;
    }
}

// xs[i] = x[sorted[i] / used]: each sorted pair's token row.
extern "C" __global__ void moe_gather(const float* __restrict__ x, const int* __restrict__ sorted, int pairs,
                                      int used, int hidden, float* __restrict__ xs) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)pairs * hidden) return;
    const size_t row = i / hidden, c = i % hidden;
    xs[i] = x[(size_t)(sorted[row] / used) * hidden + c];
}

// y[t][i] = sum over slots s, in order, of weights[t][s] * out[pos[t * used + s]][i], each
// product rounded before its add (the CPU's order).
extern "C" __global__ void moe_sum(const float* __restrict__ out, const int* __restrict__ pos,
                                   const float* __restrict__ weights, int tokens, int used, int hidden,
                                   float* __restrict__ y) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)tokens * hidden) return;
    const size_t t = i / hidden, c = i % hidden;
    float acc = 0.0f;
    for (int s = 0; s < used; s++) {
        const size_t p = t * used + s;
        const float v = __fmul_rn(weights[p], out[(size_t)pos[p] * hidden + c]);
        acc = s == 0 ? v : __fadd_rn(acc, v);
    }
    y[i] = acc;
}
