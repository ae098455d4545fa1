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

// The router's logits, `[tokens][experts]`: grid (tokens, experts / 8 rounded up), four
// warps a block, each half-warp one expert (`hidden` a multiple of 16; its 16 lanes the
// tinyBLAS lanes, each a sequential FMA chain), so a decode step's routing is spread over
// the SMs instead of one block. `bias`: the router's, or null.
extern "C" __global__ void moe_logits(const float* __restrict__ x, const float* __restrict__ router,
                                      const float* __restrict__ bias, int hidden, int experts,
                                      float* __restrict__ logits) {
    const int t = blockIdx.x, lane = threadIdx.x & 31, half = lane >> 4, l = lane & 15;
    const int e = blockIdx.y * 8 + (threadIdx.x >> 5) * 2 + half;
    const float* xr = x + (size_t)t * hidden;
    float s = 0.0f;
    if (e < experts) {
        const float* w = router + (size_t)e * hidden;
#pragma unroll 8
        for (int i = l; i < hidden; i += 16) s = fmaf(w[i], xr[i], s);
    }
    // Within each half, lane i < 8 adds lane i + 8's chain, then i < 4 the next half, and
    // so on: lane 0 (16) ends with (t6[0] + t6[2]) + (t6[1] + t6[3]) of its own half,
    // GCC's `_mm512_reduce_add_ps`.
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s = s + __shfl_down_sync(0xffffffffu, s, o);
    if (l == 0 && e < experts) logits[(size_t)t * experts + e] = bias ? __fadd_rn(s, bias[e]) : s;
}

// The larger of two candidates (value, expert), ties to the lower expert; a candidate
// of expert -1 is none.
__device__ __forceinline__ void moe_better(float* v, int* e, float ov, int oe) {
    if (oe >= 0 && (*e < 0 || ov > *v || (ov == *v && oe < *e))) {
        *v = ov;
        *e = oe;
    }
}

// Each token's `used` experts and their weights from its logits: one warp a token.
// qwen3moe chooses by probability (`moe_softmax`'s arithmetic, its exps and sums spread
// over the lanes in the same order), gpt-oss by logit. ids / weights: [tokens][used].
extern "C" __global__ void moe_pick(const float* __restrict__ logits, int experts, int used, int kind,
                                    int* __restrict__ ids, float* __restrict__ weights) {
    __shared__ float p[MOE_MAX_EXPERTS];
    __shared__ double chunk_sum[MOE_MAX_EXPERTS / 16];
    __shared__ u32 taken[MOE_MAX_EXPERTS / 32];
    __shared__ int chosen[MOE_MAX_EXPERTS];
    const int t = blockIdx.x, lane = threadIdx.x;
    float mx = NEG_INF;
    for (int e = lane; e < experts; e += 32) {
        p[e] = logits[(size_t)t * experts + e];
        mx = fmaxf(mx, p[e]);
    }
    for (int w = lane; w < MOE_MAX_EXPERTS / 32; w += 32) taken[w] = 0;
    __syncwarp();
    if (kind == 0) {  // moe_softmax(p, experts), its serial sums kept in order
        mx = warp_max(mx);
        const int whole = experts / 16 * 16;
        for (int e = lane; e < experts; e += 32) p[e] = e < whole ? ggml_expf(p[e] - mx) : expf(p[e] - mx);
        __syncwarp();
        for (int c = lane; c < whole / 16; c += 32) {
            const float* q = p + 16 * c;
            float t3[8];
            for (int i = 0; i < 8; i++) t3[i] = q[i + 8] + q[i];
            const float t6[4] = {t3[4] + t3[0], t3[5] + t3[1], t3[6] + t3[2], t3[7] + t3[3]};
            chunk_sum[c] = (double)((t6[0] + t6[2]) + (t6[1] + t6[3]));
        }
        __syncwarp();
        double sum = 0.0;
        for (int c = 0; c < whole / 16; c++) sum += chunk_sum[c];
        for (int e = whole; e < experts; e++) sum += (double)p[e];
        const float inv = (float)(1.0 / sum);
        __syncwarp();
        for (int e = lane; e < experts; e += 32) p[e] = __fmul_rn(p[e], inv);
        __syncwarp();
    }
    for (int s = 0; s < used; s++) {
        float bv = 0.0f;
        int be = -1;
        for (int e = lane; e < experts; e += 32)
            if (!((taken[e >> 5] >> (e & 31)) & 1u)) moe_better(&bv, &be, p[e], e);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            moe_better(&bv, &be, ov, oe);
        }
        if (lane == 0) {
            taken[be >> 5] |= 1u << (be & 31);
            chosen[s] = be;
        }
        __syncwarp();
    }
    if (lane != 0) return;
    int* id = ids + (size_t)t * used;
    float* wt = weights + (size_t)t * used;
    for (int s = 0; s < used; s++) id[s] = chosen[s];
    if (kind == 1) {
        for (int s = 0; s < used; s++) wt[s] = p[id[s]];
        moe_softmax(wt, used);
        return;
    }
    if (used > 1) {
        id[0] = chosen[1];
        id[1] = chosen[0];
    }
    double total = 0.0;
    for (int s = 0; s < used; s++) total += (double)p[id[s]];
    const float tot = (float)total;
    for (int s = 0; s < used; s++) wt[s] = __fdiv_rn(p[id[s]], tot);
}

// An exclusive prefix sum over the block (blockDim.x a multiple of 32, at most 1024) of
// one value a thread; `total` gets the sum. `scratch`: 32 ints of shared memory.
__device__ __forceinline__ int block_scan(int v, int* scratch, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    if (lane == 31) scratch[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int w = lane < warps ? scratch[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += u;
        }
        if (lane < warps) scratch[lane] = w;
    }
    __syncthreads();
    const int before = (warp > 0 ? scratch[warp - 1] : 0) + inc - v;
    *total = scratch[warps - 1];
    __syncthreads();
    return before;
}

// The (token, slot) pairs sorted by expert, for the grouped GEMV (`gemv_id.cu`): one
// block of MOE_SORT_THREADS, pairs in order within an expert. pos[p]: pair p's row in the
// sorted order; sorted[i]: the pair at row i; chunks: [expert, first row, rows <= 8] per
// chunk in expert order, every slot past the last chunk zeroed (`max_chunks` slots).
// Counts by shared atomics; each thread owns experts 2 tid and 2 tid + 1 (experts <=
// 2 * MOE_SORT_THREADS) for the prefix sums, its chunks and its pairs' places (scanning
// the pairs in order keeps them stable).
#define MOE_SORT_THREADS 256
extern "C" __global__ void __launch_bounds__(MOE_SORT_THREADS)
    moe_sort(const int* __restrict__ ids, int pairs, int experts, int max_chunks, int* __restrict__ pos,
             int* __restrict__ sorted, int* __restrict__ chunks) {
    __shared__ int count[2 * MOE_SORT_THREADS];
    __shared__ int scratch[32];
    __shared__ int ids_tile[1024];
    const int tid = threadIdx.x, e0 = 2 * tid, e1 = e0 + 1;
    count[e0] = 0;
    count[e1] = 0;
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    const int c0 = count[e0], c1 = count[e1];
    int rows_total, chunks_total;
    int row = block_scan(c0 + c1, scratch, &rows_total);
    int chunk = block_scan((c0 + 7) / 8 + (c1 + 7) / 8, scratch, &chunks_total);
    int start[2] = {row, row + c0};
    for (int k = 0; k < 2; k++) {
        const int e = e0 + k, n = k ? c1 : c0;
        for (int r = 0; r < n; r += 8, chunk++) {
            chunks[3 * chunk] = e;
            chunks[3 * chunk + 1] = start[k] + r;
            chunks[3 * chunk + 2] = min(8, n - r);
        }
    }
    for (int c = chunks_total + tid; c < max_chunks; c += blockDim.x) chunks[3 * c] = chunks[3 * c + 1] = chunks[3 * c + 2] = 0;
    for (int base = 0; base < pairs; base += 1024) {
        const int n = min(1024, pairs - base);
        __syncthreads();
        for (int i = tid; i < n; i += blockDim.x) ids_tile[i] = ids[base + i];
        __syncthreads();
        if (c0 + c1 == 0) continue;
        for (int i = 0; i < n; i++) {
            const int e = ids_tile[i];
            if ((e >> 1) != tid) continue;
            const int at = start[e & 1]++;
            pos[base + i] = at;
            sorted[at] = base + i;
        }
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
