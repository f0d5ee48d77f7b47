/* Strided copies (param re-layout at set_param).
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_COPY_H
#define RLX_KERNELS_COPY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ── copies ────────────────────────────────────────────────────────────── */

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
