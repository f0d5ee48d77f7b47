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
#include <stdint.h>
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
#endif

#endif /* RLX_KERNELS_AMX_H */
