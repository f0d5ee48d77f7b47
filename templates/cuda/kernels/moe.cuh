/* ── Sparse mixture of experts (rlx/ir/ops_moe.py): the router and the expert matmul ──────────────────────────
 * Needs kernels/quant.cuh (rlx_q_sub) for experts in GGUF block formats.
 *   rlx_moe_topk   one thread per token: the k largest logits by insertion, largest first (ties: lower id; a
 *                  NaN ranks above every number).
 *   rlx_moe_gate   one thread per token: softmax over the E logits read at the chosen ids, renormalized when
 *                  asked; a bad id gives NaN.
 *   rlx_moe_gemv / rlx_moe_qgemv   one warp per (pair, expert row): a block of RLX_MOE_WARPS warps takes
 *                  consecutive rows of one pair's expert, so a step reads only the chosen experts' weights
 *                  (the MoeExpertPlan of the LIR names this path). An id outside [0, E) gives a NaN row. */

#define RLX_MOE_WARPS 4

template <typename T>
__device__ __forceinline__ bool rlx_moe_before(T a, T b) {
    const float x = rlx_f(a), y = rlx_f(b);
    return isnan(x) ? !isnan(y) : (!isnan(y) && x > y);
}

template <typename T>
__global__ void rlx_moe_topk(const T *__restrict__ L, int32_t *__restrict__ ids, int64_t rows, int64_t E, int k) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows)
        return;
    const T *l = L + t * E;
    int32_t *o = ids + t * k;
    int n = 0;
    for (int64_t e = 0; e < E; e++) {
        const T v = l[e];
        if (n == k && !rlx_moe_before(v, l[o[k - 1]]))
            continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && rlx_moe_before(v, l[o[j - 1]])) {
            o[j] = o[j - 1];
            j--;
        }
        o[j] = (int32_t)e;
    }
}

template <typename T, typename TO>
__global__ void rlx_moe_gate(const T *__restrict__ L, const int32_t *__restrict__ ids, TO *__restrict__ G,
                             int64_t rows, int64_t E, int k, int normalize) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows)
        return;
    const T *l = L + t * E;
    float m = rlx_f(l[0]);
    for (int64_t e = 1; e < E; e++) {
        const float v = rlx_f(l[e]);
        if (!isnan(m) && (isnan(v) || v > m))
            m = v;
    }
    float s = 0.0f;
    for (int64_t e = 0; e < E; e++)
        s += expf(rlx_f(l[e]) - m);
    float sel = 0.0f;  /* two passes over the chosen ids: their sum, then each weight (no per-thread array) */
    for (int j = 0; j < k; j++) {
        const int32_t e = ids[t * k + j];
        sel += e >= 0 && e < E ? expf(rlx_f(l[e]) - m) / s : __int_as_float(0x7fc00000);
    }
    for (int j = 0; j < k; j++) {
        const int32_t e = ids[t * k + j];
        const float p = e >= 0 && e < E ? expf(rlx_f(l[e]) - m) / s : __int_as_float(0x7fc00000);
        G[t * k + j] = rlx_to<TO>(normalize ? p / sel : p);
    }
}

/* The pair and expert row of this warp; false when past the last row. */
__device__ __forceinline__ bool rlx_moe_row(int64_t N, int64_t *pair, int64_t *n) {
    const int64_t blocks_per_pair = (N + RLX_MOE_WARPS - 1) / RLX_MOE_WARPS;
    *pair = (int64_t)blockIdx.x / blocks_per_pair;
    *n = ((int64_t)blockIdx.x % blocks_per_pair) * RLX_MOE_WARPS + (threadIdx.x >> 5);
    return *n < N;
}

/* Y[p, n] = W[ids[p], n, :] . x(p) for float weights WT. */
template <typename T, typename WT, typename TO>
__global__ void __launch_bounds__(32 * RLX_MOE_WARPS)
rlx_moe_gemv(const T *__restrict__ X, int x_per_pair, const int32_t *__restrict__ ids, int top_k,
             const WT *__restrict__ W, TO *__restrict__ Y, int64_t E, int64_t N, int64_t K) {
    int64_t p, n;
    if (!rlx_moe_row(N, &p, &n))
        return;  /* the whole warp */
    const int lane = threadIdx.x & 31;
    const int32_t e = ids[p];
    if (e < 0 || e >= E) {
        if (lane == 0)
            Y[p * N + n] = rlx_to<TO>(__int_as_float(0x7fc00000));
        return;
    }
    const T *x = X + (x_per_pair ? p : p / top_k) * K;
    const WT *w = W + ((int64_t)e * N + n) * K;
    float a = 0.0f;
    for (int64_t c = lane; c < K; c += 32)
        a = fmaf(rlx_f(x[c]), rlx_f(w[c]), a);
    for (int o = 16; o > 0; o >>= 1)
        a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0)
        Y[p * N + n] = rlx_to<TO>(a);
}

/* The same for experts in a GGUF block format: rows of RB bytes, 32-value sub-blocks dealt to the lanes. */
template <typename T, typename TO, int FMT, int QK, int QB>
__global__ void __launch_bounds__(32 * RLX_MOE_WARPS)
rlx_moe_qgemv(const T *__restrict__ X, int x_per_pair, const int32_t *__restrict__ ids, int top_k,
              const uint8_t *__restrict__ W, TO *__restrict__ Y, int64_t E, int64_t N, int64_t K, int64_t RB) {
    int64_t p, n;
    if (!rlx_moe_row(N, &p, &n))
        return;
    const int lane = threadIdx.x & 31;
    const int32_t e = ids[p];
    if (e < 0 || e >= E) {
        if (lane == 0)
            Y[p * N + n] = rlx_to<TO>(__int_as_float(0x7fc00000));
        return;
    }
    const T *x = X + (x_per_pair ? p : p / top_k) * K;
    const uint8_t *row = W + ((int64_t)e * N + n) * RB;
    float a = 0.0f;
    for (int64_t s = lane; s < K / 32; s += 32) {
        float v[32];
        rlx_q_sub<FMT>(row + (s / (QK / 32)) * QB, (int)(s % (QK / 32)), v);
#pragma unroll
        for (int i = 0; i < 32; i++)
            a = fmaf(rlx_f(x[s * 32 + i]), v[i], a);
    }
    for (int o = 16; o > 0; o >>= 1)
        a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0)
        Y[p * N + n] = rlx_to<TO>(a);
}

/* ── the grouped path (prefill): pairs sorted by expert, one tiled GEMM per expert group ───────────────────────
 * rlx_moe_sort (one thread; scratch: start[E + 1], tile_off[E + 1], order[P] int32) counts the pairs per expert,
 * lists them stably by expert and numbers the 32-pair tiles of each group; a pair with a bad id gets its NaN
 * row here. rlx_moe_group_gemm: block (x: 32 rows of the expert, y: one 32-pair tile of some group; blocks past
 * the last tile exit), 256 threads; chunks of 32 of K through shared memory (the pairs' activations, and the
 * expert's rows widened or dequantized one 32-value sub-block per row), each thread 4 outputs. Every expert
 * some token chose is read once per 32 pairs; no other expert is read. */

#define RLX_MOE_TILE 32

template <typename TO>
__global__ void rlx_moe_sort(const int32_t *__restrict__ ids, int64_t P, int64_t E, int64_t N, TO *__restrict__ Y,
                             int32_t *__restrict__ start, int32_t *__restrict__ tile_off, int32_t *__restrict__ order) {
    if (threadIdx.x != 0 || blockIdx.x != 0)
        return;
    for (int64_t e = 0; e <= E; e++)
        start[e] = 0;
    for (int64_t p = 0; p < P; p++) {
        const int32_t e = ids[p];
        if (e >= 0 && e < E) {
            start[e + 1]++;
        } else {
            for (int64_t n = 0; n < N; n++)
                Y[p * N + n] = rlx_to<TO>(__int_as_float(0x7fc00000));
        }
    }
    tile_off[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        tile_off[e + 1] = tile_off[e] + (start[e + 1] + RLX_MOE_TILE - 1) / RLX_MOE_TILE;
        start[e + 1] += start[e];
    }
    for (int64_t p = 0; p < P; p++) {  /* start[e] walks forward over e's places, then is restored */
        const int32_t e = ids[p];
        if (e >= 0 && e < E)
            order[start[e]++] = (int32_t)p;
    }
    for (int64_t e = E; e > 0; e--)
        start[e] = start[e - 1];
    start[0] = 0;
}

/* FMT < 0: float experts of type WT ([E, N, K]); else a block format of quant.cuh ([E, N, RB] bytes, K % 32 == 0). */
template <typename T, typename WT, typename TO, int FMT, int QK, int QB>
__global__ void __launch_bounds__(256)
rlx_moe_group_gemm(const T *__restrict__ X, int x_per_pair, int top_k, const WT *__restrict__ W,
                   const uint8_t *__restrict__ Wq, TO *__restrict__ Y, const int32_t *__restrict__ start,
                   const int32_t *__restrict__ tile_off, const int32_t *__restrict__ order, int64_t E, int64_t N,
                   int64_t K, int64_t RB) {
    __shared__ float xs[RLX_MOE_TILE][RLX_MOE_TILE + 1];  /* [pair][k] */
    __shared__ float ws[RLX_MOE_TILE][RLX_MOE_TILE + 1];  /* [row][k] */
    const int64_t tile = blockIdx.y;
    if (tile >= tile_off[E])
        return;  /* the whole block */
    int64_t lo = 0, hi = E - 1;  /* the expert whose tiles hold this one: tile_off[e] <= tile < tile_off[e + 1] */
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (tile_off[mid] <= tile)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int64_t e = lo, first = start[e] + (tile - tile_off[e]) * RLX_MOE_TILE;
    const int64_t count = start[e + 1] - first < RLX_MOE_TILE ? start[e + 1] - first : RLX_MOE_TILE;
    const int64_t n0 = (int64_t)blockIdx.x * RLX_MOE_TILE;
    const int tx = threadIdx.x % RLX_MOE_TILE, ty = threadIdx.x / RLX_MOE_TILE;  /* 32 x 8 */
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t k0 = 0; k0 < K; k0 += RLX_MOE_TILE) {
        for (int i = ty; i < RLX_MOE_TILE; i += 8) {  /* the tile's activations: pair i, column k0 + tx */
            float v = 0.0f;
            if (i < count && k0 + tx < K) {
                const int64_t p = order[first + i];
                v = rlx_f(X[(x_per_pair ? p : p / top_k) * K + k0 + tx]);
            }
            xs[i][tx] = v;
        }
        if (FMT < 0) {
            for (int r = ty; r < RLX_MOE_TILE; r += 8)
                ws[r][tx] = n0 + r < N && k0 + tx < K ? rlx_f(W[(e * N + n0 + r) * K + k0 + tx]) : 0.0f;
        } else if (ty == 0) {  /* one sub-block of 32 values per row */
            float v[32];
            if (n0 + tx < N) {
                const uint8_t *row = Wq + (e * N + n0 + tx) * RB;
                const int64_t s = k0 / 32;
                rlx_q_sub<(FMT < 0 ? 0 : FMT)>(row + (s / (QK / 32)) * QB, (int)(s % (QK / 32)), v);
            } else {
                for (int i = 0; i < 32; i++)
                    v[i] = 0.0f;
            }
            for (int i = 0; i < 32; i++)
                ws[tx][i] = v[i];
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < RLX_MOE_TILE; kk++) {
            const float w = ws[tx][kk];
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[q] = fmaf(xs[ty + 8 * q][kk], w, acc[q]);
        }
        __syncthreads();
    }
    if (n0 + tx < N)
        for (int q = 0; q < 4; q++)
            if (ty + 8 * q < count)
                Y[(int64_t)order[first + ty + 8 * q] * N + n0 + tx] = rlx_to<TO>(acc[q]);
}
