/* Attention of a few query rows over the KV cache (decode steps, speculative verification).
 * Needs kernels/scalar.h (rlx_exp_shifted_sum). A fixed RLX kernel header: no template code.
 *
 * Batch invariance: a query row's result depends only on its own query and the cache rows it sees,
 * never on how many rows the step has (one decode row, the k+1 rows of a speculative verification),
 * how many sequences share the step, or how many threads run it. So each (batch row, query position,
 * head) is one task that reads its keys in order, takes their softmax and weighted values serially
 * (rlx_kv_decode_row); the team shares the tasks, not the keys of one task. A sequence then gets the
 * same logits whether it decodes alone or among others, and a verification step the same as the
 * one-row steps it replaces: greedy speculative decoding yields exactly the plain greedy tokens.
 *
 * Heads of one kv head read the same cache rows; tasks are ordered head by head within a query row,
 * so a static schedule gives each thread neighbouring heads and the G readers of a kv head's rows
 * mostly find them in cache. */
#ifndef RLX_KERNELS_KV_DECODE_H
#define RLX_KERNELS_KV_DECODE_H

#include <math.h>
#include <stdint.h>

/* Cache rows prefetched ahead of the one being read. */
#define RLX_KV_PREFETCH_ROWS 4

static inline __attribute__((always_inline)) void rlx_kv_prefetch(const float *row, int64_t n)
{
    for (int64_t o = 0; o < n; o += 16)  /* one 64-byte line per 16 floats */
        __builtin_prefetch(row + o, 0, 0);
}

/* o[0:HD] = softmax(scale * q . K[j]) @ V over cache rows j < n (K and V: rows kw floats apart, this
 * head's columns). s: scratch of n floats. */
static inline __attribute__((always_inline)) void rlx_kv_decode_row(float *restrict o, float *restrict s,
        const float *restrict q, int64_t HD, const float *restrict K, const float *restrict V, int64_t kw,
        int64_t n, float scale)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {  /* scores, in cache order */
        const float *restrict k = K + j * kw;
        if (j + RLX_KV_PREFETCH_ROWS < n)
            rlx_kv_prefetch(k + RLX_KV_PREFETCH_ROWS * kw, HD);
        float acc = 0.0f;
        #pragma omp simd reduction(+:acc)
        for (int64_t d = 0; d < HD; d++)
            acc += q[d] * k[d];
        s[j] = acc * scale;
        m = s[j] > m ? s[j] : m;
    }
    const double l = rlx_exp_shifted_sum(s, n, m);  /* s <- exp(s - m) */
    #pragma omp simd
    for (int64_t d = 0; d < HD; d++)
        o[d] = 0.0f;
    for (int64_t j = 0; j < n; j++) {  /* weighted values, in cache order */
        const float e = s[j];
        if (j + RLX_KV_PREFETCH_ROWS < n)
            rlx_kv_prefetch(V + (j + RLX_KV_PREFETCH_ROWS) * kw, HD);
        if (e == 0.0f)
            continue;
        const float *restrict v = V + j * kw;
        #pragma omp simd
        for (int64_t d = 0; d < HD; d++)
            o[d] += e * v[d];
    }
    const float inv = (float)(1.0 / l);
    #pragma omp simd
    for (int64_t d = 0; d < HD; d++)
        o[d] *= inv;
}

#endif /* RLX_KERNELS_KV_DECODE_H */
