/* Attention of a few query rows over the KV cache (decode steps, speculative verification).
 * Needs kernels/scalar.h (rlx_exp_shifted_sum). A fixed RLX kernel header: no template code.
 *
 * Batch invariance: a query row's result depends only on its own query and the cache rows it sees,
 * never on how many rows the step has (one decode row, the k+1 rows of a speculative verification),
 * how many sequences share the step, or how many threads run it. So each (batch row, query position,
 * kv head) is one task that reads its keys in order and takes each of its G query heads' softmax and
 * weighted values serially (rlx_kv_decode_group); the team shares the tasks, not the keys of one task.
 * A sequence then gets the same logits whether it decodes alone or among others, and a verification
 * step the same as the one-row steps it replaces: greedy speculative decoding yields exactly the plain
 * greedy tokens. A task reads each cache row of its kv head once for its G heads. */
#ifndef RLX_KERNELS_KV_DECODE_H
#define RLX_KERNELS_KV_DECODE_H

#include <math.h>
#include <stdint.h>

/* Cache rows prefetched ahead of the one being read: a 16-row SmolLM2 step at 128 tokens of context reads 95 MB
 * of f32 cache, each task a head's 256 of every 768 bytes; 16 rows ahead, into L2 (a C driver over 30 layers of
 * 16 sequences, one thread: 17.1 ms a step with 4 rows ahead as non-temporal prefetches, 9.3 with 16 into L1,
 * 7.7-7.8 with 16 into L2: 12 GB/s of the thread's 14 GB/s streaming read; the non-temporal hint left it at 6). */
#define RLX_KV_PREFETCH_ROWS 16
/* The most query heads per kv head a decode task takes (c_decoder.py refuses more for the decode path). */
#define RLX_KV_MAX_GROUP 64

static inline __attribute__((always_inline)) void rlx_kv_prefetch(const float *row, int64_t n)
{
    for (int64_t o = 0; o < n; o += 16)  /* one 64-byte line per 16 floats */
        __builtin_prefetch(row + o, 0, 2);
}

/* Cache row t of a sequence: K + t * kw in the contiguous layout (pages NULL), else row t % P of page
 * pages[t / P] of the pool K (the paged layout: pages is the sequence's block table). */
static inline __attribute__((always_inline)) const float *rlx_kv_row(const float *K, const int32_t *pages,
        int64_t P, int64_t t, int64_t kw)
{
    return pages ? K + ((int64_t)pages[t / P] * P + t % P) * kw : K + t * kw;
}

/* For the G query heads of one kv head: o[g * HD:(g + 1) * HD] = softmax(scale * q_g . K[j]) @ V over
 * cache rows lo + j, j < n (q_g at q + g * HD; K and V: rows kw floats apart, this kv head's columns;
 * through the block table `pages` of P-row pages when it is not NULL, see rlx_kv_row). Each
 * cache row is read once for the G heads; each head's arithmetic is its own, in cache order, so a
 * head's result is the same as computed alone, and the same in either layout. s: scratch of G * n floats. */
static inline __attribute__((always_inline)) void rlx_kv_decode_group(float *restrict o, float *restrict s,
        const float *restrict q, int64_t G, int64_t HD, const float *restrict K, const float *restrict V,
        int64_t kw, int64_t n, float scale, const int32_t *pages, int64_t P, int64_t lo)
{
    float m[RLX_KV_MAX_GROUP];
    for (int64_t g = 0; g < G; g++)
        m[g] = -INFINITY;
    for (int64_t j = 0; j < n; j++) {  /* scores, in cache order */
        const float *restrict k = rlx_kv_row(K, pages, P, lo + j, kw);
        if (j + RLX_KV_PREFETCH_ROWS < n)
            rlx_kv_prefetch(rlx_kv_row(K, pages, P, lo + j + RLX_KV_PREFETCH_ROWS, kw), HD);
        for (int64_t g = 0; g < G; g++) {
            const float *restrict qg = q + g * HD;
            float acc = 0.0f;
            #pragma omp simd reduction(+:acc)
            for (int64_t d = 0; d < HD; d++)
                acc += qg[d] * k[d];
            const float sc = acc * scale;
            s[g * n + j] = sc;
            m[g] = sc > m[g] ? sc : m[g];
        }
    }
    double l[RLX_KV_MAX_GROUP];
    for (int64_t g = 0; g < G; g++) {
        l[g] = rlx_exp_shifted_sum(s + g * n, n, m[g]);  /* s <- exp(s - m) */
        float *restrict og = o + g * HD;
        #pragma omp simd
        for (int64_t d = 0; d < HD; d++)
            og[d] = 0.0f;
    }
    for (int64_t j = 0; j < n; j++) {  /* weighted values, in cache order */
        const float *restrict v = rlx_kv_row(V, pages, P, lo + j, kw);
        if (j + RLX_KV_PREFETCH_ROWS < n)
            rlx_kv_prefetch(rlx_kv_row(V, pages, P, lo + j + RLX_KV_PREFETCH_ROWS, kw), HD);
        for (int64_t g = 0; g < G; g++) {
            const float e = s[g * n + j];
            if (e == 0.0f)
                continue;
            float *restrict og = o + g * HD;
            #pragma omp simd
            for (int64_t d = 0; d < HD; d++)
                og[d] += e * v[d];
        }
    }
    for (int64_t g = 0; g < G; g++) {
        const float inv = (float)(1.0 / l[g]);
        float *restrict og = o + g * HD;
        #pragma omp simd
        for (int64_t d = 0; d < HD; d++)
            og[d] *= inv;
    }
}

#endif /* RLX_KERNELS_KV_DECODE_H */
