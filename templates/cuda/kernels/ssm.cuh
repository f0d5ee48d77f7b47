/* State-space and linear-attention recurrences on the GPU (rlx/ir/ops_ssm.py), storage type T,
 * computed in float.
 *
 * selective_scan (s_t = exp(dt_t A) s_{t-1} + dt_t x_t B_t, y_t = <s_t, C_t>, per (batch row, channel)):
 *   one warp per (batch row, channel, chunk of time); lane l keeps states n = l, l+32, ... in registers
 *   (N <= 32 * RLX_SSM_PER_LANE) and the warp reduces <s, C_t> with shuffles each step.
 *   - rlx_selective_scan: one chunk, the whole sequence in order (decode, or enough rows and channels to
 *     fill the GPU).
 *   - prefill with few rows x channels: the sequence is cut into chunks scanned in parallel in three
 *     launches. rlx_ssm_chunk_ends scans each chunk from a zero state and keeps its final state and the
 *     chunk's sum of dt (the chunk's decay is exp(A * sum dt)); rlx_ssm_chunk_carry walks the chunks of
 *     each (row, channel, n) in order, replacing each chunk's final state by the state entering it; then
 *     rlx_ssm_chunk_out scans every chunk again from its entering state and writes y. Twice the arithmetic
 *     of one pass, but (chunks) times the parallelism.
 * gated delta rule (per (batch row, head): S_t = exp(g_t) S_{t-1} + k_t u_t^T with
 *   u_t = beta_t (v_t - S^T k_t) after the decay, o_t = scale * S_t^T q_t): a column j of S (one value
 *   channel) evolves on its own, since u_t[j] and o_t[j] read column j only. rlx_gdn_columns runs one
 *   warp per (batch row, head, column), lane l holding rows i = l, l+32, ... of its column in registers;
 *   S^T k and S^T q are warp reductions. A block of RLX_GDN_COLS warps covers adjacent columns so that the
 *   carried state is read and written through shared memory in whole rows (coalesced).
 * rlx_dwconv1d_causal: one thread per output element. */
#define RLX_SSM_PER_LANE 8
#define RLX_GDN_COLS 8
#define RLX_GDN_MAX_N 256

__device__ __forceinline__ float rlx_ssm_warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* Steps t0 <= t < t1 of (batch row b, channel h) from the state st; with Y, y_t is written. Returns the sum
 * of dt over the steps. The next step's inputs are loaded while this step computes (the loads do not depend
 * on the state, so their latency leaves the recurrence's critical path). */
template <typename T, bool Y>
__device__ __forceinline__ float rlx_ssm_steps(const T *__restrict__ x, const T *__restrict__ dt,
                                               const T *__restrict__ Bm, const T *__restrict__ Cm,
                                               T *__restrict__ y, int64_t b, int64_t h, int64_t S, int64_t H,
                                               int N, int lane, int64_t t0, int64_t t1,
                                               float (&st)[RLX_SSM_PER_LANE], const float (&a)[RLX_SSM_PER_LANE]) {
    float dsum = 0.0f;
    if (t0 >= t1)
        return dsum;
    float d, xv, bv[RLX_SSM_PER_LANE], cv[RLX_SSM_PER_LANE] = {};
    auto load = [&](int64_t t, float &d_, float &x_, float (&b_)[RLX_SSM_PER_LANE], float (&c_)[RLX_SSM_PER_LANE]) {
        const int64_t row = b * S + t;
        d_ = rlx_f(dt[row * H + h]);
        x_ = rlx_f(x[row * H + h]);
#pragma unroll
        for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
            const int n = lane + 32 * i;
            b_[i] = n < N ? rlx_f(Bm[row * N + n]) : 0.0f;
            if (Y)
                c_[i] = n < N ? rlx_f(Cm[row * N + n]) : 0.0f;
        }
    };
    load(t0, d, xv, bv, cv);
    for (int64_t t = t0; t < t1; ++t) {
        float nd = 0.0f, nx = 0.0f, nb[RLX_SSM_PER_LANE] = {}, nc[RLX_SSM_PER_LANE] = {};
        if (t + 1 < t1)
            load(t + 1, nd, nx, nb, nc);
        const float dx = d * xv;
        dsum += d;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
            const int n = lane + 32 * i;
            if (n < N) {
                st[i] = __expf(d * a[i]) * st[i] + dx * bv[i];
                if (Y)
                    acc += st[i] * cv[i];
            }
        }
        if (Y) {
            acc = rlx_ssm_warp_sum(acc);
            if (lane == 0)
                y[(b * S + t) * H + h] = rlx_to<T>(acc);
        }
        d = nd;
        xv = nx;
#pragma unroll
        for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
            bv[i] = nb[i];
            if (Y)
                cv[i] = nc[i];
        }
    }
    return dsum;
}

template <typename T>
__device__ __forceinline__ void rlx_ssm_load_a(const T *__restrict__ A, int64_t h, int N, int lane,
                                               float (&a)[RLX_SSM_PER_LANE]) {
#pragma unroll
    for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
        const int n = lane + 32 * i;
        a[i] = n < N ? rlx_f(A[h * N + n]) : 0.0f;
    }
}

template <typename T>
__global__ void rlx_selective_scan(const T *__restrict__ x, const T *__restrict__ dt, const T *__restrict__ A,
                                   const T *__restrict__ Bm, const T *__restrict__ Cm, T *__restrict__ y,
                                   int64_t B, int64_t S, int64_t H, int N) {
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (warp >= B * H) return;
    const int64_t b = warp / H, h = warp % H;
    float st[RLX_SSM_PER_LANE], a[RLX_SSM_PER_LANE];
    rlx_ssm_load_a(A, h, N, lane, a);
#pragma unroll
    for (int i = 0; i < RLX_SSM_PER_LANE; ++i)
        st[i] = 0.0f;
    rlx_ssm_steps<T, true>(x, dt, Bm, Cm, y, b, h, S, H, N, lane, 0, S, st, a);
}

/* Pass 1 of the chunked scan: warp w = (b * H + h) * nch + chunk. ends[w * N + n] = the chunk's final state
 * from a zero start, dsum[w] = its sum of dt. */
template <typename T>
__global__ void rlx_ssm_chunk_ends(const T *__restrict__ x, const T *__restrict__ dt, const T *__restrict__ A,
                                   const T *__restrict__ Bm, float *__restrict__ ends,
                                   float *__restrict__ dsum, int64_t B, int64_t S, int64_t H, int N, int64_t nch,
                                   int64_t len) {
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= B * H * nch) return;
    const int64_t chunk = w % nch, bh = w / nch, b = bh / H, h = bh % H;
    const int64_t t0 = chunk * len, t1 = t0 + len < S ? t0 + len : S;
    float st[RLX_SSM_PER_LANE], a[RLX_SSM_PER_LANE];
    rlx_ssm_load_a(A, h, N, lane, a);
#pragma unroll
    for (int i = 0; i < RLX_SSM_PER_LANE; ++i)
        st[i] = 0.0f;
    const float d = rlx_ssm_steps<T, false>(x, dt, Bm, (const T *)nullptr, (T *)nullptr, b, h, S, H, N, lane, t0, t1, st, a);
#pragma unroll
    for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
        const int n = lane + 32 * i;
        if (n < N)
            ends[w * N + n] = st[i];
    }
    if (lane == 0)
        dsum[w] = d;
}

/* Pass 2: one thread per (b, h, n) walks its chunks in order; ends[] becomes the state entering each chunk. */
template <typename T>
__global__ void rlx_ssm_chunk_carry(const T *__restrict__ A, float *__restrict__ ends, const float *__restrict__ dsum,
                                    int64_t B, int64_t H, int N, int64_t nch) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * H * N) return;
    const int64_t bh = i / N, h = bh % H;
    const int n = (int)(i % N);
    const float a = rlx_f(A[h * N + n]);
    float carry = 0.0f;
    for (int64_t c = 0; c < nch; ++c) {
        const int64_t w = bh * nch + c;
        const float local = ends[w * N + n];
        ends[w * N + n] = carry;
        carry = __expf(a * dsum[w]) * carry + local;
    }
}

/* Pass 3: every chunk scanned again from the state entering it, writing y. */
template <typename T>
__global__ void rlx_ssm_chunk_out(const T *__restrict__ x, const T *__restrict__ dt, const T *__restrict__ A,
                                  const T *__restrict__ Bm, const T *__restrict__ Cm, T *__restrict__ y,
                                  const float *__restrict__ starts, int64_t B, int64_t S, int64_t H, int N,
                                  int64_t nch, int64_t len) {
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= B * H * nch) return;
    const int64_t chunk = w % nch, bh = w / nch, b = bh / H, h = bh % H;
    const int64_t t0 = chunk * len, t1 = t0 + len < S ? t0 + len : S;
    float st[RLX_SSM_PER_LANE], a[RLX_SSM_PER_LANE];
    rlx_ssm_load_a(A, h, N, lane, a);
#pragma unroll
    for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
        const int n = lane + 32 * i;
        st[i] = n < N ? starts[w * N + n] : 0.0f;
    }
    rlx_ssm_steps<T, true>(x, dt, Bm, Cm, y, b, h, S, H, N, lane, t0, t1, st, a);
}

/* Gated delta rule, one warp per (batch row, head, value column j); R registers of rows per lane (N <= 32 R).
 * Block: RLX_GDN_COLS warps, columns j0 .. j0 + RLX_GDN_COLS - 1 of one (b, h). state0 (may equal state1) is
 * the state before step 0 or null (zero); state1, when set, receives the final state. */
template <typename T, int R>
__global__ void __launch_bounds__(32 * RLX_GDN_COLS)
rlx_gdn_columns(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                const T *__restrict__ g, const T *__restrict__ beta, const T *state0, T *state1,
                T *__restrict__ o, int64_t S, int64_t H, int N, float scale) {
    __shared__ float tile[RLX_GDN_MAX_N * RLX_GDN_COLS];  /* rows i, columns j0.. of the carried state */
    const int64_t tiles = (N + RLX_GDN_COLS - 1) / RLX_GDN_COLS;
    const int64_t bh = blockIdx.x / tiles, b = bh / H, h = bh % H;
    const int j0 = (int)(blockIdx.x % tiles) * RLX_GDN_COLS;
    const int wp = threadIdx.x / 32, lane = threadIdx.x % 32, j = j0 + wp;
    const bool col = j < N;
    float s[R];
    if (state0) {
        for (int e = threadIdx.x; e < N * RLX_GDN_COLS; e += blockDim.x) {
            const int i = e / RLX_GDN_COLS, jj = e % RLX_GDN_COLS;
            tile[e] = j0 + jj < N ? rlx_f(state0[(bh * N + i) * N + j0 + jj]) : 0.0f;
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = lane + 32 * r;
        s[r] = state0 && i < N ? tile[i * RLX_GDN_COLS + wp] : 0.0f;
    }
    /* Per step, with S' = exp(g) S: u = beta (v - S'^T k), o = scale S_t^T q = scale (S'^T q + u (k . q)).
     * S'^T k, S'^T q and k . q are one joint warp reduction (three independent shuffle chains), and the
     * next step's k, q, v, g, beta are loaded while this step computes. */
    float kk[R], qq[R], vj = 0.0f, gt = 0.0f, bt = 0.0f;
    auto load = [&](int64_t t, float (&k_)[R], float (&q_)[R], float &v_, float &g_, float &b_) {
        const int64_t goff = (b * S + t) * H + h, off = goff * N;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int i = lane + 32 * r;
            k_[r] = i < N ? rlx_f(k[off + i]) : 0.0f;
            q_[r] = i < N ? rlx_f(q[off + i]) : 0.0f;
        }
        v_ = col ? rlx_f(v[off + j]) : 0.0f;
        g_ = rlx_f(g[goff]);
        b_ = rlx_f(beta[goff]);
    };
    if (S > 0)
        load(0, kk, qq, vj, gt, bt);
    for (int64_t t = 0; t < S; ++t) {
        float nk[R] = {}, nq[R] = {}, nv = 0.0f, ng = 0.0f, nb = 0.0f;
        if (t + 1 < S)
            load(t + 1, nk, nq, nv, ng, nb);
        const float decay = __expf(gt);
        float sk = 0.0f, sq = 0.0f, kq = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            s[r] *= decay;
            sk += s[r] * kk[r];
            sq += s[r] * qq[r];
            kq += kk[r] * qq[r];
        }
        for (int off = 16; off > 0; off >>= 1) {
            sk += __shfl_xor_sync(0xffffffffu, sk, off);
            sq += __shfl_xor_sync(0xffffffffu, sq, off);
            kq += __shfl_xor_sync(0xffffffffu, kq, off);
        }
        const float u = bt * (vj - sk);
#pragma unroll
        for (int r = 0; r < R; ++r)
            s[r] += kk[r] * u;
        if (lane == 0 && col)
            o[((b * S + t) * H + h) * N + j] = rlx_to<T>(scale * (sq + u * kq));
#pragma unroll
        for (int r = 0; r < R; ++r) {
            kk[r] = nk[r];
            qq[r] = nq[r];
        }
        vj = nv;
        gt = ng;
        bt = nb;
    }
    if (state1) {
        __syncthreads();
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int i = lane + 32 * r;
            if (i < N)
                tile[i * RLX_GDN_COLS + wp] = s[r];
        }
        __syncthreads();
        for (int e = threadIdx.x; e < N * RLX_GDN_COLS; e += blockDim.x) {
            const int i = e / RLX_GDN_COLS, jj = e % RLX_GDN_COLS;
            if (j0 + jj < N)
                state1[(bh * N + i) * N + j0 + jj] = rlx_to<T>(tile[e]);
        }
    }
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
