// The KV cache on the device and attention over it. Each sequence's K/V mirror is one
// f16 buffer laid out [layer][k|v][cap][kv_dim]; `bases[r]` / `caps[r]` locate row r's.
// Stacked query token t belongs to row tok_row[t] at position tok_pos[t].

// Store each new token's K and V (f32 [T][kv_dim]) for `layer` as f16 into its row's
// mirror, and into `stage` ([layer][k|v][T][kv_dim]) for the copy back to the host.
// grid (T, kv_dim / 256 rounded up), block 256.
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
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < kv_dim) {
        const unsigned short kh = f2h(k[(size_t)t * kv_dim + i]);
        const unsigned short vh = f2h(v[(size_t)t * kv_dim + i]);
        kd[i] = kh;
        vd[i] = vh;
        ks[i] = kh;
        vs[i] = vh;
    }
}

// RoPE of the queries (blocks y < hq, in place) and of the keys (y - hq = KV head h),
// each rotated key pair stored as f16 with the same pair of V, into the row's mirror and
// `stage` as `kv_store` does: `rope_qk` then `kv_store` in one launch, the same values.
// grid (T, hq + hk), block: half rounded up to a warp.
extern "C" __global__ void rope_kv_store(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                                         const unsigned long long* __restrict__ bases, const int* __restrict__ caps,
                                         const int* __restrict__ tok_row, const int* __restrict__ tok_pos, int layer,
                                         int hq, int hk, int half, float theta_scale, int neox, int total,
                                         unsigned short* __restrict__ stage) {
    const int t = blockIdx.x, y = blockIdx.y, i = threadIdx.x;
    if (i >= half) return;
    const int hd = 2 * half, pos = tok_pos[t];
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    if (y < hq) {
        float* head = q + ((size_t)t * hq + y) * hd;
        rope_pair(pos, i, theta_scale, &head[ia], &head[ib]);
        return;
    }
    const int h = y - hq;
    const size_t kv_dim = (size_t)hk * hd;
    float* kh = k + (size_t)t * kv_dim + (size_t)h * hd;
    rope_pair(pos, i, theta_scale, &kh[ia], &kh[ib]);
    const float* vh = v + (size_t)t * kv_dim + (size_t)h * hd;
    const int r = tok_row[t];
    const size_t cap = (size_t)caps[r];
    unsigned short* base = (unsigned short*)bases[r];
    unsigned short* kd = base + ((size_t)layer * 2 * cap + pos) * kv_dim + (size_t)h * hd;
    unsigned short* vd = base + (((size_t)layer * 2 + 1) * cap + pos) * kv_dim + (size_t)h * hd;
    unsigned short* ks = stage + (((size_t)layer * 2) * total + t) * kv_dim + (size_t)h * hd;
    unsigned short* vs = stage + (((size_t)layer * 2 + 1) * total + t) * kv_dim + (size_t)h * hd;
    const unsigned short ka = f2h(kh[ia]), kb = f2h(kh[ib]), va = f2h(vh[ia]), vb = f2h(vh[ib]);
    kd[ia] = ka; kd[ib] = kb; ks[ia] = ka; ks[ib] = kb;
    vd[ia] = va; vd[ib] = vb; vs[ia] = va; vs[ib] = vb;
}

#define ATT_WARPS 4
#define ATT_MAX_DIM 256

// q . k for one key row: q from shared memory (f16-rounded), k as 16-byte vectors.
__device__ __forceinline__ float dot_row(const float* sq, const unsigned short* kr, int hd) {
    float s = 0.0f;
    for (int i = 0; i < hd; i += 8) {
        const uint4 v = *(const uint4*)(kr + i);
        const unsigned short h[8] = {(unsigned short)(v.x & 0xffff), (unsigned short)(v.x >> 16),
                                     (unsigned short)(v.y & 0xffff), (unsigned short)(v.y >> 16),
                                     (unsigned short)(v.z & 0xffff), (unsigned short)(v.z >> 16),
                                     (unsigned short)(v.w & 0xffff), (unsigned short)(v.w >> 16)};
#pragma unroll
        for (int e = 0; e < 8; e++) s = fmaf(sq[i + e], h2f(h[e]), s);
    }
    return s;
}

// Causal (optionally windowed) attention, one block per (query token `toks[i]`, head), with the
// CPU's arithmetic where it matters: q rounded to f16, scores q.k * scale in f32, ggml's
// exp, and each probability exp(s - max) / sum rounded to f16 before it weighs V. Keys
// go in chunks of 32, lane l scoring key chunk + l with a whole dot product; the warps
// take every ATT_WARPS-th chunk. Pass 1 finds the max and the sum (an online softmax
// per warp, merged); pass 2 recomputes the scores and sums p * V, the lanes splitting
// head_dim and each chunk's probabilities passed round the warp. head_dim is a multiple
// of 8. Decode rows (one query each) take it; longer rows `attention_tiled`.
// grid (toks, n_heads), block 32 * ATT_WARPS.
extern "C" __global__ void attention(const float* __restrict__ q, float* __restrict__ out,
                                     const unsigned long long* __restrict__ bases, const int* __restrict__ caps,
                                     const int* __restrict__ tok_row, const int* __restrict__ tok_pos,
                                     const int* __restrict__ toks, int layer, int n_heads, int n_kv, int hd,
                                     float scale, int window) {
    __shared__ float sq[ATT_MAX_DIM];
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][ATT_MAX_DIM];
    const int t = toks[blockIdx.x], h = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = tok_row[t], pos = tok_pos[t];
    const int kv_dim = n_kv * hd;
    const unsigned short* K = kv_plane(bases, caps, r, layer, 0, n_heads, n_kv, hd, h);
    const unsigned short* V = kv_plane(bases, caps, r, layer, 1, n_heads, n_kv, hd, h);
    const float* qr = q + ((size_t)t * n_heads + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) sq[i] = h2f(f2h(qr[i]));
    __syncthreads();
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;

    // Pass 1: max and sum of exp(s - max).
    float m = NEG_INF, l = 0.0f;
    for (int c = lo + 32 * warp; c <= pos; c += 32 * ATT_WARPS) {
        const int j = c + lane;
        const float s = j <= pos ? __fmul_rn(dot_row(sq, K + (size_t)j * kv_dim, hd), scale) : NEG_INF;
        const float cm = warp_max(s);
        if (cm > m) {
            l = m == NEG_INF ? 0.0f : __fmul_rn(l, ggml_expf(m - cm));
            m = cm;
        }
        l += warp_sum(j <= pos ? ggml_expf(s - m) : 0.0f);
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
    for (int c = lo + 32 * warp; c <= pos; c += 32 * ATT_WARPS) {
        const int j = c + lane;
        float p = 0.0f;
        if (j <= pos) {
            const float s = __fmul_rn(dot_row(sq, K + (size_t)j * kv_dim, hd), scale);
            p = h2f(f2h(__fmul_rn(ggml_expf(s - mx), inv)));
        }
        const int count = min(32, pos - c + 1);
        for (int kk = 0; kk < count; kk++) {
            const float pk = __shfl_sync(0xffffffffu, p, kk);
            const unsigned short* vr = V + (size_t)(c + kk) * kv_dim;
#pragma unroll
            for (int e = 0; e < ATT_MAX_DIM / 32; e++) {
                const int i = lane + 32 * e;
                if (e < per_lane && i < hd) acc[e] = fmaf(h2f(vr[i]), pk, acc[e]);
            }
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
