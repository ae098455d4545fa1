// Embedding rows: out[r] = dequantized row ids[r] of a repacked weight matrix `[n, k]`
// (layout as in gemv.cu), with ggml's dequantization arithmetic per format.
// Types: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q8_0, 4 Q4_K, 5 Q6_K. One block per output row.

__device__ __forceinline__ float deq32(int type, const u8* qs, const float* d, const float* m,
                                       const u8* aux, size_t blk, int i) {
    if (type == 3) return __fmul_rn((float)(i8)qs[blk * 32 + i], d[blk]);
    const u8 byte = qs[blk * 16 + (i & 15)];
    int q = i < 16 ? (byte & 0xf) : (byte >> 4);
    if (type == 1) return __fmul_rn(d[blk], (float)q) + m[blk];
    if (type == 2) {
        const u32 qh = *(const u32*)(aux + blk * 4);
        q = (q | (int)(((qh >> i) & 1u) << 4)) - 16;
    } else {
        q -= 8;
    }
    return __fmul_rn((float)q, d[blk]);
}

__device__ __forceinline__ float deq_q4k(const u8* qs, const float* d, const float* m,
                                         const u8* aux, size_t blk, int i) {
    const int sb = i >> 5, l = i & 31, p = i >> 6;
    const u8 byte = qs[blk * 128 + 32 * p + l];
    const int q = (sb & 1) ? (byte >> 4) : (byte & 0xf);
    const u8* sm = aux + blk * 16;
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

// Row `row` of the matrix dequantized into o[0..k).
__device__ __forceinline__ void deq_row(const u8* qs, const float* d, const float* m, const u8* aux,
                                        size_t row, float* o, int k, int type) {
    const int per = type >= 4 ? 256 : 32;
    const int kb = k / per;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const size_t blk = row * kb + j / per;
        const int i = j % per;
        float v;
        if (type == 4) v = deq_q4k(qs, d, m, aux, blk, i);
        else if (type == 5) v = deq_q6k(qs, d, aux, blk, i);
        else v = deq32(type, qs, d, m, aux, blk, i);
        o[j] = v;
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
// GEMM sees exactly the values the CPU's int8 dot products multiply.
extern "C" __global__ void dequant_act(const i8* __restrict__ qs, const float* __restrict__ d,
                                       float* __restrict__ out, int n, int block) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __fmul_rn((float)qs[i], d[i / block]);
}

// The whole matrix dequantized and rounded to f16 (`out` is [n][k]), for the f16 prefill
// GEMM: each thread 8 consecutive values of a row (k is a multiple of 32, so they share
// a block), stored as one 16-byte write; one kernel per type, so no per-value branch.
// grid (n * k / 8 / 256 rounded up), block 256.
template <int T>
__device__ __forceinline__ void dequant_f16_t(const u8* qs, const float* d, const float* m, const u8* aux,
                                              uint4* out, int n, int k) {
    const size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    constexpr int per = T >= 4 ? 256 : 32;
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
            if (T == 4) v[h] = deq_q4k(qs, d, m, aux, blk, i);
            else if (T == 5) v[h] = deq_q6k(qs, d, aux, blk, i);
            else v[h] = deq32(T, qs, d, m, aux, blk, i);
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

// Quantized activations back to values rounded to f16: out[i] = f16(qs[i] * d[i / block]).
extern "C" __global__ void dequant_act_f16(const i8* __restrict__ qs, const float* __restrict__ d,
                                           unsigned short* __restrict__ out, int n, int block) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2h(__fmul_rn((float)qs[i], d[i / block]));
}
