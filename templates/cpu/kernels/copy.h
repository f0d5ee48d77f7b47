/* Strided copies (param re-layout at set_param).
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_COPY_H
#define RLX_KERNELS_COPY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ── copies ────────────────────────────────────────────────────────────── */

/* Rows a gather asks for before it copies them (templates/cpu/movement.c.j2), and the most bytes of one row it
 * asks for: the hardware prefetcher carries a row on from its first lines. */
#define RLX_GATHER_AHEAD 8
#define RLX_PREFETCH_ROW_MAX 4096

/* Ask for the first min(nbytes, RLX_PREFETCH_ROW_MAX) bytes at p, one request a cache line. */
static inline void rlx_prefetch_bytes(const char *p, size_t nbytes)
{
    const size_t n = nbytes < RLX_PREFETCH_ROW_MAX ? nbytes : RLX_PREFETCH_ROW_MAX;
    for (size_t off = 0; off < n; off += 64)
        __builtin_prefetch(p + off, 0, 3);
}

/* dst (row-major `dims`) <- src read with element strides `src_strides`: a param re-layout. */
static void rlx_permute_copy(char *dst, const char *src, int rank, const int64_t *dims,
                             const int64_t *src_strides, size_t elsize)
{
    int64_t idx[16] = {0};
    int64_t total = 1;
    for (int d = 0; d < rank; d++)
        total *= dims[d];
    for (int64_t i = 0; i < total; i++) {
        int64_t off = 0;
        for (int d = 0; d < rank; d++)
            off += idx[d] * src_strides[d];
        memcpy(dst + (size_t)i * elsize, src + (size_t)off * elsize, elsize);
        for (int d = rank - 1; d >= 0; d--) {
            if (++idx[d] < dims[d])
                break;
            idx[d] = 0;
        }
    }
}

#endif /* RLX_KERNELS_COPY_H */
