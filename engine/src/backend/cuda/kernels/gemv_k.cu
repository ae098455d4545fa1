// GEMV items of the K-quants Q5_K, Q3_K, Q2_K and of IQ4_XS against Q8_K activations (one
// program with gemv.cu, whose `Args` they take). As the CPU's `kvec` kernels: exact
// integer sums per sub-block times the sub-block's integer scale, then one f32 FMA with
// d_w * d_a per item (and one with -dmin * d_a for the mins' integer sum).

// Q5_K: Q4_K's item (super-block sb, 16-byte slice q = 2p + h: low nibbles are values
// 64p + 16h .. +16 of sub-block 2p, high nibbles 64p + 32 + 16h .. +16 of sub-block
// 2p + 1); the fifth bits of value 64p + 32e + l are bit 2p + e of qh[l], and slice h's
// values take qh[16h .. 16h + 16] (aux bytes 16.. of the block).
__device__ __forceinline__ void item_q5k(const Args& a, int row, int it, float* acc) {
    const int sb = it >> 3, q16 = it & 7, p = q16 >> 1, h = q16 & 1;
    const size_t blk = (size_t)row * a.kb + sb;
    const uint4 qv = *(const uint4*)(a.qs + blk * 128 + 16 * q16);
    const uint4 hv = *(const uint4*)(a.aux + blk * 48 + 16 + 16 * h);
    const u32 q[4] = {qv.x, qv.y, qv.z, qv.w}, qh[4] = {hv.x, hv.y, hv.z, hv.w};
    int lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo[i] = (int)((q[i] & 0x0f0f0f0fu) | (((qh[i] >> (2 * p)) & 0x01010101u) << 4));
        hi[i] = (int)(((q[i] >> 4) & 0x0f0f0f0fu) | (((qh[i] >> (2 * p + 1)) & 0x01010101u) << 4));
    }
    const u8* sm = a.aux + blk * 48;
    const int sc0 = sm[2 * p], sc1 = sm[2 * p + 1], mn0 = sm[8 + 2 * p], mn1 = sm[9 + 2 * p];
    const float d = a.d[blk], dmin = a.m[blk];
    for (int r = 0; r < a.rows; r++) {
        const size_t ab = (size_t)r * a.kb + sb;
        const int4 xl = *(const int4*)(a.aq + ab * 256 + 64 * p + 16 * h);
        const int4 xh = *(const int4*)(a.aq + ab * 256 + 64 * p + 32 + 16 * h);
        const int xlo[4] = {xl.x, xl.y, xl.z, xl.w}, xhi[4] = {xh.x, xh.y, xh.z, xh.w};
        int slo = 0, shi = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            slo = __dp4a(lo[i], xlo[i], slo);
            shi = __dp4a(hi[i], xhi[i], shi);
        }
        const int* bs = a.abs + ab * 16 + 4 * p + h;
        const int isum = sc0 * slo + sc1 * shi;
        const int imin = mn0 * bs[0] + mn1 * bs[2];
        const float da = a.ad[ab];
        acc[r] = fmaf(__fmul_rn(d, da), (float)isum, acc[r]);
        acc[r] = fmaf(-__fmul_rn(dmin, da), (float)imin, acc[r]);
    }
}

// Q3_K and Q2_K (T 9, 10): item = (super-block sb, half j, 16-value slice h) covers the
// four 2-bit planes p = 0..3 of bytes 32j + 16h .. +16 of the low bits, values
// 128j + 32p + 16h .. +16, each a sub-block of 16 with scale (and sum of 16) 8j + 2p + h.
// Q3_K: bit 4j + p of hmask[16h + l] adds 4, and 4 comes off every value (4 · the sum of
// 16); its scales are signed. Q2_K: scale the low nibble of the scale byte, min the high.
template <int T>
__device__ __forceinline__ void item_q23k(const Args& a, int row, int it, float* acc) {
    constexpr bool q3 = T == 9;
    const int sb = it >> 2, j = (it >> 1) & 1, h = it & 1;
    const size_t blk = (size_t)row * a.kb + sb;
    const u8* base = a.qs + blk * (q3 ? 96 : 64);
    const uint4 lv = *(const uint4*)(base + (q3 ? 32 : 0) + 32 * j + 16 * h);
    const u32 ql[4] = {lv.x, lv.y, lv.z, lv.w};
    u32 hm[4] = {0, 0, 0, 0};
    if (q3) {
        const uint4 hv = *(const uint4*)(base + 16 * h);
        hm[0] = hv.x; hm[1] = hv.y; hm[2] = hv.z; hm[3] = hv.w;
    }
    int q[4][4];
#pragma unroll
    for (int p = 0; p < 4; p++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 v = (ql[i] >> (2 * p)) & 0x03030303u;
            if (q3) v |= ((hm[i] >> (4 * j + p)) & 0x01010101u) << 2;
            q[p][i] = (int)v;
        }
    }
    const u8* sc = a.aux + blk * 16 + 8 * j + h;
    const float d = a.d[blk];
    for (int r = 0; r < a.rows; r++) {
        const size_t ab = (size_t)r * a.kb + sb;
        const int* bs = a.abs + ab * 16 + 8 * j + h;
        int isum = 0, imin = 0;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const int4 xv = *(const int4*)(a.aq + ab * 256 + 128 * j + 32 * p + 16 * h);
            int s = __dp4a(q[p][0], xv.x, 0);
            s = __dp4a(q[p][1], xv.y, s);
            s = __dp4a(q[p][2], xv.z, s);
            s = __dp4a(q[p][3], xv.w, s);
            if (q3) {
                isum += (int)(i8)sc[2 * p] * (s - 4 * bs[2 * p]);
            } else {
                isum += (int)(sc[2 * p] & 0xf) * s;
                imin += (int)(sc[2 * p] >> 4) * bs[2 * p];
            }
        }
        const float da = a.ad[ab];
        acc[r] = fmaf(__fmul_rn(d, da), (float)isum, acc[r]);
        if (!q3) acc[r] = fmaf(-__fmul_rn(a.m[blk], da), (float)imin, acc[r]);
    }
}

__device__ __forceinline__ void item_q3k(const Args& a, int row, int it, float* acc) {
    item_q23k<9>(a, row, it, acc);
}

__device__ __forceinline__ void item_q2k(const Args& a, int row, int it, float* acc) {
    item_q23k<10>(a, row, it, acc);
}

// IQ4_XS: item = (super-block sb, sub-block s): its 16 bytes, low nibbles the table
// indices of values 32s .. +16, high nibbles of 32s + 16 .. +16; one signed scale.
__device__ __forceinline__ void item_iq4xs(const Args& a, int row, int it, float* acc) {
    const int sb = it >> 3, s = it & 7;
    const size_t blk = (size_t)row * a.kb + sb;
    const uint4 qv = *(const uint4*)(a.qs + blk * 128 + 16 * s);
    const u32 q[4] = {qv.x, qv.y, qv.z, qv.w};
    int lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo[i] = iq4_lookup4(q[i] & 0x0f0f0f0fu);
        hi[i] = iq4_lookup4((q[i] >> 4) & 0x0f0f0f0fu);
    }
    const int sc = (int)(i8)a.aux[blk * 8 + s];
    const float d = a.d[blk];
    for (int r = 0; r < a.rows; r++) {
        const size_t ab = (size_t)r * a.kb + sb;
        const int4 xl = *(const int4*)(a.aq + ab * 256 + 32 * s);
        const int4 xh = *(const int4*)(a.aq + ab * 256 + 32 * s + 16);
        int v = __dp4a(lo[0], xl.x, 0);
        v = __dp4a(lo[1], xl.y, v);
        v = __dp4a(lo[2], xl.z, v);
        v = __dp4a(lo[3], xl.w, v);
        v = __dp4a(hi[0], xh.x, v);
        v = __dp4a(hi[1], xh.y, v);
        v = __dp4a(hi[2], xh.z, v);
        v = __dp4a(hi[3], xh.w, v);
        acc[r] = fmaf(__fmul_rn(d, a.ad[ab]), (float)(sc * v), acc[r]);
    }
}
