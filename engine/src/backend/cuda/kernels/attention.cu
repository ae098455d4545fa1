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

// Causal (optionally windowed) attention of one query token `toks[blockIdx.x]` and head
// blockIdx.y (decode rows: one new token each), with the CPU's arithmetic where it
// matters: q rounded to f16, scores q.k * scale in f32, ggml's exp, and each probability
// exp(s - max) / sum rounded to f16 before it weighs V.
// Pass 1: keys in chunks of 32, lane l scoring key chunk + l with a whole dot product,
// the warps taking every ATT_WARPS-th chunk; an online max and sum per warp, merged.
// Pass 2: with at most ATT_SMAX visible keys the scores were kept in shared memory:
// the probabilities are formed there once and the warps weigh V in rounds of R keys
// (warp w the w-th R of every ATT_WARPS * R), all R rows' loads issued before their
// sums. Past ATT_SMAX the scores are computed again chunk by chunk as in pass 1 and
// passed round the warp. Lanes hold D / 32 consecutive dimensions of V; the warps'
// partial sums are added in warp order. Everything a latency-bound short context waits
// on is issued in batches: a decode step's attention is one block per head.
// With `qs` given (hd a multiple of 32), the output is also quantized into the next
// matmul's Q8_0 / Q8_1 blocks of 32 (`with_sum`), by `quant32` on the same values, as
// `quantize_q8_32` would: one launch fewer a layer.
// grid (toks, n_heads), block 32 * ATT_WARPS; hd <= D, a multiple of 8.
template <int D>
__device__ __forceinline__ void attention_one(const float* __restrict__ q, float* __restrict__ out,
                                              const unsigned long long* __restrict__ bases,
                                              const int* __restrict__ caps, const int* __restrict__ tok_row,
                                              const int* __restrict__ tok_pos, const int* __restrict__ toks,
                                              int layer, int n_heads, int n_kv, int hd, float scale, int window,
                                              i8* __restrict__ qs, float* __restrict__ qd, float* __restrict__ qsum,
                                              int with_sum) {
    constexpr int PL = D / 32, R = D <= 128 ? 16 : 8;
    __shared__ __align__(16) float sq[D];
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][D];
    __shared__ float ss[ATT_SMAX];
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
    const int n = pos - lo + 1;
    const bool stored = n <= ATT_SMAX;

    // Pass 1: max and sum of exp(s - max).
    float m = NEG_INF, l = 0.0f;
    for (int c = lo + 32 * warp; c <= pos; c += 32 * ATT_WARPS) {
        const int j = c + lane;
        const float s = j <= pos ? __fmul_rn(dot_row<D>(sq, K + (size_t)j * kv_dim, hd), scale) : NEG_INF;
        if (stored && j <= pos) ss[j - lo] = s;
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
                if (active && c + u < n) v[u].load(V + (size_t)(lo + c + u) * kv_dim, lane);
#pragma unroll
            for (int u = 0; u < R; u++) {
                if (c + u >= n) break;
                const float p = ss[c + u];
#pragma unroll
                for (int e = 0; e < PL; e++) acc[e] = fmaf(v[u].at(e), p, acc[e]);
            }
        }
    } else {
        for (int c = lo + 32 * warp; c <= pos; c += 32 * ATT_WARPS) {
            const int j = c + lane;
            float p = 0.0f;
            if (j <= pos) {
                const float s = __fmul_rn(dot_row<D>(sq, K + (size_t)j * kv_dim, hd), scale);
                p = h2f(f2h(__fmul_rn(ggml_expf(s - mx), inv)));
            }
            const int count = min(32, pos - c + 1);
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
    float* o = out + ((size_t)t * n_heads + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) a += s_acc[w][i];
        o[i] = a;
    }
    if (qs) {
        const int nb = hd / 32;
        for (int b = warp; b < nb; b += ATT_WARPS) {
            const int i = b * 32 + lane;
            float a = 0.0f;
            for (int w = 0; w < ATT_WARPS; w++) a += s_acc[w][i];
            quant32(a, lane, ((size_t)t * n_heads + h) * nb + b, qs, qd, qsum, with_sum);
        }
    }
}

#define ATTENTION_ONE(D)                                                                                         \
    extern "C" __global__ void attention_##D(const float* __restrict__ q, float* __restrict__ out,              \
                                             const unsigned long long* __restrict__ bases,                      \
                                             const int* __restrict__ caps, const int* __restrict__ tok_row,     \
                                             const int* __restrict__ tok_pos, const int* __restrict__ toks,     \
                                             int layer, int n_heads, int n_kv, int hd, float scale, int window, \
                                             i8* __restrict__ qs, float* __restrict__ qd,                       \
                                             float* __restrict__ qsum, int with_sum) {                          \
        attention_one<D>(q, out, bases, caps, tok_row, tok_pos, toks, layer, n_heads, n_kv, hd, scale, window,  \
                         qs, qd, qsum, with_sum);                                                               \
    }
ATTENTION_ONE(64)
ATTENTION_ONE(128)
ATTENTION_ONE(256)

// Copy `n` rows of width `width` from x (at stacked rows src[i]) into out (row i).
extern "C" __global__ void gather_rows(const float* __restrict__ x, const int* __restrict__ src,
                                       float* __restrict__ out, int width) {
    const float* xr = x + (size_t)src[blockIdx.x] * width;
    float* o = out + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) o[i] = xr[i];
}
