// Attention of rows with several new tokens (prefill) over the device KV mirror (see
// attention.cu for the layout): a SIMT kernel in tiles for any head_dim, and one on the
// tensor cores for head_dim 64 and 128.

// Prefill attention in tiles: one block per (query tile, head), a tile being up to QT
// consecutive query tokens of one row (`tiles`: pairs of first stacked token, count).
// Keys go through shared memory in tiles of 32 at absolute positions (32-aligned), so a
// query's arithmetic does not depend on which queries share its tile. Per query, as the
// one-query kernel: q rounded to f16, each score a sequential f32 dot times `scale`;
// pass 1 finds the max and the sum of exp(s - max) (online, key tile by key tile; then
// the head's sink, if any, taken in: `add_sink`);
// pass 2 recomputes the scores, rounds each exp(s - max) / sum to f16 and sums p * V
// key by key. Shared memory holds Q, K and V as f32 (converted once per tile), K rows
// padded by 4 floats so the lanes' 16-byte reads of 32 rows do not collide.
// Scores: warp w takes queries w, w + 4, ..., lane l key l of the tile.
// p * V: a thread takes dims (tid % TD) + TD * e and queries tid / TD + QSTEP * i.
// head_dim a multiple of 8, at most the kernel's (below).
#define KT 32

// A query's max `m` and sum `l` of exp(s - m) with its head's sink taken in, as the
// one-query kernel does (`sink_max`, then + exp(sink - max), libm's exp).
__device__ __forceinline__ void add_sink(float sink, float* m, float* l) {
    const float mn = sink_max(*m, sink);
    const float kept = *m == NEG_INF ? 0.0f : __fmul_rn(*l, ggml_expf(*m - mn));
    *l = __fadd_rn(kept, expf(sink - mn));
    *m = mn;
}

template <int QT, int QSTEP, int DPT>
__device__ __forceinline__ void attention_tiled(const float* __restrict__ q, float* __restrict__ out,
                                                const unsigned long long* __restrict__ bases,
                                                const int* __restrict__ caps, const int* __restrict__ tok_row,
                                                const int* __restrict__ tok_pos, const int* __restrict__ tiles,
                                                int layer, int n_heads, int n_kv, int hd, float scale, int window,
                                                const float* __restrict__ sinks) {
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
    const int kv_dim = n_kv * hd;
    const unsigned short* K = kv_plane(bases, caps, r, layer, 0, n_heads, n_kv, hd, h);
    const unsigned short* V = kv_plane(bases, caps, r, layer, 1, n_heads, n_kv, hd, h);

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
    if (sinks) {
#pragma unroll
        for (int i = 0; i < QW; i++) add_sink(sinks[h], &m[i], &l[i]);
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
        const int* __restrict__ tiles, int layer, int n_heads, int n_kv, int hd, float scale, int window,       \
        const float* __restrict__ sinks) {                                                                      \
        attention_tiled<QT, QSTEP, DPT>(q, out, bases, caps, tok_row, tok_pos, tiles, layer, n_heads, n_kv, hd, \
                                        scale, window, sinks);                                                  \
    }
TILED_KERNEL(attention_tiled_64, 32, 2, 1)
TILED_KERNEL(attention_tiled_128, 32, 1, 1)
TILED_KERNEL(attention_tiled_256, 16, 1, 2)

// Prefill attention on the tensor cores, for head_dim 64 and 128: one block of 4 warps
// per (tile of 64 consecutive query tokens of one row, head), each warp 16 query rows.
// The same two passes as `attention_tiled` (max and sum, then the probabilities rounded
// to f16 weigh V), over key tiles of 64 at absolute 64-aligned positions; Q·Kᵀ and P·V
// are f16 `mma.sync` m16n8k16 summing in f32 (q and p are rounded to f16 exactly as the
// other kernels round them; the dot products' order of additions is the tensor core's).
// K stays [key][dim] in shared memory, V is stored transposed ([dim][key]) so both B
// operands are 32-bit loads; rows padded by 8 halves so a fragment's 32 loads hit 32
// banks. Fragment layouts (PTX ISA, m16n8k16 .f16; g = lane / 4, c = lane % 4):
//   A: a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g, 2c+8..), a3 = (g+8, 2c+8..)
//   B: b0 = (k 2c..2c+1, n g), b1 = (k 2c+8.., n g);  C: (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)
// grid (tiles, n_heads), block 128.
#define FA_KT 64

template <int HD>
__device__ __forceinline__ void attention_mma(const float* __restrict__ q, float* __restrict__ out,
                                              const unsigned long long* __restrict__ bases,
                                              const int* __restrict__ caps, const int* __restrict__ tok_row,
                                              const int* __restrict__ tok_pos, const int* __restrict__ tiles,
                                              int layer, int n_heads, int n_kv, float scale, int window,
                                              const float* __restrict__ sinks) {
    constexpr int KS = HD / 16;       // k-steps of Q·Kᵀ over head_dim
    constexpr int NT = FA_KT / 8;     // n-tiles of a score tile
    constexpr int DT = HD / 8;        // n-tiles of the output
    constexpr int KP = HD + 8;        // halves per K row in shared memory
    constexpr int VP = FA_KT + 8;     // halves per row of Vᵀ
    __shared__ __align__(16) unsigned short sK[FA_KT * KP];
    __shared__ __align__(16) unsigned short sVt[HD * VP];

    const int t0 = tiles[2 * blockIdx.x], count = tiles[2 * blockIdx.x + 1];
    const int h = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const int r = tok_row[t0], p0 = tok_pos[t0], plast = p0 + count - 1;
    const int kv_dim = n_kv * HD;
    const unsigned short* K = kv_plane(bases, caps, r, layer, 0, n_heads, n_kv, HD, h);
    const unsigned short* V = kv_plane(bases, caps, r, layer, 1, n_heads, n_kv, HD, h);

    // This lane's query rows (relative to t0) and their positions.
    const int row[2] = {16 * warp + g, 16 * warp + g + 8};
    const int pos[2] = {p0 + row[0], p0 + row[1]};
    const bool active = 16 * warp < count;
    const int wfirst = p0 + 16 * warp, wlast = p0 + min(16 * warp + 15, count - 1);
    const int wlo = window > 0 ? max(0, wfirst - window + 1) : 0;

    u32 qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int rr = i & 1, d = 16 * ks + 8 * (i >> 1) + 2 * c4;
            float2 v = make_float2(0.0f, 0.0f);
            if (row[rr] < count) v = *(const float2*)(q + ((size_t)(t0 + row[rr]) * n_heads + h) * HD + d);
            qa[ks][i] = pack_h2(v.x, v.y);
        }

    const int lo = window > 0 ? max(0, p0 - window + 1) : 0;
    const int k_first = lo & ~(FA_KT - 1);

    // Keys kt..kt+FA_KT-1 into shared memory (zeros past plast): K by rows (coalesced),
    // V transposed with a warp's lanes on 32 consecutive keys of one 8-dim chunk.
    auto load = [&](int kt, bool with_v) {
        for (int i = tid; i < FA_KT * HD / 8; i += blockDim.x) {
            const int j = i / (HD / 8), c = (i - j * (HD / 8)) * 8;
            uint4 k4 = make_uint4(0, 0, 0, 0);
            if (kt + j <= plast) k4 = *(const uint4*)(K + (size_t)(kt + j) * kv_dim + c);
            *(uint4*)(sK + j * KP + c) = k4;
            if (with_v) {
                const int jv = i % FA_KT, cv = (i / FA_KT) * 8;
                uint4 v4 = make_uint4(0, 0, 0, 0);
                if (kt + jv <= plast) v4 = *(const uint4*)(V + (size_t)(kt + jv) * kv_dim + cv);
                const u32 w[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    sVt[(cv + 2 * e) * VP + jv] = (unsigned short)(w[e] & 0xffff);
                    sVt[(cv + 2 * e + 1) * VP + jv] = (unsigned short)(w[e] >> 16);
                }
            }
        }
    };
    // This warp's scores against the key tile, scaled and masked (-inf where not visible).
    auto scores = [&](int kt, float (&s)[NT][4]) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const unsigned short* kr = sK + (8 * nt + g) * KP + 16 * ks + 2 * c4;
                mma_f16(s[nt], qa[ks], *(const u32*)kr, *(const u32*)(kr + 8));
            }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int rr = e >> 1, j = kt + 8 * nt + 2 * c4 + (e & 1);
                const bool ok = row[rr] < count && j <= pos[rr] && (window <= 0 || j > pos[rr] - window);
                s[nt][e] = ok ? __fmul_rn(s[nt][e], scale) : NEG_INF;
            }
    };
    auto skip = [&](int kt) { return !active || kt > wlast || kt + FA_KT - 1 < wlo; };

    // Pass 1: max and sum of exp(s - max) per row (a row's values sit on 4 lanes).
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    for (int kt = k_first; kt <= plast; kt += FA_KT) {
        __syncthreads();
        load(kt, false);
        __syncthreads();
        if (skip(kt)) continue;
        float s[NT][4];
        scores(kt, s);
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            float cm = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) cm = fmaxf(cm, fmaxf(s[nt][2 * rr], s[nt][2 * rr + 1]));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
            const float mn = fmaxf(m[rr], cm);
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float v = s[nt][2 * rr + e];
                    sum += v == NEG_INF ? 0.0f : ggml_expf(v - mn);
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[rr] = (m[rr] == NEG_INF ? 0.0f : __fmul_rn(l[rr], ggml_expf(m[rr] - mn))) + sum;
            m[rr] = mn;
        }
    }
    if (sinks) {
        add_sink(sinks[h], &m[0], &l[0]);
        add_sink(sinks[h], &m[1], &l[1]);
    }
    const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};

    // Pass 2: probabilities rounded to f16 (the A operand of P·V), weighted sums of V.
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    for (int kt = k_first; kt <= plast; kt += FA_KT) {
        __syncthreads();
        load(kt, true);
        __syncthreads();
        if (skip(kt)) continue;
        float s[NT][4];
        scores(kt, s);
        auto p = [&](int nt, int e) {
            const float v = s[nt][e];
            return v == NEG_INF ? 0.0f : __fmul_rn(ggml_expf(v - m[e >> 1]), inv[e >> 1]);
        };
#pragma unroll
        for (int kc = 0; kc < FA_KT / 16; kc++) {
            const u32 pa[4] = {pack_h2(p(2 * kc, 0), p(2 * kc, 1)), pack_h2(p(2 * kc, 2), p(2 * kc, 3)),
                               pack_h2(p(2 * kc + 1, 0), p(2 * kc + 1, 1)),
                               pack_h2(p(2 * kc + 1, 2), p(2 * kc + 1, 3))};
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                const unsigned short* vr = sVt + (8 * dt + g) * VP + 16 * kc + 2 * c4;
                mma_f16(o[dt], pa, *(const u32*)vr, *(const u32*)(vr + 8));
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        if (row[rr] >= count) continue;
        float* dst = out + ((size_t)(t0 + row[rr]) * n_heads + h) * HD + 2 * c4;
#pragma unroll
        for (int dt = 0; dt < DT; dt++) *(float2*)(dst + 8 * dt) = make_float2(o[dt][2 * rr], o[dt][2 * rr + 1]);
    }
}

#define MMA_KERNEL(NAME, HD)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                                    \
        const float* __restrict__ q, float* __restrict__ out, const unsigned long long* __restrict__ bases,   \
        const int* __restrict__ caps, const int* __restrict__ tok_row, const int* __restrict__ tok_pos,       \
        const int* __restrict__ tiles, int layer, int n_heads, int n_kv, int hd, float scale, int window,      \
        const float* __restrict__ sinks) {                                                                     \
        attention_mma<HD>(q, out, bases, caps, tok_row, tok_pos, tiles, layer, n_heads, n_kv, scale, window,  \
                          sinks);                                                                              \
    }
MMA_KERNEL(attention_mma_64, 64)
MMA_KERNEL(attention_mma_128, 128)
