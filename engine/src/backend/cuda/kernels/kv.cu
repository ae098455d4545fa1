// The KV cache on the device: new tokens' K/V written into it (plain, or with RoPE in
// the same launch), and the row gather `kv.rs` launches; attention over it is
// attention.cu's (the same program, this file first). Each sequence's K/V mirror is one
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
                                         int hq, int hk, int half, float theta_scale,
                                         const float* __restrict__ pairs, float freq_scale, float mscale, int neox,
                                         int total,
                                         unsigned short* __restrict__ stage) {
    const int t = blockIdx.x, y = blockIdx.y, i = threadIdx.x;
    if (i >= half) return;
    const int hd = 2 * half, pos = tok_pos[t];
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    if (y < hq) {
        float* head = q + ((size_t)t * hq + y) * hd;
        rope_pair(pos, i, theta_scale, pairs, half, freq_scale, mscale, &head[ia], &head[ib]);
        return;
    }
    const int h = y - hq;
    const size_t kv_dim = (size_t)hk * hd;
    float* kh = k + (size_t)t * kv_dim + (size_t)h * hd;
    rope_pair(pos, i, theta_scale, pairs, half, freq_scale, mscale, &kh[ia], &kh[ib]);
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


// Copy `n` rows of width `width` from x (at stacked rows src[i]) into out (row i).
extern "C" __global__ void gather_rows(const float* __restrict__ x, const int* __restrict__ src,
                                       float* __restrict__ out, int width) {
    const float* xr = x + (size_t)src[blockIdx.x] * width;
    float* o = out + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) o[i] = xr[i];
}
