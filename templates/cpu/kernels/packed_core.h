/* The graph-independent core of the packed GEMM: the tile shape of this instruction set, the
 * micro-kernel and the packing of B. A fixed RLX kernel header: no template code; included through
 * kernels/packed_gemm.h.
 *
 * A kernel unit: the functions declared here are defined in kernels/packed_core.c, which the
 * toolchain compiles once per compiler, flags and ISA into the RLX cache and links into every
 * program whose source includes this header (rlx/toolchain/units.py). A program's own file then
 * neither parses <immintrin.h> nor optimizes the fully unrolled tiles and the packing loops again:
 * that was most of the C compiler's time for a small graph. The unit is compiled with the
 * program's own flags, so it is the same machine code it was as static functions of the program.
 * Its functions are hidden: never exported from a program.
 */
#ifndef RLX_KERNELS_PACKED_CORE_H
#define RLX_KERNELS_PACKED_CORE_H

#include <stdint.h>

/* Param storage is sized for this many columns per panel whatever the ISA, so offsets do not
 * depend on it (see kernels/packed_gemm.h for the layout). */
#define RLX_PACK_NR_MAX 32

/* The tile (RLX_MR rows x RLX_NR columns of C) of the instruction set this file is compiled for;
 * no RLX_NR: no micro-kernel (the packed GEMM falls back to the BLAS or the C GEMM). */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX512F__)
#define RLX_MR 12
#define RLX_NR 32
#elif (defined(__x86_64__) || defined(__i386__)) && defined(__AVX2__) && defined(__FMA__)
#define RLX_MR 6
#define RLX_NR 16
#endif

/* How far ahead of the kernel weights are prefetched (on Zen 5 8 KiB reached ~50 GB/s on 2 cores for
 * MiniLM's weights at 16 rows, against ~30 GB/s from the hardware prefetcher; on a 2-core AVX-512 Xeon
 * guest 16 KiB ran MiniLM (1,16) 1.51 ms against 1.57 and (8,128) 75.4 against 78.0 ms, medians of 8
 * alternating processes, 12 KiB between them: docs/architecture.md, MiniLM's thirteenth look).
 * Here, not in the unit: other kernels streaming packed weights (kernels/gemm_bf16.h) use it too. */
#define RLX_PF_BYTES 16384

#define RLX_CORE_FN __attribute__((visibility("hidden")))

/* dst <- B[0:K, 0:N] in the packed layout of kernels/packed_gemm.h (row-major, ld = N, without a
 * micro-kernel), reading B[k, n] = src[k * sk + n * sn]: the strides take any user layout (e.g. a
 * PyTorch [out, in] weight read transposed) without a transpose pass. */
RLX_CORE_FN void rlx_pack_b(float *restrict dst, const float *restrict src, int64_t K, int64_t N, int64_t sk,
                            int64_t sn);

/* set_param for a packed param: `batch` matrices, each K x N read with strides (sk, sn) and the
 * batch axes' strides (elements of the user array), stored RLX_PACK_NR_MAX-padded apart. */
RLX_CORE_FN void rlx_pack_param(float *dst, const float *src, int nbatch_axes, const int64_t *dims,
                                const int64_t *strides);

/* Matrices of a batched param (the product of its `nbatch_axes` leading dims), and the element
 * offset of matrix b in the user array (batch axes with `dims` and `strides`, the last fastest):
 * how set_param walks a batched param into packed storage (f32 here, f16/bf16 in gemm_bf16.h). */
static inline int64_t rlx_batch_count(int nbatch_axes, const int64_t *dims)
{
    int64_t count = 1;
    for (int d = 0; d < nbatch_axes; d++)
        count *= dims[d];
    return count;
}

static inline int64_t rlx_batch_offset(int64_t b, int nbatch_axes, const int64_t *dims, const int64_t *strides)
{
    int64_t off = 0;
    for (int d = nbatch_axes - 1; d >= 0; d--) {
        off += b % dims[d] * strides[d];
        b /= dims[d];
    }
    return off;
}

#ifdef RLX_NR
/* C[0:mr, 0:nr] (+)= A[0:mr, 0:kc] @ panel[0:kc, :] (+ bias[0:nr]) for any mr >= 1 (rows of A and
 * C are lda and ldc apart; the panel is kc rows of RLX_NR floats). `nr` <= RLX_NR masks the last
 * panel's columns, `accumulate` adds to what C holds, `prefetch` streams the panel from memory
 * ahead of use (the first row group of a tile). */
RLX_CORE_FN void rlx_kernel(int64_t mr, int prefetch, int64_t kc, const float *A, int64_t lda, const float *Bp,
                            float *C, int64_t ldc, int64_t nr, const float *bias, int accumulate);

/* rlx_kernel without bias or prefetch of its own panel, which the previous call brought in: each whole row group
 * instead asks for kc / 2 lines of `next` (the panel the caller multiplies next: kc rows of RLX_NR floats, or NULL),
 * a line every other k, so that a panel streamed from memory arrives while the current one is multiplied by all of
 * its rows (rlx_kernel's prefetch runs in the first row group only; for a few dozen rows of A, the weights of a
 * ResNet-18 7-wide conv, the panel then arrived at full compute speed and the other groups did no memory traffic:
 * 2 threads at 1.08 ms per 512 x 4608 x 49 product from DRAM, 0.84 ms with this). */
RLX_CORE_FN void rlx_kernel_next(int64_t mr, int64_t kc, const float *A, int64_t lda, const float *Bp, float *C,
                                 int64_t ldc, int64_t nr, int accumulate, const float *next);

/* C[0:rows, 0:cols] <- gelu(C) in place (rows ldc apart): rlx_gelu_f (kernels/scalar.h) in its vector
 * form (kernels/vgelu.h), bit for bit the same results, several vectors in flight; the erf GELU
 * epilogue of the packed GEMMs (a tile right after its store, while it is in L1). */
RLX_CORE_FN void rlx_gelu_block(float *C, int64_t ldc, int64_t rows, int64_t cols);
#endif

#if defined(RLX_NR) && RLX_NR == 32
/* Attention rows in one pass per group of RLX_MR query rows (an `AttentionPlan` of form "rows"): with K^T packed
 * in kp (panels of 32 keys, hd rows each; rlx_pack_b), for rows i < `rows` of Q (ldq apart) O[i, 0:hd] (ldo apart)
 * = softmax(scale * q_i K^T, -inf where keep[j] == 0; keep may be NULL) @ V, V[0:skv, 0:hd] read in place (ldv
 * apart, hd a multiple of 32). The scores of a group (S: RLX_MR x skv floats of scratch) stay in L1 from their
 * product to the weighted sum. The products are those of rlx_attn_scores and rlx_attn_values (kernels/attention.h),
 * in the same order; the softmax takes the scores scaled by scale log2(e) to 2^(t - max) (rlx_exp2_16_nonpos) and
 * sums each row in 16 float lanes (rlx_softmax_row: exp(s scale - max) by rlx_expf, summed in double), so the
 * values differ from the blocks form's by a few float ulps of each weight. A row whose keys are all masked is
 * zeros. */
RLX_CORE_FN void rlx_attn_rows(float *O, int64_t ldo, const float *Q, int64_t ldq, int64_t rows, const float *kp,
                               int64_t hd, const float *V, int64_t ldv, int64_t skv, float scale, const float *keep,
                               float *S);
#endif

#endif /* RLX_KERNELS_PACKED_CORE_H */
