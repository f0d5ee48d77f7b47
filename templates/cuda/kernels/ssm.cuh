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
 *   Prefill with state size <= 64 takes the chunked (WY) form instead: rlx_gdn_chunk_prep and
 *   rlx_gdn_chunk_state, described above them.
 * A carried SSM state (selective_scan's carry_state: a recurrent cache) enters as state0 and leaves through
 *   state1, in place: rlx_selective_scan's warps and rlx_ssm_chunk_carry's threads each read and write their
 *   own entries.
 * rlx_dwconv1d_causal: one thread per output element; its carried form then runs rlx_conv_state_update. */
#define RLX_SSM_PER_LANE 8
#define RLX_GDN_COLS 8
#define RLX_GDN_MAX_N 256

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
            acc = rlx_warp_sum(acc);
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

/* The whole sequence of (batch row, channel) per warp. state0 ([B, H, N], null: zero) is the state before step
 * 0 and state1 (null: not kept) receives the final one; they may be the same buffer (a recurrent cache updated
 * in place): a warp reads its own N entries before its steps and writes the same entries after them. */
template <typename T>
__global__ void rlx_selective_scan(const T *__restrict__ x, const T *__restrict__ dt, const T *__restrict__ A,
                                   const T *__restrict__ Bm, const T *__restrict__ Cm, const T *state0, T *state1,
                                   T *__restrict__ y, int64_t B, int64_t S, int64_t H, int N) {
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (warp >= B * H) return;
    const int64_t b = warp / H, h = warp % H;
    float st[RLX_SSM_PER_LANE], a[RLX_SSM_PER_LANE];
    rlx_ssm_load_a(A, h, N, lane, a);
#pragma unroll
    for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
        const int n = lane + 32 * i;
        st[i] = state0 && n < N ? rlx_f(state0[warp * N + n]) : 0.0f;
    }
    rlx_ssm_steps<T, true>(x, dt, Bm, Cm, y, b, h, S, H, N, lane, 0, S, st, a);
    if (state1) {
#pragma unroll
        for (int i = 0; i < RLX_SSM_PER_LANE; ++i) {
            const int n = lane + 32 * i;
            if (n < N)
                state1[warp * N + n] = rlx_to<T>(st[i]);
        }
    }
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

/* Pass 2: one thread per (b, h, n) walks its chunks in order; ends[] becomes the state entering each chunk.
 * The walk starts from state0 (null: zero) and leaves the final state in state1 (null: not kept); both are
 * [B, H, N] and may be the same buffer (the thread reads its entry before it writes it). */
template <typename T>
__global__ void rlx_ssm_chunk_carry(const T *__restrict__ A, float *__restrict__ ends, const float *__restrict__ dsum,
                                    const T *state0, T *state1, int64_t B, int64_t H, int N, int64_t nch) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * H * N) return;
    const int64_t bh = i / N, h = bh % H;
    const int n = (int)(i % N);
    const float a = rlx_f(A[h * N + n]);
    float carry = state0 ? rlx_f(state0[i]) : 0.0f;
    for (int64_t c = 0; c < nch; ++c) {
        const int64_t w = bh * nch + c;
        const float local = ends[w * N + n];
        ends[w * N + n] = carry;
        carry = __expf(a * dsum[w]) * carry + local;
    }
    if (state1)
        state1[i] = rlx_to<T>(carry);
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

/* Chunked gated delta rule for prefill (state size N <= RLX_GDN_CHUNK_MAX_N). Within a chunk of C steps
 * (positions r, G_r = g's running sum in the chunk, S0 the state entering it) the delta rule unrolls to
 *   (I + A) U = diag(beta) V - diag(beta e^G) K S0,  A[r][m] = beta_r e^(G_r - G_m) k_r.k_m  (m < r),
 * so U = Ut - W S0 with Ut = (I + A)^-1 diag(beta) V and W = (I + A)^-1 diag(beta e^G) K, independent of S0
 * (the WY / UT form). Then
 *   o_r  = scale (e^(G_r) q_r S0 + sum_{m <= r} M[r][m] u_m),  M[r][m] = e^(G_r - G_m) q_r.k_m,
 *   S0' = e^(G_last) S0 + sum_m e^(G_last - G_m) k_m u_m^T.
 * rlx_gdn_chunk_prep (one block per (row, head, chunk), all chunks at once) solves for Ut and W by forward
 * substitution (a thread per column) and forms M; rlx_gdn_chunk_state (one block per (row, head, tile of
 * RLX_GDN_COLS value columns)) walks the chunks in order with its columns of the state in shared memory,
 * every step a small matrix product. Per chunk the scratch holds Ut, W (C x N each), M (C x C), G (C). */
#define RLX_GDN_CHUNK 32
#define RLX_GDN_CHUNK_MAX_N 64
#define RLX_GDN_KP (RLX_GDN_CHUNK_MAX_N + 1) /* padded row: no bank conflicts between rows */
#define RLX_GDN_CP (RLX_GDN_CHUNK + 1)

__device__ __forceinline__ int64_t rlx_gdn_segment(int N) {
    return (int64_t)RLX_GDN_CHUNK * (2 * N + RLX_GDN_CHUNK + 1);
}

template <typename T>
__global__ void __launch_bounds__(2 * RLX_GDN_CHUNK_MAX_N)
rlx_gdn_chunk_prep(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                   const T *__restrict__ g, const T *__restrict__ beta, float *__restrict__ scratch, int64_t S,
                   int64_t H, int N, int64_t nch) {
    __shared__ float Ks[RLX_GDN_CHUNK * RLX_GDN_KP], Qs[RLX_GDN_CHUNK * RLX_GDN_KP];
    __shared__ float As[RLX_GDN_CHUNK * RLX_GDN_CP], Gs[RLX_GDN_CHUNK], Bs[RLX_GDN_CHUNK];
    const int64_t w = blockIdx.x, c = w % nch, bh = w / nch, b = bh / H, h = bh % H;
    const int64_t t0 = c * RLX_GDN_CHUNK;
    const int L = (int)(S - t0 < RLX_GDN_CHUNK ? S - t0 : RLX_GDN_CHUNK);
    const int tid = threadIdx.x;
    float *seg = scratch + w * rlx_gdn_segment(N);
    float *Ut = seg, *W = seg + RLX_GDN_CHUNK * N, *M = W + RLX_GDN_CHUNK * N, *Gout = M + RLX_GDN_CHUNK * RLX_GDN_CHUNK;
    if (tid < L) {
        Gs[tid] = rlx_f(g[(b * S + t0 + tid) * H + h]);
        Bs[tid] = rlx_f(beta[(b * S + t0 + tid) * H + h]);
    }
    for (int e = tid; e < L * N; e += blockDim.x) {
        const int r = e / N, i = e % N;
        const int64_t off = ((b * S + t0 + r) * H + h) * N + i;
        Ks[r * RLX_GDN_KP + i] = rlx_f(k[off]);
        Qs[r * RLX_GDN_KP + i] = rlx_f(q[off]);
    }
    __syncthreads();
    if (tid == 0)
        for (int r = 1; r < L; ++r)
            Gs[r] += Gs[r - 1];
    __syncthreads();
    if (tid < L)
        Gout[tid] = Gs[tid];
    for (int e = tid; e < L * L; e += blockDim.x) {
        const int r = e / L, m = e % L;
        float kk = 0.0f, qk = 0.0f;
        if (m <= r)
            for (int i = 0; i < N; ++i) {
                const float km = Ks[m * RLX_GDN_KP + i];
                kk += Ks[r * RLX_GDN_KP + i] * km;
                qk += Qs[r * RLX_GDN_KP + i] * km;
            }
        const float decay = m <= r ? __expf(Gs[r] - Gs[m]) : 0.0f;
        As[r * RLX_GDN_CP + m] = m < r ? Bs[r] * decay * kk : 0.0f;
        M[r * RLX_GDN_CHUNK + m] = decay * qk;
    }
    __syncthreads();
    /* forward substitution down column `col` of [beta v | beta e^G k] */
    const int col = tid;
    if (col >= 2 * N)
        return;
    float x[RLX_GDN_CHUNK];
#pragma unroll
    for (int r = 0; r < RLX_GDN_CHUNK; ++r) {
        x[r] = 0.0f;
        if (r < L)
            x[r] = col < N ? Bs[r] * rlx_f(v[((b * S + t0 + r) * H + h) * N + col])
                           : Bs[r] * __expf(Gs[r]) * Ks[r * RLX_GDN_KP + col - N];
    }
#pragma unroll
    for (int r = 1; r < RLX_GDN_CHUNK; ++r) {
        float acc = x[r];
#pragma unroll
        for (int m = 0; m < r; ++m)
            acc -= As[r * RLX_GDN_CP + m] * x[m];
        x[r] = acc;  /* (rows past L hold garbage, never stored and never read by rows before L) */
    }
    float *dst = col < N ? Ut + col : W + (col - N);
#pragma unroll
    for (int r = 0; r < RLX_GDN_CHUNK; ++r)
        if (r < L)
            dst[r * N] = x[r];
}

template <typename T>
__global__ void __launch_bounds__(32 * RLX_GDN_COLS)
rlx_gdn_chunk_state(const T *__restrict__ q, const T *__restrict__ k, const float *__restrict__ scratch,
                    const T *state0, T *state1, T *__restrict__ o, int64_t S, int64_t H, int N, int64_t nch,
                    float scale) {
    __shared__ float St[RLX_GDN_CHUNK_MAX_N * RLX_GDN_COLS];  /* rows i, this block's columns */
    __shared__ float Ws[RLX_GDN_CHUNK * RLX_GDN_KP], Qs[RLX_GDN_CHUNK * RLX_GDN_KP], Ks[RLX_GDN_CHUNK * RLX_GDN_KP];
    __shared__ float Ms[RLX_GDN_CHUNK * RLX_GDN_CP], Us[RLX_GDN_CHUNK * RLX_GDN_COLS], Gs[RLX_GDN_CHUNK],
        Es[RLX_GDN_CHUNK];
    const int64_t tiles = (N + RLX_GDN_COLS - 1) / RLX_GDN_COLS;
    const int64_t bh = blockIdx.x / tiles, b = bh / H, h = bh % H;
    const int j0 = (int)(blockIdx.x % tiles) * RLX_GDN_COLS;
    const int tid = threadIdx.x;
    for (int e = tid; e < N * RLX_GDN_COLS; e += blockDim.x) {
        const int i = e / RLX_GDN_COLS, jj = e % RLX_GDN_COLS;
        St[e] = state0 && j0 + jj < N ? rlx_f(state0[(bh * N + i) * N + j0 + jj]) : 0.0f;
    }
    for (int64_t c = 0; c < nch; ++c) {
        const int64_t t0 = c * RLX_GDN_CHUNK;
        const int L = (int)(S - t0 < RLX_GDN_CHUNK ? S - t0 : RLX_GDN_CHUNK);
        const float *seg = scratch + (bh * nch + c) * rlx_gdn_segment(N);
        const float *Ut = seg, *W = seg + RLX_GDN_CHUNK * N, *M = W + RLX_GDN_CHUNK * N,
                    *G = M + RLX_GDN_CHUNK * RLX_GDN_CHUNK;
        __syncthreads();  /* the previous chunk is done with the tiles */
        for (int e = tid; e < L * N; e += blockDim.x) {
            const int r = e / N, i = e % N;
            const int64_t off = ((b * S + t0 + r) * H + h) * N + i;
            Ws[r * RLX_GDN_KP + i] = W[r * N + i];
            Qs[r * RLX_GDN_KP + i] = rlx_f(q[off]);
            Ks[r * RLX_GDN_KP + i] = rlx_f(k[off]);
        }
        for (int e = tid; e < L * L; e += blockDim.x)
            Ms[(e / L) * RLX_GDN_CP + e % L] = M[(e / L) * RLX_GDN_CHUNK + e % L];
        for (int e = tid; e < L * RLX_GDN_COLS; e += blockDim.x) {
            const int r = e / RLX_GDN_COLS, jj = e % RLX_GDN_COLS;
            Us[e] = j0 + jj < N ? Ut[r * N + j0 + jj] : 0.0f;
        }
        if (tid < L)
            Gs[tid] = G[tid];
        __syncthreads();
        if (tid < L)
            Es[tid] = __expf(Gs[L - 1] - Gs[tid]);
        const int r = tid / RLX_GDN_COLS, jj = tid % RLX_GDN_COLS;
        const bool mine = tid < L * RLX_GDN_COLS;
        if (mine) {  /* u_r = Ut_r - W_r S0 (this thread's element, in place) */
            float acc = Us[tid];
            for (int i = 0; i < N; ++i)
                acc -= Ws[r * RLX_GDN_KP + i] * St[i * RLX_GDN_COLS + jj];
            Us[tid] = acc;
        }
        __syncthreads();
        if (mine && j0 + jj < N) {
            float qs = 0.0f, mu = 0.0f;
            for (int i = 0; i < N; ++i)
                qs += Qs[r * RLX_GDN_KP + i] * St[i * RLX_GDN_COLS + jj];
            for (int m = 0; m <= r; ++m)
                mu += Ms[r * RLX_GDN_CP + m] * Us[m * RLX_GDN_COLS + jj];
            o[((b * S + t0 + r) * H + h) * N + j0 + jj] = rlx_to<T>(scale * (__expf(Gs[r]) * qs + mu));
        }
        __syncthreads();  /* every read of S0 is done: update it */
        const float last = __expf(Gs[L - 1]);
        for (int e = tid; e < N * RLX_GDN_COLS; e += blockDim.x) {
            const int i = e / RLX_GDN_COLS, cj = e % RLX_GDN_COLS;
            float acc = last * St[e];
            for (int m = 0; m < L; ++m)
                acc += Es[m] * Ks[m * RLX_GDN_KP + i] * Us[m * RLX_GDN_COLS + cj];
            St[e] = acc;
        }
    }
    if (state1) {
        __syncthreads();
        for (int e = tid; e < N * RLX_GDN_COLS; e += blockDim.x) {
            const int i = e / RLX_GDN_COLS, jj = e % RLX_GDN_COLS;
            if (j0 + jj < N)
                state1[(bh * N + i) * N + j0 + jj] = rlx_to<T>(St[e]);
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

/* The conv state after a carried depthwise conv (ops_ssm.DepthwiseConv1dCausal, carry_state), launched after
 * rlx_dwconv1d_causal has read the old state: state [B, K-1, C] becomes, per row b, the last K-1 rows of
 * (state, x[b, :lengths[b]]). One thread per (b, c) shifts its column in ascending order: row j takes row
 * j + len of that sequence, never one already overwritten. A length outside [0, S] raises flag bit 256 and
 * leaves the row as it was. */
template <typename T>
__global__ void rlx_conv_state_update(const T *__restrict__ x, T *__restrict__ state, const int32_t *__restrict__ lengths,
                                      int64_t B, int64_t S, int64_t C, int K, int32_t *flag) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < B * C; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / C, c = i % C, keep = K - 1, len = lengths[b];
        if (len < 0 || len > S) {
            if (c == 0) atomicOr(flag, 256);
            continue;
        }
        T *col = state + b * keep * C + c;
        for (int64_t j = 0; j < keep; ++j) {
            const int64_t src = j + len; /* into (state rows 0..keep-1, then x rows 0..len-1) */
            col[j * C] = src < keep ? col[src * C] : x[(b * S + src - keep) * C + c];
        }
    }
}
