/* State-space and linear-attention recurrences on the GPU (rlx/ir/ops_ssm.py), storage type T,
 * computed in float.
 *
 * rlx_selective_scan: one warp per (batch row, channel); lane l keeps states n = l, l+32, ... in
 *   registers (N <= 32 * RLX_SSM_PER_LANE) and the warp reduces <s, C_t> with shuffles each step.
 * rlx_gated_delta_net: one block per (batch row, head); the N x N state lives in shared memory,
 *   thread j owns value column j (N <= 1024 threads): S^T k and the output are column dot products,
 *   the rank-1 update touches the thread's own column, so a step needs no synchronization beyond
 *   the broadcast of k_t and q_t.
 * rlx_dwconv1d_causal: one thread per output element. */
#define RLX_SSM_PER_LANE 8

template <typename T>
__global__ void rlx_selective_scan(const T *__restrict__ x, const T *__restrict__ dt, const T *__restrict__ A,
                                   const T *__restrict__ Bm, const T *__restrict__ Cm, T *__restrict__ y,
                                   int64_t B, int64_t S, int64_t H, int N) {
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (warp >= B * H) return;
    const int64_t b = warp / H, h = warp % H;
    float st[RLX_SSM_PER_LANE], a[RLX_SSM_PER_LANE];
#pragma unroll
    for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
        const int n = lane + 32 * i;
        st[i] = 0.0f;
        a[i] = n < N ? rlx_f(A[h * N + n]) : 0.0f;
    }
    for (int64_t t = 0; t < S; ++t) {
        const int64_t row = b * S + t;
        const float d = rlx_f(dt[row * H + h]);
        const float dx = d * rlx_f(x[row * H + h]);
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
            const int n = lane + 32 * i;
            if (n < N) {
                st[i] = __expf(d * a[i]) * st[i] + dx * rlx_f(Bm[row * N + n]);
                acc += st[i] * rlx_f(Cm[row * N + n]);
            }
        }
        for (int off = 16; off > 0; off >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0)
            y[row * H + h] = rlx_to<T>(acc);
    }
}

template <typename T>
__global__ void rlx_gated_delta_net(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                                    const T *__restrict__ g, const T *__restrict__ beta, const T *state0,
                                    T *state1, T *__restrict__ o, int64_t S, int64_t H, int N, float scale) {
    extern __shared__ float rlx_gdn_smem[];
    float *st = rlx_gdn_smem;      /* N x N state, row i (key) major */
    float *kq = st + N * N;        /* this step's k, then q * scale */
    const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
    const int j = threadIdx.x;
    for (int i = 0; i < N && j < N; ++i)
        st[i * N + j] = state0 ? rlx_f(state0[bh * N * N + i * N + j]) : 0.0f;
    for (int64_t t = 0; t < S; ++t) {
        const int64_t off = ((b * S + t) * H + h) * N, goff = (b * S + t) * H + h;
        __syncthreads();
        if (j < N) kq[j] = rlx_f(k[off + j]);
        __syncthreads();
        const float decay = __expf(rlx_f(g[goff])), bt = rlx_f(beta[goff]);
        if (j < N) {
            float kv = 0.0f;
            for (int i = 0; i < N; ++i) {
                st[i * N + j] *= decay;
                kv += st[i * N + j] * kq[i];
            }
            const float u = bt * (rlx_f(v[off + j]) - kv);
            for (int i = 0; i < N; ++i)
                st[i * N + j] += kq[i] * u;
        }
        __syncthreads();
        if (j < N) kq[j] = rlx_f(q[off + j]) * scale;
        __syncthreads();
        if (j < N) {
            float acc = 0.0f;
            for (int i = 0; i < N; ++i)
                acc += st[i * N + j] * kq[i];
            o[off + j] = rlx_to<T>(acc);
        }
    }
    if (state1 && j < N)
        for (int i = 0; i < N; ++i)
            state1[bh * N * N + i * N + j] = rlx_to<T>(st[i * N + j]);
}

template <typename T>
__global__ void rlx_dwconv1d_causal(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ pad,
                                    T *__restrict__ y, int64_t B, int64_t S, int64_t C, int K, int reverse) {
    const int64_t n = B * S * C;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = i % C, t = (i / C) % S, b = i / (C * S);
        float acc = 0.0f;
        for (int j = 0; j < K; ++j) {
            const int64_t src = reverse ? t + (K - 1) - j : t + j - (K - 1);
            if (reverse && src >= S)
                continue;
            if (src >= 0)
                acc += rlx_f(w[c * K + j]) * rlx_f(x[(b * S + src) * C + c]);
            else if (pad)
                acc += rlx_f(w[c * K + j]) * rlx_f(pad[(b * (K - 1) + (K - 1) + src) * C + c]);
        }
        y[i] = rlx_to<T>(acc);
    }
}
