// Embedding rows: out[r] = dequantized row ids[r] of a repacked weight matrix `[n, k]`
// (layout as in gemv.cu), with ggml's dequantization arithmetic per format.
// Types (`KERNEL_TYPES`): 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q8_0, 4 Q4_K, 5 Q6_K, 6 Q5_1,
// 7 IQ4_NL, 8 Q5_K, 9 Q3_K, 10 Q2_K, 11 IQ4_XS, 12 F16, 13 BF16, 14 MXFP4. One block per
// output row.

// Values per block of a type: super-blocks of 256 or blocks of 32.
__host__ __device__ constexpr int type_block(int type) {
    return type == 4 || type == 5 || (type >= 8 && type <= 11) ? 256 : 32;
}

__device__ __forceinline__ float deq32(int type, const u8* qs, const float* d, const float* m,
                                       const u8* aux, size_t blk, int i) {
    if (type == 3) return __fmul_rn((float)(i8)qs[blk * 32 + i], d[blk]);
    if (type == 12 || type == 13) {
        const unsigned short v = *(const unsigned short*)(qs + 2 * (blk * 32 + i));
        return type == 12 ? h2f(v) : __uint_as_float((u32)v << 16);
    }
    const u8 byte = qs[blk * 16 + (i & 15)];
    int q = i < 16 ? (byte & 0xf) : (byte >> 4);
    if (type == 1) return __fmul_rn(d[blk], (float)q) + m[blk];
    if (type == 7) return __fmul_rn(d[blk], (float)iq4_value(q));
    if (type == 14) return __fmul_rn(d[blk], (float)mxfp4_value(q));
    if (type == 2 || type == 6) {
        const u32 qh = *(const u32*)(aux + blk * 4);
        q |= (int)(((qh >> i) & 1u) << 4);
        if (type == 6) return __fmul_rn(d[blk], (float)q) + m[blk];
        q -= 16;
    } else {
        q -= 8;
    }
    return __fmul_rn((float)q, d[blk]);
}

// Q4_K (aux: 8 scales, 8 mins) and Q5_K (then 32 bytes of fifth bits, bit sb of byte l).
template <bool Q5>
__device__ __forceinline__ float deq_q45k(const u8* qs, const float* d, const float* m,
                                          const u8* aux, size_t blk, int i) {
    const int sb = i >> 5, l = i & 31, p = i >> 6;
    const u8 byte = qs[blk * 128 + 32 * p + l];
    int q = (sb & 1) ? (byte >> 4) : (byte & 0xf);
    const u8* sm = aux + blk * (Q5 ? 48 : 16);
    if (Q5) q += ((sm[16 + l] >> sb) & 1) << 4;
    return __fmul_rn(__fmul_rn(d[blk], (float)sm[sb]), (float)q) - __fmul_rn(m[blk], (float)sm[8 + sb]);
}

__device__ __forceinline__ float deq_q6k(const u8* qs, const float* d, const u8* aux, size_t blk, int i) {
    const int j = i >> 7, k = (i & 127) >> 5, l = i & 31;
    const u8 lo = qs[blk * 192 + 64 * j + 32 * (k & 1) + l] >> (4 * (k >> 1));
    const u8 hi = (qs[blk * 192 + 128 + 32 * j + l] >> (2 * k)) & 3;
    const int q = (int)((lo & 0xf) | (hi << 4)) - 32;
    const float sc = (float)((const i8*)(aux + blk * 16))[i >> 4];
    return __fmul_rn(__fmul_rn(d[blk], sc), (float)q);
}

// Q3_K (qs: hmask[32] then the low bits[64]; aux: 16 signed scales) and Q2_K (qs: the
// low bits[64]; aux: 16 bytes, scale low nibble, min high): value 128j + 32p + l is
// bits 2p..2p+2 of byte 32j + l; Q3_K's bit 4j + p of hmask[l], when clear, takes 4 off.
__device__ __forceinline__ float deq_q23k(int type, const u8* qs, const float* d, const float* m,
                                          const u8* aux, size_t blk, int i) {
    const int j = i >> 7, p = (i >> 5) & 3, l = i & 31;
    if (type == 9) {
        const u8* b = qs + blk * 96;
        const int q = ((b[32 + 32 * j + l] >> (2 * p)) & 3) - (((b[l] >> (4 * j + p)) & 1) ? 0 : 4);
        const float sc = (float)((const i8*)(aux + blk * 16))[i >> 4];
        return __fmul_rn(__fmul_rn(d[blk], sc), (float)q);
    }
    const int q = (qs[blk * 64 + 32 * j + l] >> (2 * p)) & 3;
    const u8 sc = aux[blk * 16 + (i >> 4)];
    return __fmul_rn(__fmul_rn(d[blk], (float)(sc & 0xf)), (float)q) - __fmul_rn(m[blk], (float)(sc >> 4));
}

// IQ4_XS: sub-block s's 16 bytes, low nibbles its values 0..16, high ones 16..32;
// aux: 8 signed scales.
__device__ __forceinline__ float deq_iq4xs(const u8* qs, const float* d, const u8* aux, size_t blk, int i) {
    const int s = i >> 5;
    const u8 byte = qs[blk * 128 + 16 * s + (i & 15)];
    const int idx = (i & 16) ? (byte >> 4) : (byte & 0xf);
    const float sc = (float)((const i8*)(aux + blk * 8))[s];
    return __fmul_rn(__fmul_rn(d[blk], sc), (float)iq4_value(idx));
}

// Value i of block blk of a matrix of `type`.
__device__ __forceinline__ float deq_at(int type, const u8* qs, const float* d, const float* m,
                                        const u8* aux, size_t blk, int i) {
    switch (type) {
        case 4: return deq_q45k<false>(qs, d, m, aux, blk, i);
        case 5: return deq_q6k(qs, d, aux, blk, i);
        case 8: return deq_q45k<true>(qs, d, m, aux, blk, i);
        case 9:
        case 10: return deq_q23k(type, qs, d, m, aux, blk, i);
        case 11: return deq_iq4xs(qs, d, aux, blk, i);
        default: return deq32(type, qs, d, m, aux, blk, i);
    }
}

// Row `row` of the matrix dequantized into o[0..k).
__device__ __forceinline__ void deq_row(const u8* qs, const float* d, const float* m, const u8* aux,
                                        size_t row, float* o, int k, int type) {
    const int per = type_block(type);
    const int kb = k / per;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        o[j] = deq_at(type, qs, d, m, aux, row * kb + j / per, j % per);
    }
}

extern "C" __global__ void embed_rows(const u8* qs, const float* d, const float* m, const u8* aux,
                                      const int* ids, float* out, int k, int type) {
    deq_row(qs, d, m, aux, (size_t)ids[blockIdx.x], out + (size_t)blockIdx.x * k, k, type);
}

// The whole matrix dequantized to f32 (`out` is [n][k]), for the prefill GEMM: every
// value is exact in f32. grid (n), block 256.
extern "C" __global__ void dequant_f32(const u8* qs, const float* d, const float* m, const u8* aux,
                                       float* out, int k, int type) {
    deq_row(qs, d, m, aux, blockIdx.x, out + (size_t)blockIdx.x * k, k, type);
}

// Quantized activations back to f32: out[i] = qs[i] * d[i / block] (exact), so the
// GEMM sees exactly the values the CPU's int8 dot products multiply. A float format
// (F16 / BF16 weights) passes qs null: its values are d.
extern "C" __global__ void dequant_act(const i8* __restrict__ qs, const float* __restrict__ d,
                                       float* __restrict__ out, int n, int block) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = qs ? __fmul_rn((float)qs[i], d[i / block]) : d[i];
}

// The whole matrix dequantized and rounded to f16 (`out` is [n][k]), for the f16 prefill
// GEMM: each thread 8 consecutive values of a row (k is a multiple of 32, so they share
// a block), stored as one 16-byte write; one kernel per type, so no per-value branch.
// grid (n * k / 8 / 256 rounded up), block 256.
template <int T>
__device__ __forceinline__ void dequant_f16_t(const u8* qs, const float* d, const float* m, const u8* aux,
                                              uint4* out, int n, int k) {
    const size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    constexpr int per = type_block(T);
    const int kb = k / per, k8 = k / 8;
    if (g >= (size_t)n * k8) return;
    const size_t row = g / k8;
    const int col = (int)(g - row * k8) * 8;
    const size_t blk = row * kb + col / per;
    const int i0 = col % per;
    u32 w[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float v[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = i0 + 2 * e + h;
            v[h] = deq_at(T, qs, d, m, aux, blk, i);
        }
        w[e] = (u32)f2h(v[0]) | ((u32)f2h(v[1]) << 16);
    }
    out[g] = make_uint4(w[0], w[1], w[2], w[3]);
}

#define DEQUANT_F16(NAME, T)                                                                                 \
    extern "C" __global__ void NAME(const u8* qs, const float* d, const float* m, const u8* aux, uint4* out, \
                                    int n, int k) {                                                          \
        dequant_f16_t<T>(qs, d, m, aux, out, n, k);                                                          \
    }
DEQUANT_F16(dequant_f16_q4_0, 0)
DEQUANT_F16(dequant_f16_q4_1, 1)
DEQUANT_F16(dequant_f16_q5_0, 2)
DEQUANT_F16(dequant_f16_q8_0, 3)
DEQUANT_F16(dequant_f16_q4_k, 4)
DEQUANT_F16(dequant_f16_q6_k, 5)
DEQUANT_F16(dequant_f16_q5_1, 6)
DEQUANT_F16(dequant_f16_iq4_nl, 7)
DEQUANT_F16(dequant_f16_q5_k, 8)
DEQUANT_F16(dequant_f16_q3_k, 9)
DEQUANT_F16(dequant_f16_q2_k, 10)
DEQUANT_F16(dequant_f16_iq4_xs, 11)
DEQUANT_F16(dequant_f16_f16, 12)
DEQUANT_F16(dequant_f16_bf16, 13)
DEQUANT_F16(dequant_f16_mxfp4, 14)

// Quantized activations back to values rounded to f16: out[i] = f16(qs[i] * d[i / block])
// (f16(d[i]) for a float format, qs null).
extern "C" __global__ void dequant_act_f16(const i8* __restrict__ qs, const float* __restrict__ d,
                                           unsigned short* __restrict__ out, int n, int block) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2h(qs ? __fmul_rn((float)qs[i], d[i / block]) : d[i]);
}
