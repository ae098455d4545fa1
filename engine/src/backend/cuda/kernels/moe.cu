// A mixture of experts' routing and combination (`moe.rs`); the experts' matrices run in
// `gemv_id.cu`. Arithmetic as the CPU's (`kernels/moe`): an f32 router, a softmax with an
// f64 sum, the `used` largest probabilities (ties to the lower expert, then the first two
// swapped, as ggml orders them), renormalized by their f64 sum rounded once.

#define MOE_MAX_EXPERTS 512

// One block a token: warps take experts e, e + warps, ... for the router's dot products,
// then thread 0 routes. ids / weights: [tokens][used].
extern "C" __global__ void moe_route(const float* __restrict__ x, const float* __restrict__ router, int hidden,
                                     int experts, int used, int* __restrict__ ids, float* __restrict__ weights) {
    __shared__ float p[MOE_MAX_EXPERTS];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float* xr = x + (size_t)t * hidden;
    for (int e = warp; e < experts; e += warps) {
        const float* w = router + (size_t)e * hidden;
        float s = 0.0f;
        for (int i = lane; i < hidden; i += 32) s = fmaf(w[i], xr[i], s);
        s = warp_sum(s);
        if (lane == 0) p[e] = s;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    float mx = NEG_INF;
    for (int e = 0; e < experts; e++) mx = fmaxf(mx, p[e]);
    double sum = 0.0;
    for (int e = 0; e < experts; e++) {
        p[e] = expf(p[e] - mx);
        sum += (double)p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < experts; e++) p[e] = __fmul_rn(p[e], inv);
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

// y[t][i] = sum over slots s, in order, of weights[t][s] * out[t * used + s][i], each
// product rounded before its add (the CPU's order).
extern "C" __global__ void moe_sum(const float* __restrict__ out, const float* __restrict__ weights, int tokens,
                                   int used, int hidden, float* __restrict__ y) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)tokens * hidden) return;
    const size_t t = i / hidden, c = i % hidden;
    float acc = 0.0f;
    for (int s = 0; s < used; s++) {
        const float v = __fmul_rn(weights[t * used + s], out[(t * used + s) * hidden + c]);
        acc = s == 0 ? v : __fadd_rn(acc, v);
    }
    y[i] = acc;
}
