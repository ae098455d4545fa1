// Flash-decoding (sm_80 and later): attention of decode rows that see more than `above`
// keys, in one pass over the keys, on the tensor cores. One block of four warps per
// (row, KV head, split) serves all the query heads of that KV head (up to FD_ROWS; more
// take several blocks), so a step reads each K and V row once per KV head instead of
// once per query head. Compiled with kv.cu and attention.cu as one program; the layout
// of the mirror is theirs.
//
// A row's visible keys lo..pos are cut into consecutive splits of `fd_range`: as many as
// the launch's gridDim.z (a constant of the model and the device's SM count, chosen by
// the host) asks for, each a whole number of FD_KT-key tiles and at least FD_KMIN keys.
// The cut depends only on the row's own visible keys and that constant, never on the
// rows beside it, so a row's result never depends on its company.
//
// Within a split, tiles of FD_KT keys are copied into shared memory as they are (K and
// V rows, `cp.async`, 16 bytes a copy, all of a tile's copies in flight at once), and
// every warp takes 16 keys of each tile: S = Q·Kᵀ for the 16 query-head rows (q rounded
// to f16, zero rows past the group) on m16n8k16 f16 `mma.sync` summing in f32, times
// `scale`; an online max and sum per row (ggml's exp, f32), the running output rescaled
// when the max grows; P = exp(s - max) rounded to f16 as the A operand of P·V, summed in
// f32. At the end the warps' states are merged and the split writes its unnormalized
// output, max and sum to `part`; `flashdec_combine` merges the splits, takes the head's
// sink, normalizes, stores and (with `qs`) quantizes. Unlike the CPU, probabilities are
// rounded to f16 relative to a running maximum rather than normalized first
// (agreement, not identity). Other blocks on the SM hide a tile's memory latency.

#define FD_KT 64
#define FD_KMIN 128
#define FD_ROWS 16
#define FD_WARPS 4
#define FD_THREADS (32 * FD_WARPS)
#define FD_MAX_SPLITS 128

// The keys of split z of a row whose visible keys are lo..pos, for `splits` blocks a
// (row, KV head): sets [*a, *b] and returns how many splits have keys. `flash_split` in
// attention.rs mirrors it (tested).
__device__ __forceinline__ int fd_range(int lo, int pos, int splits, int z, int* a, int* b) {
    const int n = pos - lo + 1;
    const int per = (n + splits - 1) / splits;
    const int ks = max(FD_KMIN, (per + FD_KT - 1) / FD_KT * FD_KT);
    *a = lo + z * ks;
    *b = min(pos, *a + ks - 1);
    return (n + ks - 1) / ks;
}

#if __CUDA_ARCH__ >= 800
// 16 bytes from global to shared memory, asynchronously; zeros without `ok` (nothing read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}

template <int HD>
__device__ __forceinline__ void flashdec(const float* __restrict__ q, const unsigned long long* __restrict__ bases,
                                         const int* __restrict__ caps, const int* __restrict__ tok_row,
                                         const int* __restrict__ tok_pos, const int* __restrict__ toks, int layer,
                                         int n_heads, int n_kv, int hd, float scale, int window, int above,
                                         float* __restrict__ part) {
    constexpr int KS = HD / 16;      // k-steps of Q·Kᵀ over the head dimension
    constexpr int DT = HD / 8;       // n-tiles of the output
    constexpr int KP = HD + 8;       // halves per K, V and Q row in shared memory
    extern __shared__ __align__(16) unsigned short fd_smem[];
    unsigned short* sK = fd_smem;            // [FD_KT][KP]
    unsigned short* sV = sK + FD_KT * KP;    // [FD_KT][KP]
    unsigned short* sQ = sV + FD_KT * KP;    // [FD_ROWS][KP]
    __shared__ float s_m[FD_WARPS][FD_ROWS], s_l[FD_WARPS][FD_ROWS];

    const int t = toks[blockIdx.x], z = blockIdx.z;
    const int group = n_heads / n_kv, chunks = (group + FD_ROWS - 1) / FD_ROWS;
    const int kvh = blockIdx.y / chunks, h0 = kvh * group + (blockIdx.y % chunks) * FD_ROWS;
    const int rows = min(FD_ROWS, (kvh + 1) * group - h0);
    const int r = tok_row[t], pos = tok_pos[t];
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    if (pos - lo + 1 <= above) return;
    int a, b;
    const int used = fd_range(lo, pos, gridDim.z, z, &a, &b);
    if (z >= used) return;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const int kv_dim = n_kv * hd;
    const unsigned short* K = kv_plane(bases, caps, r, layer, 0, n_heads, n_kv, hd, h0);
    const unsigned short* V = kv_plane(bases, caps, r, layer, 1, n_heads, n_kv, hd, h0);
    for (int i = tid; i < FD_ROWS * HD; i += blockDim.x) {
        const int row = i / HD, d = i - row * HD;
        sQ[row * KP + d] = row < rows && d < hd ? f2h(q[((size_t)t * n_heads + h0 + row) * hd + d]) : 0;
    }
    // Rows g + 8 hold only padding when the block serves 8 heads or fewer.
    const bool hi = rows > 8;
    // The tile copy: HD / 8 pieces a row, FD_THREADS / (HD / 8) rows at a time.
    constexpr int PR = HD / 8, RPI = FD_THREADS / PR;
    const int j0 = tid / PR, c = (tid % PR) * 8;
    const bool c_ok = c < hd;
    const size_t step = (size_t)RPI * kv_dim;

    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

    for (int kt = a; kt <= b; kt += FD_KT) {
        __syncthreads();
        // Keys kt..kt+FD_KT-1 into shared memory, zeros past b and past hd: thread tid
        // copies 16-byte piece c / 8 of rows j0, j0 + RPI, ... of the tile's K and V.
        const unsigned short* kp = K + (size_t)(kt + j0) * kv_dim + c;
        const unsigned short* vp = V + (size_t)(kt + j0) * kv_dim + c;
#pragma unroll
        for (int it = 0; it < FD_KT / RPI; it++) {
            const int j = j0 + RPI * it;
            const bool ok = c_ok && kt + j <= b;
            cp_async16(sK + j * KP + c, ok ? kp : K, ok);
            cp_async16(sV + j * KP + c, ok ? vp : V, ok);
            kp += step;
            vp += step;
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();
        const int k0 = kt + 16 * warp;   // this warp's 16 keys
        if (k0 > b) continue;

        // Scores of the 16 rows against the warp's keys: n-tiles nt = 0, 1 of 8 keys.
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const unsigned short* qr = sQ + g * KP + 16 * ks + 2 * c4;
            const u32 qa[4] = {*(const u32*)qr, *(const u32*)(qr + 8 * KP), *(const u32*)(qr + 8),
                               *(const u32*)(qr + 8 * KP + 8)};
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const unsigned short* kr = sK + (16 * warp + 8 * nt + g) * KP + 16 * ks + 2 * c4;
                mma_f16(s[nt], qa, *(const u32*)kr, *(const u32*)(kr + 8));
            }
        }
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = k0 + 8 * nt + 2 * c4 + (e & 1);
                s[nt][e] = j <= b ? __fmul_rn(s[nt][e], scale) : NEG_INF;
            }

        // Online max and sum per row (a row's 16 scores sit on 4 lanes); the output's
        // row rescaled when its max grows; p = exp(s - max), 0 for masked keys.
        float p[2][4];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            if (rr == 1 && !hi) {
#pragma unroll
                for (int nt = 0; nt < 2; nt++) p[nt][2] = p[nt][3] = 0.0f;
                continue;
            }
            float cm = fmaxf(fmaxf(s[0][2 * rr], s[0][2 * rr + 1]), fmaxf(s[1][2 * rr], s[1][2 * rr + 1]));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
            // Key k0 <= b is visible to every row, so cm and mn are finite.
            const float mn = fmaxf(m[rr], cm);
            const float alpha = m[rr] == NEG_INF ? 0.0f : ggml_expf(m[rr] - mn);
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float v = s[nt][2 * rr + e];
                    const float pe = v == NEG_INF ? 0.0f : ggml_expf(v - mn);
                    p[nt][2 * rr + e] = pe;
                    sum += pe;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[rr] = __fmul_rn(l[rr], alpha) + sum;
            m[rr] = mn;
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                o[dt][2 * rr] = __fmul_rn(o[dt][2 * rr], alpha);
                o[dt][2 * rr + 1] = __fmul_rn(o[dt][2 * rr + 1], alpha);
            }
        }
        // P·V over the warp's 16 keys: A = P (f16); B = V with k the key, n the dim, so
        // b0 pairs keys 2c and 2c + 1 (b1: + 8) of dim 8 dt + g from two rows.
        const u32 pa[4] = {pack_h2(p[0][0], p[0][1]), pack_h2(p[0][2], p[0][3]), pack_h2(p[1][0], p[1][1]),
                           pack_h2(p[1][2], p[1][3])};
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            const unsigned short* vr = sV + (16 * warp + 2 * c4) * KP + 8 * dt + g;
            const u32 b0 = (u32)vr[0] | ((u32)vr[KP] << 16), b1 = (u32)vr[8 * KP] | ((u32)vr[9 * KP] << 16);
            mma_f16(o[dt], pa, b0, b1);
        }
    }

    // Merge the warps (a warp that saw no key has max -inf and weighs nothing): the
    // tiles' shared memory now holds each warp's output rows, [warp][row][HD] as f32.
    __syncthreads();
    float* so = (float*)fd_smem;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) so[(warp * FD_ROWS + g + 8 * (e >> 1)) * HD + 8 * dt + 2 * c4 + (e & 1)] = o[dt][e];
    if (c4 == 0) {
        s_m[warp][g] = m[0];
        s_m[warp][g + 8] = m[1];
        s_l[warp][g] = l[0];
        s_l[warp][g + 8] = l[1];
    }
    __syncthreads();
    const int splits = gridDim.z;
    for (int i = tid; i < rows * (hd + 2); i += blockDim.x) {
        const int row = i / (hd + 2), d = i - row * (hd + 2);
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < FD_WARPS; w++) mx = fmaxf(mx, s_m[w][row]);
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < FD_WARPS; w++) {
            if (s_m[w][row] == NEG_INF) continue;
            const float f = ggml_expf(s_m[w][row] - mx);
            v = fmaf(f, d < hd ? so[(w * FD_ROWS + row) * HD + d] : s_l[w][row], v);
        }
        float* pz = part + (((size_t)blockIdx.x * n_heads + h0 + row) * splits + z) * (hd + 2);
        pz[d] = d == hd ? mx : v;
    }
}
#define FD_BODY(BODY) BODY
#else
// No f16 mma before sm_80: an empty kernel the host never launches (`KvPlan::flash`).
#define FD_BODY(BODY)
#endif

// grid (decode rows, n_kv * ceil(group / FD_ROWS), splits), block FD_THREADS, dynamic
// shared memory (2 * FD_KT + FD_ROWS) * (HD + 8) halves (`smem` in flashdec.rs).
#define FLASHDEC(HD)                                                                                          \
    extern "C" __global__ void __launch_bounds__(FD_THREADS) flashdec_##HD(                                        \
        const float* __restrict__ q, const unsigned long long* __restrict__ bases,                            \
        const int* __restrict__ caps, const int* __restrict__ tok_row, const int* __restrict__ tok_pos,       \
        const int* __restrict__ toks, int layer, int n_heads, int n_kv, int hd, float scale, int window,      \
        int above, float* __restrict__ part) {                                                                \
        FD_BODY((flashdec<HD>(q, bases, caps, tok_row, tok_pos, toks, layer, n_heads, n_kv, hd, scale, window, \
                              above, part)));                                                                  \
    }
FLASHDEC(64)
FLASHDEC(128)
FLASHDEC(256)

// The splits of each row that `flashdec_*` took merged, one block per (decode row, query
// head): M = the splits' max (with the head's sink: `sink_max`), L = sum_z l_z exp(m_z -
// M) (f64, lanes then a fixed tree) + exp(sink - M) (libm's, as the CPU), output = sum_z
// exp(m_z - M) / L * o_z in split order; stored and, with `qs`, quantized as an unsplit
// row's (`store_out`). Rows of `above` keys or fewer were the one-query kernel's.
// grid (decode rows, n_heads), block 128.
extern "C" __global__ void flashdec_combine(float* __restrict__ out, const int* __restrict__ tok_pos,
                                            const int* __restrict__ toks, int n_heads, int hd, int window,
                                            int above, const float* __restrict__ sinks, int splits,
                                            const float* __restrict__ part, i8* __restrict__ qs,
                                            float* __restrict__ qd, float* __restrict__ qsum, int with_sum) {
    __shared__ float vals[ATT_MAX_DIM];
    __shared__ float wz[FD_MAX_SPLITS];
    const int t = toks[blockIdx.x], h = blockIdx.y, pos = tok_pos[t];
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    if (pos - lo + 1 <= above) return;
    int a, b;
    const int used = fd_range(lo, pos, splits, 0, &a, &b);
    const float* pr = part + ((size_t)blockIdx.x * n_heads + h) * splits * (size_t)(hd + 2);
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float mx = NEG_INF;
        for (int z = lane; z < used; z += 32) mx = fmaxf(mx, pr[z * (hd + 2) + hd]);
        mx = warp_max(mx);
        if (sinks) mx = sink_max(mx, sinks[h]);
        double total = 0.0;
        for (int z = lane; z < used; z += 32)
            total += (double)pr[z * (hd + 2) + hd + 1] * (double)ggml_expf(pr[z * (hd + 2) + hd] - mx);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
        if (sinks) total += (double)expf(sinks[h] - mx);
        for (int z = lane; z < used; z += 32) wz[z] = (float)((double)ggml_expf(pr[z * (hd + 2) + hd] - mx) / total);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = 0.0f;
        for (int z = 0; z < used; z++) v = fmaf(wz[z], pr[z * (hd + 2) + i], v);
        vals[i] = v;
    }
    __syncthreads();
    const size_t row = (size_t)t * n_heads + h;
    store_out(vals, out + row * hd, hd, row * (hd / 32), qs, qd, qsum, with_sum);
}
