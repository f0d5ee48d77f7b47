/* Attention of a few query rows over the KV cache (decode steps), split over the cached keys.
 * Needs kernels/scalar.h (rlx_expf, rlx_exp_shifted_sum). A fixed RLX kernel header: no template code.
 *
 * A decode step has one query row per head, and its attention time goes into reading the cache: the
 * keys and values of every position, from DRAM (the weights streamed since the last step evicted
 * them). So each thread takes a contiguous range of cache rows of a batch row and reads each row once,
 * for every head (the cache row holds all kv heads side by side): it computes every head's scores over
 * its range, their local softmax (max m, sum l of exp(s - m)) and the unnormalized weighted sum o of
 * its values (rlx_kv_decode_part); the ranges then merge as in split-K ("flash decoding") attention,
 * out = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c with M = max_c m_c (rlx_kv_decode_merge).
 *
 * Rows r = i * H + h: query position i (of SQ) and head h (of H; kv head h / G). A partial result is
 * HD + 2 floats per row: m, l, then o[0:HD]. */
#ifndef RLX_KERNELS_KV_DECODE_H
#define RLX_KERNELS_KV_DECODE_H

#include <math.h>
#include <stdint.h>

/* Cache rows prefetched ahead of the one being read (they are kw floats apart). */
#define RLX_KV_PREFETCH_ROWS 4

static inline __attribute__((always_inline)) void rlx_kv_prefetch(const float *row, int64_t n)
{
    for (int64_t o = 0; o < n; o += 16)  /* one 64-byte line per 16 floats */
        __builtin_prefetch(row + o, 0, 0);
}

/* The partial results of cache rows [j0, j1) of one batch row: Q its SQ query rows (QW floats apart),
 * K and V its cache (rows of kw floats), pos the cache rows it held before this step (query i sees
 * rows j <= pos + i; with a sliding window W > 0, only rows j > pos + i - W). S: scratch of
 * SQ * H * (j1 - j0) floats. */
static inline __attribute__((always_inline)) void rlx_kv_decode_part(float *restrict part, float *restrict S,
        const float *restrict Q, int64_t SQ, int64_t H, int64_t G, int64_t HD, int64_t QW,
        const float *restrict K, const float *restrict V, int64_t kw, int64_t j0, int64_t j1, int64_t pos,
        float scale, int64_t window)
{
    const int64_t n = j1 - j0, R = SQ * H;
    for (int64_t j = j0; j < j1; j++) {  /* scores: each key row once, for every head */
        const float *restrict k = K + j * kw;
        if (j + RLX_KV_PREFETCH_ROWS < j1)
            rlx_kv_prefetch(k + RLX_KV_PREFETCH_ROWS * kw, kw);
        for (int64_t r = 0; r < R; r++) {
            const float *restrict q = Q + (r / H) * QW + (r % H) * HD;
            const float *restrict kh = k + (r % H) / G * HD;
            float acc = 0.0f;
            #pragma omp simd reduction(+:acc)
            for (int64_t d = 0; d < HD; d++)
                acc += q[d] * kh[d];
            S[r * n + (j - j0)] = acc;
        }
    }
    for (int64_t r = 0; r < R; r++) {  /* local softmax: s <- exp(s * scale - m), 0 past the row's keys */
        float *restrict s = S + r * n;
        float *restrict p = part + r * (HD + 2);
        const int64_t seen = pos + r / H + 1 - j0;
        const int64_t nv = seen < 0 ? 0 : (seen < n ? seen : n);
        /* keys of this range before the window's first one (pos + r/H + 1 - window) get weight 0 */
        const int64_t cut = window > 0 ? pos + r / H + 1 - window - j0 : 0;
        const int64_t first = cut < 0 ? 0 : (cut < nv ? cut : nv);
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (int64_t j = first; j < nv; j++) {
            s[j] *= scale;
            m = s[j] > m ? s[j] : m;
        }
        const double l = rlx_exp_shifted_sum(s + first, nv - first, m);
        for (int64_t j = 0; j < first; j++)
            s[j] = 0.0f;
        for (int64_t j = nv; j < n; j++)
            s[j] = 0.0f;
        p[0] = m;
        p[1] = (float)l;
        #pragma omp simd
        for (int64_t d = 0; d < HD; d++)
            p[2 + d] = 0.0f;
    }
    for (int64_t j = j0; j < j1; j++) {  /* o += e * v: each value row once, for every head */
        const float *restrict v = V + j * kw;
        if (j + RLX_KV_PREFETCH_ROWS < j1)
            rlx_kv_prefetch(v + RLX_KV_PREFETCH_ROWS * kw, kw);
        for (int64_t r = 0; r < R; r++) {
            const float e = S[r * n + (j - j0)];
            if (e == 0.0f)  /* a key past this row's position */
                continue;
            const float *restrict vh = v + (r % H) / G * HD;
            float *restrict o = part + r * (HD + 2) + 2;
            #pragma omp simd
            for (int64_t d = 0; d < HD; d++)
                o[d] += e * vh[d];
        }
    }
}

/* out[0:HD] of one row from the partial results of `parts` ranges (each `stride` floats after the last). */
static inline __attribute__((always_inline)) void rlx_kv_decode_merge(float *restrict out,
        const float *restrict part, int64_t stride, int parts, int64_t HD)
{
    float M = -INFINITY;
    double L = 0.0;
    for (int c = 0; c < parts; c++)
        M = part[c * stride] > M ? part[c * stride] : M;
    #pragma omp simd
    for (int64_t d = 0; d < HD; d++)
        out[d] = 0.0f;
    if (M == -INFINITY)  /* no key at all (cannot happen: a row sees at least its own) */
        return;
    for (int c = 0; c < parts; c++) {
        const float *restrict p = part + c * stride;
        if (p[0] == -INFINITY)  /* an empty range */
            continue;
        const float w = rlx_expf(p[0] - M);
        L += (double)w * (double)p[1];
        #pragma omp simd
        for (int64_t d = 0; d < HD; d++)
            out[d] += w * p[2 + d];
    }
    const float inv = (float)(1.0 / L);
    #pragma omp simd
    for (int64_t d = 0; d < HD; d++)
        out[d] *= inv;
}

#endif /* RLX_KERNELS_KV_DECODE_H */
