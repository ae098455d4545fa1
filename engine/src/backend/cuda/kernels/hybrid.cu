// Qwen3.5's hybrid layers (`crate::model::qwen35`), with the CPU's arithmetic where it can
// be matched (`kernels::delta_net`, `backend::cpu_hybrid`): the Gated DeltaNet's causal
// convolution and delta rule over each sequence's recurrent state on the device, its
// gates, L2 norms and gated RMSNorm; gated attention's query/gate split, sigmoid gate and
// partial rotation; and qwen35moe's gated shared expert.
//
// A sequence's state is one buffer (`rec[row]`): every recurrent layer's convolution
// state `[channel][taps - 1]`, then every layer's delta-rule state `[head][j][i]` (row j
// is the state's column j), as the host's `RecurrentState` lays them out. A row's tokens
// are `row_first[row] .. row_first[row + 1]` of the pass's stacked tokens.

#define MAX_TAPS 8
#define DELTA_MAX_DIM 256

// One thread per (row, channel): the row's tokens in order through the channel's window
// (an f32 FMA chain over the taps, the oldest first), the window kept in registers and
// written back once; the output through SiLU (ggml's exp below `simd`, the CPU's rows).
extern "C" __global__ void ssm_conv(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ out, const unsigned long long* __restrict__ rec,
                                    const int* __restrict__ row_first, int ch, int taps, long long conv_off,
                                    int simd) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    const int keep = taps - 1;
    float* st = (float*)rec[r] + conv_off + (size_t)c * keep;
    const float* wc = w + (size_t)c * taps;
    float win[MAX_TAPS];
#pragma unroll
    for (int i = 0; i < MAX_TAPS; i++) win[i] = i < keep ? st[i] : 0.0f;
    for (int t = row_first[r]; t < row_first[r + 1]; t++) {
        const float xv = x[(size_t)t * ch + c];
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_TAPS; i++)
            if (i < keep) sum = fmaf(win[i], wc[i], sum);
        sum = fmaf(xv, wc[keep], sum);
#pragma unroll
        for (int i = 0; i + 1 < MAX_TAPS; i++)
            if (i + 1 < keep) win[i] = win[i + 1];
        win[keep - 1] = xv;
        out[(size_t)t * ch + c] = silu_val(sum, 1.0f, c < simd);
    }
#pragma unroll
    for (int i = 0; i < MAX_TAPS; i++)
        if (i < keep) st[i] = win[i];
}

// The L2 norm of each `head`-wide head among the first heads of every `width`-wide row:
// grid (rows, heads), the CPU's RMSNorm scale at eps / head, then times 1 / sqrt(head).
extern "C" __global__ void l2_norm_heads(float* __restrict__ x, int width, int head, float eps, float inv) {
    float* h = x + (size_t)blockIdx.x * width + (size_t)blockIdx.y * head;
    const float scale = block_rms_scale(h, head, eps);
    for (int i = threadIdx.x; i < head; i += blockDim.x) h[i] = __fmul_rn(__fmul_rn(h[i], scale), inv);
}

// beta = sigmoid(beta); alpha = softplus(alpha + dt_bias) * a, per value head (`vh`).
extern "C" __global__ void delta_gates(float* __restrict__ beta, float* __restrict__ alpha,
                                       const float* __restrict__ dt_bias, const float* __restrict__ a, int n, int vh) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    beta[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-beta[i])));
    const float x = __fadd_rn(alpha[i], dt_bias[i % vh]);
    const float sp = x > 20.0f ? x : logf(__fadd_rn(1.0f, expf(x)));
    alpha[i] = __fmul_rn(sp, a[i % vh]);
}

// The delta rule. Grid (rows, value heads, ceil(d / 4)), 4 warps a block: each warp owns
// one row j of one head's state (its values spread over the lanes, in registers through
// the row's tokens), since row j's update needs only row j: per token, the row times
// exp(g), delta = (v_j - row . k) * beta, row += k * delta, out_j = row . q / sqrt(d).
// x is the convolution's [T][q | k | v] (q, k L2-normed); value head h reads key head
// h % k_heads.
extern "C" __global__ void delta_rule(const float* __restrict__ x, const float* __restrict__ beta,
                                      const float* __restrict__ g, float* __restrict__ out,
                                      const unsigned long long* __restrict__ rec, const int* __restrict__ row_first,
                                      int k_heads, int v_heads, int d, long long ssm_off, float scale) {
    const int r = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31;
    const int j = blockIdx.z * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (j >= d) return;
    const int kd = k_heads * d, vd = v_heads * d, ch = 2 * kd + vd;
    const int kh = (h % k_heads) * d;
    float* row = (float*)rec[r] + ssm_off + ((size_t)h * d + j) * d;
    float s[DELTA_MAX_DIM / 32];
#pragma unroll
    for (int m = 0; m < DELTA_MAX_DIM / 32; m++) {
        const int i = lane + 32 * m;
        s[m] = i < d ? row[i] : 0.0f;
    }
    for (int t = row_first[r]; t < row_first[r + 1]; t++) {
        const float* xt = x + (size_t)t * ch;
        const float* q = xt + kh;
        const float* k = xt + kd + kh;
        const float decay = expf(g[(size_t)t * v_heads + h]);
        float dot = 0.0f;
#pragma unroll
        for (int m = 0; m < DELTA_MAX_DIM / 32; m++) {
            const int i = lane + 32 * m;
            if (i < d) {
                s[m] = __fmul_rn(s[m], decay);
                dot = fmaf(s[m], k[i], dot);
            }
        }
        dot = warp_sum(dot);
        const float delta = __fmul_rn(__fsub_rn(xt[2 * kd + h * d + j], dot), beta[(size_t)t * v_heads + h]);
        float o = 0.0f;
#pragma unroll
        for (int m = 0; m < DELTA_MAX_DIM / 32; m++) {
            const int i = lane + 32 * m;
            if (i < d) {
                s[m] = fmaf(k[i], delta, s[m]);
                o = fmaf(s[m], q[i], o);
            }
        }
        o = warp_sum(o);
        if (lane == 0) out[(size_t)t * vd + h * d + j] = __fmul_rn(o, scale);
    }
#pragma unroll
    for (int m = 0; m < DELTA_MAX_DIM / 32; m++) {
        const int i = lane + 32 * m;
        if (i < d) row[i] = s[m];
    }
}

// RMSNorm of each `width`-wide run of x (one block a run), times w, times silu(z) (the
// CPU's rows: ggml's exp below `simd`).
extern "C" __global__ void gated_rms_norm(float* __restrict__ x, const float* __restrict__ w,
                                          const float* __restrict__ z, int width, float eps, int simd) {
    float* xr = x + (size_t)blockIdx.x * width;
    const float* zr = z + (size_t)blockIdx.x * width;
    const float scale = block_rms_scale(xr, width, eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float n = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        xr[i] = __fmul_rn(n, silu_val(zr[i], 1.0f, i < simd));
    }
}

// x *= sigmoid(gate) over n values.
extern "C" __global__ void sigmoid_mul(float* __restrict__ x, const float* __restrict__ gate, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gate[i]))));
}

// [n / half / 2][2 * half] into each head's halves a, b ([n / 2 / half][half] each).
extern "C" __global__ void split_halves(const float* __restrict__ x, float* __restrict__ a, float* __restrict__ b,
                                        int half, int n_half) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_half) return;
    const size_t head = i / half, e = i % half;
    a[i] = x[head * 2 * half + e];
    b[i] = x[head * 2 * half + half + e];
}

// RoPE of the first 2 * half dimensions of each `stride`-wide head: grid (rows, heads),
// one thread per rotated pair (`rope_pair`, as the `rope` kernel).
extern "C" __global__ void rope_partial(float* __restrict__ x, const int* __restrict__ pos, int heads, int stride,
                                        int half, float theta_scale, const float* __restrict__ pairs,
                                        float freq_scale, float mscale, int neox) {
    const int i = threadIdx.x;
    if (i >= half) return;
    float* head = x + ((size_t)blockIdx.x * heads + blockIdx.y) * (size_t)stride;
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    rope_pair(pos[blockIdx.x], i, theta_scale, pairs, half, freq_scale, mscale, &head[ia], &head[ib]);
}

// qwen35moe's shared expert, one block a row: y += o * sigmoid(x . w), the product
// rounded before the sum (ggml's mul, then add).
extern "C" __global__ void shared_gate_add(float* __restrict__ y, const float* __restrict__ o,
                                           const float* __restrict__ x, const float* __restrict__ w, int width) {
    __shared__ float part[32];
    const size_t r = blockIdx.x;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dot = fmaf(x[r * width + i], w[i], dot);
    dot = warp_sum(dot);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = dot;
    __syncthreads();
    float total = 0.0f;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++) total += part[k];
    const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-total)));
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        y[r * width + i] = __fadd_rn(y[r * width + i], __fmul_rn(o[r * width + i], s));
}
