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

#define NEG_INF __int_as_float(0xff800000)
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

// Prefill attention in tiles: one block per (query tile, head), a tile being up to QT
// consecutive query tokens of one row (`tiles`: pairs of first stacked token, count).
// Keys go through shared memory in tiles of 32 at absolute positions (32-aligned), so a
// query's arithmetic does not depend on which queries share its tile. Per query, as the
// one-query kernel: q rounded to f16, each score a sequential f32 dot times `scale`;
// pass 1 finds the max and the sum of exp(s - max) (online, key tile by key tile);
// pass 2 recomputes the scores, rounds each exp(s - max) / sum to f16 and sums p * V
// key by key. Shared memory holds Q, K and V as f32 (converted once per tile), K rows
// padded by 4 floats so the lanes' 16-byte reads of 32 rows do not collide.
// Scores: warp w takes queries w, w + 4, ..., lane l key l of the tile.
// p * V: a thread takes dims (tid % TD) + TD * e and queries tid / TD + QSTEP * i.
// head_dim a multiple of 8, at most the kernel's (below).
#define KT 32

template <int QT, int QSTEP, int DPT>
__device__ __forceinline__ void attention_tiled(const float* __restrict__ q, float* __restrict__ out,
                                                const unsigned long long* __restrict__ bases,
                                                const int* __restrict__ caps, const int* __restrict__ tok_row,
                                                const int* __restrict__ tok_pos, const int* __restrict__ tiles,
                                                int layer, int n_heads, int n_kv, int hd, float scale, int window) {
    constexpr int TD = 128 / QSTEP;   // threads per query group in p * V
    constexpr int QW = QT / 4;        // queries per warp in the scores
    constexpr int QV = QT / QSTEP;    // queries per thread in p * V
    extern __shared__ __align__(16) float smem[];
    const int ks = hd + 4;            // floats per K row in shared memory
    float* sQ = smem;                 // [QT][hd]
    float* sK = sQ + QT * hd;         // [KT][ks]
    float* sV = sK + KT * ks;         // [KT][hd]
    float* sP = sV + KT * hd;         // [QT][KT]

    const int t0 = tiles[2 * blockIdx.x], count = tiles[2 * blockIdx.x + 1];
    const int h = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int r = tok_row[t0], p0 = tok_pos[t0], plast = p0 + count - 1;
    const size_t cap = (size_t)caps[r];
    const int kv_dim = n_kv * hd;
    const int kvh = h / (n_heads / n_kv);
    const unsigned short* base = (const unsigned short*)bases[r];
    const unsigned short* K = base + (size_t)layer * 2 * cap * kv_dim + (size_t)kvh * hd;
    const unsigned short* V = base + ((size_t)layer * 2 + 1) * cap * kv_dim + (size_t)kvh * hd;

    for (int i = tid; i < QT * hd; i += blockDim.x) {
        const int qi = i / hd, d = i - qi * hd;
        sQ[i] = qi < count ? h2f(f2h(q[((size_t)(t0 + qi) * n_heads + h) * hd + d])) : 0.0f;
    }
    const int lo = window > 0 ? max(0, p0 - window + 1) : 0;
    const int k_first = lo & ~(KT - 1);
    const int v8 = hd / 8;

    // Keys kt..kt+KT-1 of K (and V) into shared memory as f32; keys past plast are zeros.
    auto load = [&](int kt, bool with_v) {
        for (int i = tid; i < KT * v8; i += blockDim.x) {
            const int j = i / v8, c = (i - j * v8) * 8;
            uint4 k4 = make_uint4(0, 0, 0, 0), v4 = make_uint4(0, 0, 0, 0);
            if (kt + j <= plast) {
                k4 = *(const uint4*)(K + (size_t)(kt + j) * kv_dim + c);
                if (with_v) v4 = *(const uint4*)(V + (size_t)(kt + j) * kv_dim + c);
            }
            const unsigned int kw[4] = {k4.x, k4.y, k4.z, k4.w}, vw[4] = {v4.x, v4.y, v4.z, v4.w};
            float* kd = sK + j * ks + c;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                kd[2 * e] = h2f((unsigned short)(kw[e] & 0xffff));
                kd[2 * e + 1] = h2f((unsigned short)(kw[e] >> 16));
            }
            if (with_v) {
                float* vd = sV + j * hd + c;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    vd[2 * e] = h2f((unsigned short)(vw[e] & 0xffff));
                    vd[2 * e + 1] = h2f((unsigned short)(vw[e] >> 16));
                }
            }
        }
    };
    // This lane's scores against key kt + lane for queries warp + 4 * i.
    auto scores = [&](int kt, float (&s)[QW]) {
#pragma unroll
        for (int i = 0; i < QW; i++) s[i] = 0.0f;
        const float* kr = sK + lane * ks;
        for (int c = 0; c < hd; c += 4) {
            const float4 k4 = *(const float4*)(kr + c);
#pragma unroll
            for (int i = 0; i < QW; i++) {
                const float4 q4 = *(const float4*)(sQ + (warp + 4 * i) * hd + c);
                s[i] = fmaf(q4.x, k4.x, s[i]);
                s[i] = fmaf(q4.y, k4.y, s[i]);
                s[i] = fmaf(q4.z, k4.z, s[i]);
                s[i] = fmaf(q4.w, k4.w, s[i]);
            }
        }
        const int j = kt + lane;
#pragma unroll
        for (int i = 0; i < QW; i++) {
            const int qi = warp + 4 * i, pos = p0 + qi;
            const bool ok = qi < count && j <= pos && (window <= 0 || j > pos - window);
            s[i] = ok ? __fmul_rn(s[i], scale) : NEG_INF;
        }
    };

    // Pass 1: max and sum of exp(s - max) per query.
    float m[QW], l[QW];
#pragma unroll
    for (int i = 0; i < QW; i++) {
        m[i] = NEG_INF;
        l[i] = 0.0f;
    }
    for (int kt = k_first; kt <= plast; kt += KT) {
        __syncthreads();
        load(kt, false);
        __syncthreads();
        float s[QW];
        scores(kt, s);
#pragma unroll
        for (int i = 0; i < QW; i++) {
            const float cm = warp_max(s[i]);
            if (cm == NEG_INF) continue;
            if (cm > m[i]) {
                l[i] = m[i] == NEG_INF ? 0.0f : __fmul_rn(l[i], ggml_expf(m[i] - cm));
                m[i] = cm;
            }
            l[i] += warp_sum(s[i] == NEG_INF ? 0.0f : ggml_expf(s[i] - m[i]));
        }
    }
    float inv[QW];
#pragma unroll
    for (int i = 0; i < QW; i++) inv[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;

    // Pass 2: probabilities rounded to f16, weighted sums of V key by key.
    float acc[QV][DPT];
#pragma unroll
    for (int i = 0; i < QV; i++)
#pragma unroll
        for (int e = 0; e < DPT; e++) acc[i][e] = 0.0f;
    const int dq = tid / TD, dd = tid % TD;
    for (int kt = k_first; kt <= plast; kt += KT) {
        __syncthreads();
        load(kt, true);
        __syncthreads();
        float s[QW];
        scores(kt, s);
#pragma unroll
        for (int i = 0; i < QW; i++) {
            const float p = s[i] == NEG_INF ? 0.0f : h2f(f2h(__fmul_rn(ggml_expf(s[i] - m[i]), inv[i])));
            sP[(warp + 4 * i) * KT + lane] = p;
        }
        __syncthreads();
        // Keys past plast have p = 0 and V = 0: all KT go through, four at a time.
        for (int j = 0; j < KT; j += 4) {
            float vf[4][DPT];
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
#pragma unroll
                for (int e = 0; e < DPT; e++) {
                    const int d = dd + TD * e;
                    vf[jj][e] = d < hd ? sV[(j + jj) * hd + d] : 0.0f;
                }
#pragma unroll
            for (int i = 0; i < QV; i++) {
                const float4 p4 = *(const float4*)(sP + (dq + QSTEP * i) * KT + j);
                const float p[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int jj = 0; jj < 4; jj++)
#pragma unroll
                    for (int e = 0; e < DPT; e++) acc[i][e] = fmaf(vf[jj][e], p[jj], acc[i][e]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < QV; i++) {
        const int qi = dq + QSTEP * i;
        if (qi >= count) continue;
        float* o = out + ((size_t)(t0 + qi) * n_heads + h) * hd;
#pragma unroll
        for (int e = 0; e < DPT; e++) {
            const int d = dd + TD * e;
            if (d < hd) o[d] = acc[i][e];
        }
    }
}

// The three shapes of `attention_tiled`, by head_dim: up to 64 (32 queries a tile, two
// query groups of 64 threads), up to 128 (32 queries), up to 256 (16 queries, two dims a
// thread); `tiled_queries` and `tiled_smem` in kv.rs mirror this. grid (tiles, n_heads),
// block 128.
#define TILED_KERNEL(NAME, QT, QSTEP, DPT)                                                                      \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                                     \
        const float* __restrict__ q, float* __restrict__ out, const unsigned long long* __restrict__ bases,    \
        const int* __restrict__ caps, const int* __restrict__ tok_row, const int* __restrict__ tok_pos,        \
        const int* __restrict__ tiles, int layer, int n_heads, int n_kv, int hd, float scale, int window) {     \
        attention_tiled<QT, QSTEP, DPT>(q, out, bases, caps, tok_row, tok_pos, tiles, layer, n_heads, n_kv, hd, \
                                        scale, window);                                                         \
    }
TILED_KERNEL(attention_tiled_64, 32, 2, 1)
TILED_KERNEL(attention_tiled_128, 32, 1, 1)
TILED_KERNEL(attention_tiled_256, 16, 1, 2)
