/* The AMX tile unit's process state and tile configuration, shared by the kernels that use it (the quantized
 * matmuls' int8 products, kernels/quant_interleaved.h; bf16 GEMMs, kernels/gemm_bf16.h).
 * A fixed RLX kernel header: no template code; included by the kernel headers that need it.
 *
 * Linux hands the tile state to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA);
 * where it refuses (an older kernel, a seccomp filter), the callers run their vector paths. */
#ifndef RLX_KERNELS_AMX_H
#define RLX_KERNELS_AMX_H

#if defined(__AMX_TILE__) && defined(__linux__)
#define RLX_AMX_TILE 1
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Whether this process may use the tile registers: asked once (a capability of the process, like cpuid). */
static int rlx_amx_state;  /* 0: not asked yet, 1: granted, -1: refused */
static inline int rlx_amx_granted(void)
{
    int s = __atomic_load_n(&rlx_amx_state, __ATOMIC_RELAXED);
    if (s == 0) {  /* asking twice is harmless */
        s = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
        __atomic_store_n(&rlx_amx_state, s, __ATOMIC_RELAXED);
    }
    return s > 0;
}

/* LDTILECFG's 64-byte operand (palette 1): each tile's rows and bytes a row. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) rlx_amx_tilecfg;

/* Configure this thread's tiles: every one 16 rows (`rows` for tiles 0-5, the C and A tiles) of 64 bytes.
 * Returns 0 without the tile state (the caller's vector path then runs). */
static inline int rlx_amx_begin(int rows)
{
    if (!rlx_amx_granted())
        return 0;
    rlx_amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = (uint8_t)(t < 6 ? rows : 16);
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
    return 1;
}

#if defined(__AMX_BF16__) || defined(__AMX_INT8__)
/* The products a tile holds: bf16 pairs into f32 (TDPBF16PS), u8 x s8 quads into int32 (TDPBUSD). */
enum { RLX_AMX_BF16 = 0, RLX_AMX_U8S8 = 1 };

/* 32 x 32 sums into cb (4-byte values, 128 bytes a row): C tiles 0-1 (rows 0-15; with `two` 2-3, rows 16-31) over
 * `steps` k-steps of A tile 4 (5) times B tiles 6 (columns 0-15) and 7 (16-31), zeroed first. A's rows lda bytes
 * apart, row 16 at 16 lda; B's rows ldb bytes apart, tile 7 b_half bytes after tile 6; each step moves A a_step
 * and B b_step bytes on. With `two` 0 only cb's first 16 rows are written. */
static inline __attribute__((always_inline)) void rlx_amx_block(const int op, const int two, int64_t steps,
        const char *a, int64_t lda, int64_t a_step, const char *b, int64_t ldb, int64_t b_step, int64_t b_half,
        void *cb)
{
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
#define RLX_AMX_DP(C, A, B)        \
    do {                           \
        if (op == RLX_AMX_BF16)    \
            _tile_dpbf16ps(C, A, B); \
        else                       \
            _tile_dpbusd(C, A, B);   \
    } while (0)
#elif defined(__AMX_BF16__)
#define RLX_AMX_DP(C, A, B) _tile_dpbf16ps(C, A, B)
#else
#define RLX_AMX_DP(C, A, B) _tile_dpbusd(C, A, B)
#endif
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t s = 0; s < steps; s++, a += a_step, b += b_step) {
            _tile_loadd(4, a, lda);
            _tile_loadd(5, a + 16 * lda, lda);
            _tile_loadd(6, b, ldb);
            _tile_loadd(7, b + b_half, ldb);
            RLX_AMX_DP(0, 4, 6);
            RLX_AMX_DP(1, 4, 7);
            RLX_AMX_DP(2, 5, 6);
            RLX_AMX_DP(3, 5, 7);
        }
        _tile_stored(2, (char *)cb + 16 * 128, 128);
        _tile_stored(3, (char *)cb + 16 * 128 + 64, 128);
    } else {
        for (int64_t s = 0; s < steps; s++, a += a_step, b += b_step) {
            _tile_loadd(4, a, lda);
            _tile_loadd(6, b, ldb);
            _tile_loadd(7, b + b_half, ldb);
            RLX_AMX_DP(0, 4, 6);
            RLX_AMX_DP(1, 4, 7);
        }
    }
    _tile_stored(0, cb, 128);
    _tile_stored(1, (char *)cb + 64, 128);
#undef RLX_AMX_DP
    (void)op;
}
#endif /* AMX-BF16 or AMX-INT8 */
#endif

#endif /* RLX_KERNELS_AMX_H */
