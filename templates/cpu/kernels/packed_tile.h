/* The packed GEMM's micro-kernel: the tile shape of this instruction set and rlx_kernel's prototype.
 * A fixed RLX kernel header: no template code; included through kernels/packed_gemm.h.
 *
 * rlx_kernel is a kernel unit: its definition is in kernels/packed_tile.c, which the toolchain
 * compiles once per compiler, flags and ISA into the RLX cache and links into every program whose
 * source includes this header (rlx/toolchain/units.py). A program's own file then neither parses
 * <immintrin.h> nor optimizes the fully unrolled tiles again: that was most of the C compiler's
 * time for a small graph. The unit is compiled with the program's own flags, so the kernel is the
 * same machine code it was as a static function of the program.
 */
#ifndef RLX_KERNELS_PACKED_TILE_H
#define RLX_KERNELS_PACKED_TILE_H

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

#ifdef RLX_NR
/* C[0:mr, 0:nr] (+)= A[0:mr, 0:kc] @ panel[0:kc, :] (+ bias[0:nr]) for any mr >= 1 (rows of A and
 * C are lda and ldc apart; the panel is kc rows of RLX_NR floats). `nr` <= RLX_NR masks the last
 * panel's columns, `accumulate` adds to what C holds, `prefetch` streams the panel from memory
 * ahead of use (the first row group of a tile). Hidden: never exported from a program. */
__attribute__((visibility("hidden")))
void rlx_kernel(int64_t mr, int prefetch, int64_t kc, const float *A, int64_t lda, const float *Bp, float *C,
                int64_t ldc, int64_t nr, const float *bias, int accumulate);
#endif

#endif /* RLX_KERNELS_PACKED_TILE_H */
