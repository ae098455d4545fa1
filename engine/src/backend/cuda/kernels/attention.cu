// Attention over the KV cache on the device (its layout and writes are kv.cu's, compiled
// with this file as one program). Each sequence's K/V mirror is one f16 buffer laid out
// [layer][k|v][cap][kv_dim]; `bases[r]` / `caps[r]` locate row r's. Stacked query token t
// belongs to row tok_row[t] at position tok_pos[t].

#define ATT_WARPS 4
#define ATT_MAX_DIM 256
#define ATT_MAX_SPLITS 64
// Visible keys whose scores a block keeps in shared memory between the two passes;
// past this they are computed again in the second pass (the same values).
#define ATT_SMAX 4096

// q . k for one key row: q from shared memory (f16-rounded), k as 16-byte vectors, the
// products summed in order i = 0..hd-1. D (64, 128 or 256) is the capacity, hd <= D a
// multiple of 8; the row's loads are issued together, at most 16 at a time.
template <int D>
__device__ __forceinline__ float dot_row(const float* sq, const unsigned short* kr, int hd) {
    constexpr int G = D / 8 < 16 ? D / 8 : 16;
    float s = 0.0f;
#pragma unroll
    for (int g = 0; g < D / 8; g += G) {
        uint4 w[G];
#pragma unroll
        for (int i = 0; i < G; i++)
            if (8 * (g + i) < hd) w[i] = *(const uint4*)(kr + 8 * (g + i));
#pragma unroll
        for (int i = 0; i < G; i++) {
            if (8 * (g + i) >= hd) break;
            const u32 h[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
            const float* qq = sq + 8 * (g + i);
#pragma unroll
            for (int e = 0; e < 8; e++) s = fmaf(qq[e], h2f((unsigned short)(h[e / 2] >> (16 * (e % 2)))), s);
        }
    }
    return s;
}

// A lane's D / 32 consecutive values (from lane * D / 32) of one V row, as raw f16 pairs.
template <int D>
struct VSlice {
    u32 w[D / 64];
    __device__ __forceinline__ void load(const unsigned short* vr, int lane) {
        const unsigned short* p = vr + lane * (D / 32);
        if constexpr (D == 64) w[0] = *(const u32*)p;
        if constexpr (D == 128) { const uint2 t = *(const uint2*)p; w[0] = t.x; w[1] = t.y; }
        if constexpr (D == 256) { const uint4 t = *(const uint4*)p; w[0] = t.x; w[1] = t.y; w[2] = t.z; w[3] = t.w; }
    }
    __device__ __forceinline__ float at(int e) const { return h2f((unsigned short)(w[e / 2] >> (16 * (e % 2)))); }
};

// Split-K for long contexts: a row seeing more than ATT_SPLIT_MIN keys is attended by
// up to gridDim.z blocks a head, each over a consecutive range of at least
// ATT_SPLIT_KEYS keys; `attention_combine` merges them. The ranges depend only on the
// row's own visible keys, so a row's result never depends on its company.
#define ATT_SPLIT_KEYS 256
#define ATT_SPLIT_MIN 512

// The keys of split z of a row whose visible keys are lo..pos (n of them), for `splits`
// blocks a head: sets [*a, *b] and returns how many splits have keys (1: not split).
__device__ __forceinline__ int split_range(int lo, int pos, int splits, int z, int* a, int* b) {
    const int n = pos - lo + 1;
    if (splits <= 1 || n <= ATT_SPLIT_MIN) {
        *a = lo;
        *b = pos;
        return 1;
    }
    const int ks = max(ATT_SPLIT_KEYS, ((n + splits - 1) / splits + 31) & ~31);
    *a = lo + z * ks;
    *b = min(pos, *a + ks - 1);
    return (n + ks - 1) / ks;
}

// Store a row's output (`vals`, hd values in shared memory) and, with `qs`, quantize it
// into Q8_0 / Q8_1 blocks of 32 with `quant32` (as `quantize_q8_32` would). Call with
// the whole block after a __syncthreads that made `vals` visible.
__device__ __forceinline__ void store_out(const float* vals, float* __restrict__ o, int hd, size_t row_block,
                                          i8* __restrict__ qs, float* __restrict__ qd, float* __restrict__ qsum,
                                          int with_sum) {
    for (int i = threadIdx.x; i < hd; i += blockDim.x) o[i] = vals[i];
    if (qs) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = hd / 32;
        for (int b = warp; b < nb; b += blockDim.x >> 5) quant32(vals[b * 32 + lane], lane, row_block + b, qs, qd, qsum, with_sum);
    }
}

// Causal (optionally windowed) attention of one query token `toks[blockIdx.x]` and head
// blockIdx.y (decode rows: one new token each) over keys a..b of its row, with the CPU's
// arithmetic where it matters: q rounded to f16, scores q.k * scale in f32, ggml's exp,
// and each probability exp(s - max) / sum rounded to f16 before it weighs V (max and sum
// over the block's keys: all of the row's unless it is split; the head's sink, if any, in
// both for an unsplit row, in `attention_combine`'s for a split one).
// Pass 1: keys in chunks of 32, lane l scoring key chunk + l with a whole dot product,
// the warps taking every ATT_WARPS-th chunk; an online max and sum per warp, merged.
// Pass 2: with at most ATT_SMAX keys the scores were kept in shared memory: the
// probabilities are formed there once and the warps weigh V in rounds of R keys (warp w
// the w-th R of every ATT_WARPS * R), all R rows' loads issued before their sums. Past
// ATT_SMAX the scores are computed again chunk by chunk as in pass 1 and passed round
// the warp. Lanes hold D / 32 consecutive dimensions of V; the warps' partial sums are
// added in warp order. Everything a latency-bound short context waits on is issued in
// batches. A split block writes its normalized partial output, max and sum to `part`
// ([tok][head][split][hd + 2]) for `attention_combine`; an unsplit one writes the output
// and, with `qs` given (hd a multiple of 32), quantizes it for the next matmul.
// Rows that see more than `above` keys are left to flashdec.cu (INT_MAX: none).
// grid (toks, n_heads, splits), block 32 * ATT_WARPS; hd <= D, a multiple of 8.
template <int D>
__device__ __forceinline__ void attention_one(const float* __restrict__ q, float* __restrict__ out,
                                              const unsigned long long* __restrict__ bases,
                                              const int* __restrict__ caps, const int* __restrict__ tok_row,
                                              const int* __restrict__ tok_pos, const int* __restrict__ toks,
                                              int layer, int n_heads, int n_kv, int hd, float scale, int window,
                                              int above, const float* __restrict__ sinks, i8* __restrict__ qs,
                                              float* __restrict__ qd, float* __restrict__ qsum, int with_sum,
                                              float* __restrict__ part) {
    constexpr int PL = D / 32, R = D <= 128 ? 16 : 8;
    __shared__ __align__(16) float sq[D];
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][D];
    __shared__ float ss[ATT_SMAX];
    const int t = toks[blockIdx.x], h = blockIdx.y, z = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = tok_row[t], pos = tok_pos[t];
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    // Rows seeing more than `above` keys are flashdec.cu's.
    if (pos - lo + 1 > above) return;
    int a, b;
    const int splits = split_range(lo, pos, gridDim.z, z, &a, &b);
    if (z >= splits) return;
    const int kv_dim = n_kv * hd;
    const unsigned short* K = kv_plane(bases, caps, r, layer, 0, n_heads, n_kv, hd, h);
    const unsigned short* V = kv_plane(bases, caps, r, layer, 1, n_heads, n_kv, hd, h);
    const float* qr = q + ((size_t)t * n_heads + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) sq[i] = h2f(f2h(qr[i]));
    __syncthreads();
    const int n = b - a + 1;
    const bool stored = n <= ATT_SMAX;

    // Pass 1: max and sum of exp(s - max).
    float m = NEG_INF, l = 0.0f;
    for (int c = a + 32 * warp; c <= b; c += 32 * ATT_WARPS) {
        const int j = c + lane;
        const float s = j <= b ? __fmul_rn(dot_row<D>(sq, K + (size_t)j * kv_dim, hd), scale) : NEG_INF;
        if (stored && j <= b) ss[j - a] = s;
        const float cm = warp_max(s);
        if (cm > m) {
            l = m == NEG_INF ? 0.0f : __fmul_rn(l, ggml_expf(m - cm));
            m = cm;
        }
        l += warp_sum(j <= b ? ggml_expf(s - m) : 0.0f);
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, s_m[w]);
    // The head's sink in the maximum and the sum, once per row: a split row's
    // `attention_combine` takes it.
    const bool sink = sinks && splits == 1;
    if (sink) mx = sink_max(mx, sinks[h]);
    double total = 0.0;
    for (int w = 0; w < ATT_WARPS; w++)
        if (s_m[w] != NEG_INF) total += (double)s_l[w] * (double)ggml_expf(s_m[w] - mx);
    if (sink) total += (double)expf(sinks[h] - mx);
    const float inv = (float)(1.0 / total);

    // Pass 2: probabilities rounded to f16, weighted sum of V.
    const bool active = lane * PL < hd;
    float acc[PL];
#pragma unroll
    for (int e = 0; e < PL; e++) acc[e] = 0.0f;
    if (stored) {
        for (int j = threadIdx.x; j < n; j += blockDim.x) ss[j] = h2f(f2h(__fmul_rn(ggml_expf(ss[j] - mx), inv)));
        __syncthreads();
        for (int c = R * warp; c < n; c += R * ATT_WARPS) {
            VSlice<D> v[R];
#pragma unroll
            for (int u = 0; u < R; u++)
                if (active && c + u < n) v[u].load(V + (size_t)(a + c + u) * kv_dim, lane);
#pragma unroll
            for (int u = 0; u < R; u++) {
                if (c + u >= n) break;
                const float p = ss[c + u];
#pragma unroll
                for (int e = 0; e < PL; e++) acc[e] = fmaf(v[u].at(e), p, acc[e]);
            }
        }
    } else {
        for (int c = a + 32 * warp; c <= b; c += 32 * ATT_WARPS) {
            const int j = c + lane;
            float p = 0.0f;
            if (j <= b) {
                const float s = __fmul_rn(dot_row<D>(sq, K + (size_t)j * kv_dim, hd), scale);
                p = h2f(f2h(__fmul_rn(ggml_expf(s - mx), inv)));
            }
            const int count = min(32, b - c + 1);
            for (int k0 = 0; k0 < count; k0 += 8) {
                VSlice<D> v[8];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (active && k0 + u < count) v[u].load(V + (size_t)(c + k0 + u) * kv_dim, lane);
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const float pk = __shfl_sync(0xffffffffu, p, (k0 + u) & 31);
                    if (k0 + u < count) {
#pragma unroll
                        for (int e = 0; e < PL; e++) acc[e] = fmaf(v[u].at(e), pk, acc[e]);
                    }
                }
            }
        }
    }
    if (active) {
#pragma unroll
        for (int e = 0; e < PL; e++) s_acc[warp][lane * PL + e] = acc[e];
    }
    __syncthreads();
    // q is no longer needed: sq holds the block's output.
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) v += s_acc[w][i];
        sq[i] = v;
    }
    __syncthreads();
    const size_t row = (size_t)t * n_heads + h;
    if (splits > 1) {
        float* pz = part + (row * gridDim.z + z) * (size_t)(hd + 2);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) pz[i] = sq[i];
        if (threadIdx.x == 0) {
            pz[hd] = mx;
            pz[hd + 1] = (float)total;
        }
        return;
    }
    store_out(sq, out + row * hd, hd, row * (hd / 32), qs, qd, qsum, with_sum);
}

#define ATTENTION_ONE(D)                                                                                         \
    extern "C" __global__ void attention_##D(const float* __restrict__ q, float* __restrict__ out,              \
                                             const unsigned long long* __restrict__ bases,                      \
                                             const int* __restrict__ caps, const int* __restrict__ tok_row,     \
                                             const int* __restrict__ tok_pos, const int* __restrict__ toks,     \
                                             int layer, int n_heads, int n_kv, int hd, float scale, int window, \
                                             int above, const float* __restrict__ sinks, i8* __restrict__ qs,   \
                                             float* __restrict__ qd, float* __restrict__ qsum, int with_sum,    \
                                             float* __restrict__ part) {                                        \
        attention_one<D>(q, out, bases, caps, tok_row, tok_pos, toks, layer, n_heads, n_kv, hd, scale, window,  \
                         above, sinks, qs, qd, qsum, with_sum, part);                                           \
    }
ATTENTION_ONE(64)
ATTENTION_ONE(128)
ATTENTION_ONE(256)

// The splits of each split row (`attention_*` with gridDim.z = splits) merged: with the
// global max M and sum L = sum_z l_z exp(m_z - M) (f64, in split order), output =
// sum_z (l_z exp(m_z - M) / L) * o_z in split order, then stored (and quantized) as an
// unsplit row's; a head's sink joins M and L here (`sink_max`, + exp(sink - M)). Rows
// that were not split were written by the attention kernel itself.
// grid (toks, n_heads), block 128.
extern "C" __global__ void attention_combine(float* __restrict__ out, const int* __restrict__ tok_pos,
                                             const int* __restrict__ toks, int n_heads, int hd, int window,
                                             const float* __restrict__ sinks, int splits,
                                             const float* __restrict__ part, i8* __restrict__ qs,
                                             float* __restrict__ qd, float* __restrict__ qsum, int with_sum) {
    __shared__ float vals[ATT_MAX_DIM];
    __shared__ float wz[ATT_MAX_SPLITS];
    const int t = toks[blockIdx.x], h = blockIdx.y, pos = tok_pos[t];
    int a, b;
    const int used = split_range(window > 0 ? max(0, pos - window + 1) : 0, pos, splits, 0, &a, &b);
    if (used <= 1) return;
    const size_t row = (size_t)t * n_heads + h;
    const float* pr = part + row * splits * (size_t)(hd + 2);
    if (threadIdx.x == 0) {
        float mx = NEG_INF;
        for (int z = 0; z < used; z++) mx = fmaxf(mx, pr[z * (hd + 2) + hd]);
        if (sinks) mx = sink_max(mx, sinks[h]);
        double total = 0.0;
        for (int z = 0; z < used; z++) total += (double)pr[z * (hd + 2) + hd + 1] * (double)ggml_expf(pr[z * (hd + 2) + hd] - mx);
        if (sinks) total += (double)expf(sinks[h] - mx);
        for (int z = 0; z < used; z++)
            wz[z] = (float)((double)pr[z * (hd + 2) + hd + 1] * (double)ggml_expf(pr[z * (hd + 2) + hd] - mx) / total);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = 0.0f;
        for (int z = 0; z < used; z++) v = fmaf(wz[z], pr[z * (hd + 2) + i], v);
        vals[i] = v;
    }
    __syncthreads();
    store_out(vals, out + row * hd, hd, row * (hd / 32), qs, qd, qsum, with_sum);
}
