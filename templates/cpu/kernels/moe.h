/* Sparse mixture-of-experts kernels (rlx/ir/ops_moe.py): the router (moe_topk, moe_gate) and the
 * expert matmul (moe_matmul). Needs kernels/threads.h, kernels/half.h, kernels/gemm.h,
 * kernels/packed_gemm.h, kernels/quant.h, kernels/qgemm_panels.h and kernels/argmax.h (rlx_isnan_f32).
 * A fixed RLX kernel header: no template code; included by generated files that need it.
 *
 * The expert weights are W[E, N, K]: expert e's [N, K] matrix is N rows of `rb` bytes, f32, f16 or bf16
 * values, or GGUF blocks (a format id of kernels/quant.h). A (token, slot) pair p = t * top_k + s
 * computes Y[p, :] = W[ids[p]] @ x, where x is X's row t (one activation per token) or p (one per
 * chosen expert). Two ways, decided in the LIR (MoeExpertPlan, rlx/ir/decisions_moe.py):
 *
 *   rlx_moe_gemv_range   one GEMV per pair over its expert's rows: the team splits the flat range of
 *                        (pair, output row) among its threads, so a decode step reads each chosen
 *                        expert's matrix once and no other expert's.
 *   rlx_moe_sort ...     pairs counted and sorted by expert (stable), their rows of X gathered, one
 *                        GEMM per expert group (f32: rlx_sgemm1; blocks: the GEMV kernels for <= 4 rows,
 *                        else dequantized panels and the packed micro-kernel; f16/bf16: a widened row
 *                        against the group's rows), then the results scattered back to their pairs.
 *
 * An id outside [0, E) gives a row of NaN, never a read outside W.
 */
#ifndef RLX_KERNELS_MOE_H
#define RLX_KERNELS_MOE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Weight kinds besides the block formats (which are >= 0). */
enum { RLX_MOE_F32 = -1, RLX_MOE_F16 = -2, RLX_MOE_BF16 = -3 };

/* ── the router ─────────────────────────────────────────────────────── */

/* a ranks before b: larger, or NaN against a number (equal values keep their order: lower id first) */
static inline int rlx_moe_before(float a, float b)
{
    const int na = rlx_isnan_f32(a), nb = rlx_isnan_f32(b);
    return na ? !nb : (!nb && a > b);
}

/* ids[t, :] = the k largest of L[t, :E], largest first (insertion into a sorted list of k). */
static void rlx_moe_topk_f32(const float *restrict L, int32_t *restrict ids, int64_t T, int64_t E, int64_t k,
                             int nt)
{
    const int ng = T * E >= (1 << 16) && nt > 1 ? nt : 1;
    #pragma omp parallel for num_threads(ng) if(ng > 1) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *restrict l = L + t * E;
        int32_t *restrict o = ids + t * k;
        int64_t n = 0;
        for (int64_t e = 0; e < E; e++) {
            const float v = l[e];
            if (n == k && !rlx_moe_before(v, l[o[k - 1]]))
                continue;
            int64_t j = n < k ? n++ : k - 1;
            while (j > 0 && rlx_moe_before(v, l[o[j - 1]])) {
                o[j] = o[j - 1];
                j--;
            }
            o[j] = (int32_t)e;
        }
    }
}

/* G[t, j] = softmax(L[t, :])[ids[t, j]], divided by their sum when `normalize`; NaN for a bad id. */
static void rlx_moe_gate_f32(const float *restrict L, const int32_t *restrict ids, float *restrict G, int64_t T,
                             int64_t E, int64_t k, int normalize, int nt)
{
    const int ng = T * E >= (1 << 16) && nt > 1 ? nt : 1;
    #pragma omp parallel for num_threads(ng) if(ng > 1) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *restrict l = L + t * E;
        float m = l[0];
        for (int64_t e = 1; e < E; e++)
            if (!rlx_isnan_f32(m) && (rlx_isnan_f32(l[e]) || l[e] > m))
                m = l[e];  /* a NaN, once met, stays the max: every weight of the row is then NaN */
        float s = 0.0f;
        for (int64_t e = 0; e < E; e++)
            s += expf(l[e] - m);
        float sel = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const int32_t e = ids[t * k + j];
            const float p = e >= 0 && e < E ? expf(l[e] - m) / s : NAN;
            G[t * k + j] = p;
            sel += p;
        }
        if (normalize)
            for (int64_t j = 0; j < k; j++)
                G[t * k + j] /= sel;
    }
}

/* ── the expert matmul ──────────────────────────────────────────────── */

/* One weight row (K values of kind wk) widened into wrow. */
static inline __attribute__((always_inline)) void rlx_moe_widen_row(const int wk, const uint8_t *restrict w,
                                                                     int64_t K, float *restrict wrow)
{
    if (wk == RLX_MOE_F16) {
        const uint16_t *restrict h = (const uint16_t *)w;
        for (int64_t c = 0; c < K; c++)
            wrow[c] = rlx_h2f(h[c]);
    } else {
        const uint16_t *restrict h = (const uint16_t *)w;
        for (int64_t c = 0; c < K; c++)
            wrow[c] = rlx_bf2f(h[c]);
    }
}

static inline __attribute__((always_inline)) float rlx_moe_dot(const float *restrict a, const float *restrict b,
                                                                int64_t K)
{
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int64_t c = 0; c < K; c++)
        s += a[c] * b[c];
    return s;
}

/* y[n] for n in [n0, n1) of rows M = 1 ... 4 of X (row stride K, outputs row stride ldy): y = x @ We^T. */
static inline __attribute__((always_inline)) void rlx_moe_gemv_rows(const int wk, const int qk, const int qb,
        int64_t M, const uint8_t *restrict We, int64_t rb, const float *X, int64_t K, float *Y, int64_t ldy,
        int64_t n0, int64_t n1, float *restrict wrow)
{
    if (wk >= 0) {
        rlx_qgemv_fmt(wk, M, ldy, K, X, We, rb, Y, n0, n1, wrow);  /* the kernel unit's rlx_qgemv_<fmt> */
        return;
    }
    for (int64_t n = n0; n < n1; n++) {
        const float *restrict w = (const float *)(We + n * rb);
        if (wk != RLX_MOE_F32) {
            rlx_moe_widen_row(wk, We + n * rb, K, wrow);
            w = wrow;
        }
        for (int64_t i = 0; i < M; i++)
            Y[i * ldy + n] = rlx_moe_dot(X + i * K, w, K);
    }
}

static inline void rlx_moe_nan_row(float *y, int64_t n0, int64_t n1)
{
    for (int64_t n = n0; n < n1; n++)
        y[n] = NAN;
}

/* The GEMV path: rows [r0, r1) of the flat (pair, output row) range of P pairs x N rows. */
static inline __attribute__((always_inline)) void rlx_moe_gemv_range(const int wk, const int qk, const int qb,
        const float *X, int x_per_pair, const int32_t *ids, int64_t top_k, const uint8_t *W, int64_t E,
        int64_t N, int64_t K, int64_t rb, float *Y, int64_t r0, int64_t r1, float *wrow)
{
    for (int64_t p = r0 / N; p * N < r1; p++) {
        const int64_t n0 = r0 > p * N ? r0 - p * N : 0, n1 = r1 < (p + 1) * N ? r1 - p * N : N;
        const int32_t e = ids[p];
        if (e < 0 || e >= E) {
            rlx_moe_nan_row(Y + p * N, n0, n1);
            continue;
        }
        const float *x = X + (x_per_pair ? p : p / top_k) * K;
        rlx_moe_gemv_rows(wk, qk, qb, 1, W + (int64_t)e * N * rb, rb, x, K, Y + p * N, N, n0, n1, wrow);
    }
}

/* The grouped path, step 1 (one thread): the pairs [c0, c1) counted and sorted by expert, stably.
 * start[e] .. start[e + 1] are expert e's positions in `order`; pairs with a bad id get NaN rows here
 * and no position (start[E] is then the number of sorted pairs). */
static void rlx_moe_sort(const int32_t *restrict ids, int64_t c0, int64_t c1, int64_t E, int64_t N, float *Y,
                         int64_t *restrict start, int32_t *restrict order)
{
    for (int64_t e = 0; e <= E; e++)
        start[e] = 0;
    for (int64_t p = c0; p < c1; p++) {
        const int32_t e = ids[p];
        if (e < 0 || e >= E)
            rlx_moe_nan_row(Y + p * N, 0, N);
        else
            start[e + 1]++;
    }
    for (int64_t e = 0; e < E; e++)
        start[e + 1] += start[e];
    /* place each pair after the ones before it: start[e] walks forward, then is restored below */
    for (int64_t p = c0; p < c1; p++) {
        const int32_t e = ids[p];
        if (e >= 0 && e < E)
            order[start[e]++] = (int32_t)(p - c0);
    }
    for (int64_t e = E; e > 0; e--)
        start[e] = start[e - 1];
    start[0] = 0;
}

/* Step 3 (every thread, its share of the columns or panels): Ys[rows of group e] = Xs[rows] @ We^T. */
static inline __attribute__((always_inline)) void rlx_moe_group_gemm(const int wk, const int qk, const int qb,
        int64_t M, const uint8_t *We, int64_t rb, const float *Xs, int64_t N, int64_t K, float *Ys, int t,
        int team, float *restrict panel, float *restrict wrow)
{
    int64_t n0, n1;
    if (M <= RLX_QGEMV_MAX_M) {  /* a small group: a GEMV over the expert's rows, split by row */
        rlx_split(N, t, team, &n0, &n1);
        rlx_moe_gemv_rows(wk, qk, qb, M, We, rb, Xs, K, Ys, N, n0, n1, wrow);
        return;
    }
    if (wk == RLX_MOE_F32) {
        rlx_split(N, t, team, &n0, &n1);
        rlx_sgemm1(0, 1, M, n1 - n0, K, Xs, K, (const float *)We + n0 * K, K, Ys + n0, N);
    } else if (wk >= 0) {
        int64_t p0, p1;
        rlx_split((N + RLX_QP - 1) / RLX_QP, t, team, &p0, &p1);
        rlx_qgemm_panels(rlx_q_dequant_panel_fn(wk), M, N, K, Xs, We, rb, Ys, p0, p1, panel, wrow);
    } else {
        rlx_split(N, t, team, &n0, &n1);
        for (int64_t n = n0; n < n1; n++) {
            rlx_moe_widen_row(wk, We + n * rb, K, wrow);
            for (int64_t i = 0; i < M; i++)
                Ys[i * N + n] = rlx_moe_dot(Xs + i * K, wrow, K);
        }
    }
}

#endif /* RLX_KERNELS_MOE_H */
