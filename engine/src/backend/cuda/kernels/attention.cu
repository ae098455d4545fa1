// The KV cache on the device and attention over it. Each sequence's K/V mirror is one
// f16 buffer laid out [layer][k|v][cap][kv_dim]; `bases[r]` / `caps[r]` locate row r's.
// Stacked query token t belongs to row tok_row[t] at position tok_pos[t].

// Store each new token's K and V (f32 [T][kv_dim]) for `layer` as f16 into its row's
// mirror, and into `stage` ([layer][k|v][T][kv_dim]) for the copy back to the host.
// grid (T), block 256.
extern "C" __global__ void kv_store(const float* __restrict__ k, const float* __restrict__ v,
                                    const unsigned long long* __restrict__ bases, const int* __restrict__ caps,
                                    const int* __restrict__ tok_row, const int* __restrict__ tok_pos, int layer,
                                    int kv_dim, int total, unsigned short* __restrict__ stage) {
    const int t = blockIdx.x;
    const int r = tok_row[t];
    const size_t cap = (size_t)caps[r];
    unsigned short* base = (unsigned short*)bases[r];
    unsigned short* kd = base + ((size_t)layer * 2 * cap + tok_pos[t]) * kv_dim;
    unsigned short* vd = base + (((size_t)layer * 2 + 1) * cap + tok_pos[t]) * kv_dim;
    unsigned short* ks = stage + (((size_t)layer * 2) * total + t) * kv_dim;
    unsigned short* vs = stage + (((size_t)layer * 2 + 1) * total + t) * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        const unsigned short kh = f2h(k[(size_t)t * kv_dim + i]);
        const unsigned short vh = f2h(v[(size_t)t * kv_dim + i]);
        kd[i] = kh;
        vd[i] = vh;
        ks[i] = kh;
        vs[i] = vh;
    }
}

#define NEG_INF __int_as_float(0xff800000)
#define ATT_WARPS 4
#define ATT_MAX_DIM 256

// Causal (optionally windowed) attention, one block per (query token, head), with the
// CPU's arithmetic where it matters: q rounded to f16, scores q.k * scale in f32, ggml's
// exp, and each probability exp(s - max) / sum rounded to f16 before it weighs V. The
// first pass finds the max and the sum (each warp an online softmax over every
// ATT_WARPS-th visible key, merged); the second recomputes the scores and sums p * V.
// Lanes split head_dim. grid (T, n_heads), block 32 * ATT_WARPS.
extern "C" __global__ void attention(const float* __restrict__ q, float* __restrict__ out,
                                     const unsigned long long* __restrict__ bases, const int* __restrict__ caps,
                                     const int* __restrict__ tok_row, const int* __restrict__ tok_pos, int layer,
                                     int n_heads, int n_kv, int hd, float scale, int window) {
    __shared__ float sq[ATT_MAX_DIM];
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][ATT_MAX_DIM];
    const int t = blockIdx.x, h = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = tok_row[t], pos = tok_pos[t];
    const size_t cap = (size_t)caps[r];
    const int kv_dim = n_kv * hd;
    const int kvh = h / (n_heads / n_kv);
    const unsigned short* base = (const unsigned short*)bases[r];
    const unsigned short* K = base + (size_t)layer * 2 * cap * kv_dim + (size_t)kvh * hd;
    const unsigned short* V = base + ((size_t)layer * 2 + 1) * cap * kv_dim + (size_t)kvh * hd;
    const float* qr = q + ((size_t)t * n_heads + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) sq[i] = h2f(f2h(qr[i]));
    __syncthreads();
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;

    // Pass 1: max and sum of exp(s - max).
    float m = NEG_INF, l = 0.0f;
    for (int j = lo + warp; j <= pos; j += ATT_WARPS) {
        const unsigned short* kr = K + (size_t)j * kv_dim;
        float s = 0.0f;
        for (int i = lane; i < hd; i += 32) s = fmaf(sq[i], h2f(kr[i]), s);
        s = __fmul_rn(warp_sum(s), scale);
        if (s > m) {
            l = m == NEG_INF ? 0.0f : __fmul_rn(l, ggml_expf(m - s));
            m = s;
        }
        l += ggml_expf(s - m);
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, s_m[w]);
    double total = 0.0;
    for (int w = 0; w < ATT_WARPS; w++)
        if (s_m[w] != NEG_INF) total += (double)s_l[w] * (double)ggml_expf(s_m[w] - mx);
    const float inv = (float)(1.0 / total);

    // Pass 2: probabilities rounded to f16, weighted sum of V.
    const int per_lane = (hd + 31) / 32;
    float acc[ATT_MAX_DIM / 32];
#pragma unroll
    for (int c = 0; c < ATT_MAX_DIM / 32; c++) acc[c] = 0.0f;
    for (int j = lo + warp; j <= pos; j += ATT_WARPS) {
        const unsigned short* kr = K + (size_t)j * kv_dim;
        float s = 0.0f;
        for (int i = lane; i < hd; i += 32) s = fmaf(sq[i], h2f(kr[i]), s);
        s = __fmul_rn(warp_sum(s), scale);
        const float p = h2f(f2h(__fmul_rn(ggml_expf(s - mx), inv)));
        const unsigned short* vr = V + (size_t)j * kv_dim;
#pragma unroll
        for (int c = 0; c < ATT_MAX_DIM / 32; c++) {
            const int i = lane + 32 * c;
            if (c < per_lane && i < hd) acc[c] = fmaf(h2f(vr[i]), p, acc[c]);
        }
    }
#pragma unroll
    for (int c = 0; c < ATT_MAX_DIM / 32; c++) {
        const int i = lane + 32 * c;
        if (c < per_lane && i < hd) s_acc[warp][i] = acc[c];
    }
    __syncthreads();
    float* o = out + ((size_t)t * n_heads + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) a += s_acc[w][i];
        o[i] = a;
    }
}

// Copy `n` rows of width `width` from x (at stacked rows src[i]) into out (row i).
extern "C" __global__ void gather_rows(const float* __restrict__ x, const int* __restrict__ src,
                                       float* __restrict__ out, int width) {
    const float* xr = x + (size_t)src[blockIdx.x] * width;
    float* o = out + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) o[i] = xr[i];
}
