/* Attention of a few query rows over the KV cache (decode steps): one pass over a kv head's cache.
 * Needs kernels/attention.h (the softmax row). A fixed RLX kernel header: no template code.
 *
 * A decode step has one query row per head, and its time goes into reading the cache (the keys and
 * values of every position, from DRAM: the weights streamed since the last step evicted them). The
 * packed-GEMM blocks of attention.h would walk a kv head's keys and values once per query head of
 * its group and, for so few rows, call the BLAS per head. Here each cached key row is loaded once and
 * multiplied with every query row of the group (G heads x rows positions) while it sits in registers,
 * likewise each value row, and the rows ahead are prefetched (they are `kw` floats apart, a stride
 * the hardware prefetcher follows late). Loops run over hd, a compile-time constant where these inline.
 *
 * Score row r = i * G + g belongs to query position i, head g of the group; the query and output rows
 * of (i, g) are at i * ldq + g * hd. */
#ifndef RLX_KERNELS_KV_DECODE_H
#define RLX_KERNELS_KV_DECODE_H

#include <stdint.h>

/* Cache rows prefetched ahead of the one being read. */
#define RLX_KV_PREFETCH_ROWS 8

static inline __attribute__((always_inline)) void rlx_kv_prefetch(const float *row, int64_t hd)
{
    for (int64_t o = 0; o < hd; o += 16)  /* one 64-byte line per 16 floats */
        __builtin_prefetch(row + o, 0, 0);
}

/* S[r, 0:jb] = q(r) . K[j, 0:hd] for the rows * G query rows r of the group. */
static inline __attribute__((always_inline)) void rlx_kv_scores_group(float *restrict S, int64_t lds,
        const float *restrict Q, int64_t ldq, int64_t rows, int64_t G, int64_t jb, int64_t hd,
        const float *restrict K, int64_t kw)
{
    for (int64_t j = 0; j < jb; j++) {
        const float *restrict k = K + j * kw;
        if (j + RLX_KV_PREFETCH_ROWS < jb)
            rlx_kv_prefetch(k + RLX_KV_PREFETCH_ROWS * kw, hd);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t g = 0; g < G; g++) {
                const float *restrict q = Q + i * ldq + g * hd;
                float acc = 0.0f;
                #pragma omp simd reduction(+:acc)
                for (int64_t d = 0; d < hd; d++)
                    acc += q[d] * k[d];
                S[(i * G + g) * lds + j] = acc;
            }
    }
}

/* O(r) = (P[r, 0:jb] @ V[0:jb, 0:hd]) * inv[r] for the rows * G query rows r of the group. */
static inline __attribute__((always_inline)) void rlx_kv_values_group(float *restrict O, int64_t ldo,
        const float *restrict P, int64_t ldp, int64_t rows, int64_t G, int64_t jb, int64_t hd,
        const float *restrict V, int64_t kw, const float *restrict inv)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t g = 0; g < G; g++) {
            float *restrict o = O + i * ldo + g * hd;
            #pragma omp simd
            for (int64_t d = 0; d < hd; d++)
                o[d] = 0.0f;
        }
    for (int64_t j = 0; j < jb; j++) {
        const float *restrict v = V + j * kw;
        if (j + RLX_KV_PREFETCH_ROWS < jb)
            rlx_kv_prefetch(v + RLX_KV_PREFETCH_ROWS * kw, hd);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t g = 0; g < G; g++) {
                const float p = P[(i * G + g) * ldp + j];
                if (p == 0.0f)  /* a key past this row's position (the softmax zeroed it) */
                    continue;
                float *restrict o = O + i * ldo + g * hd;
                #pragma omp simd
                for (int64_t d = 0; d < hd; d++)
                    o[d] += p * v[d];
            }
    }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t g = 0; g < G; g++) {
            float *restrict o = O + i * ldo + g * hd;
            const float w = inv[i * G + g];
            #pragma omp simd
            for (int64_t d = 0; d < hd; d++)
                o[d] *= w;
        }
}

#endif /* RLX_KERNELS_KV_DECODE_H */
