/* ── The exchange buffers of a CUDA clique (one per rank, mapped into every rank's process by rlx_set_nccl) ────────
 * What the one-shot all-reduce (kernels/collectives.cuh) and the split dense GEMV's reduce that sums over the clique
 * (kernels/dense_gemv_ar.cuh) share: the buffer's layout, its flags and the call counter. A buffer is
 *   [2 parities][world slots of RLX_AR_SLOT_BYTES]   each rank's values of a call
 *   RLX_AR_FLAGS_BYTES of words:                      [2][RLX_AR_MAX_WORLD] flags, this rank's call counter, a
 *                                                     count of the blocks of a call that are done
 *   [2][RLX_AR_MAX_WORLD][RLX_AR_MAX_BLOCKS] words    per-block flags (a multi-block call: block b of every rank
 *                                                     exchanges the same columns)
 * Call e (counted on the device, so replays of a captured CUDA graph count too) uses parity e & 1 and flag value e;
 * every call, of either kind, waits for every rank's flags of its parity before it reads a slot, and a rank raises a
 * flag of call e + 1 only after its call e (which read the slots) has finished, so a rank writes call e + 2's values
 * into a slot only after every rank has finished call e. */
#define RLX_AR_MAX_WORLD 8
#ifndef RLX_AR_SLOT_BYTES
#define RLX_AR_SLOT_BYTES (128 << 10)
#endif
#define RLX_AR_FLAGS_BYTES 256
#define RLX_AR_MAX_BLOCKS 64
#define RLX_AR_BLOCK_FLAGS_BYTES (2 * RLX_AR_MAX_WORLD * RLX_AR_MAX_BLOCKS * 4)
/* words of the flags region after the flags */
#define RLX_AR_COUNTER (2 * RLX_AR_MAX_WORLD)
#define RLX_AR_DONE (2 * RLX_AR_MAX_WORLD + 1)
/* spins (~1 ns each) before a rank that never raises its flag fails the kernel (a trap: the run reports a CUDA
   error) instead of hanging the GPU */
#define RLX_AR_SPIN_LIMIT (1LL << 35)

struct RlxArPeers {
    char *buf[RLX_AR_MAX_WORLD];  /* every rank's exchange buffer, mapped into this process (own one at [rank]) */
};

static inline size_t rlx_ar_buffer_bytes(int world) {
    return 2 * (size_t)world * RLX_AR_SLOT_BYTES + RLX_AR_FLAGS_BYTES + RLX_AR_BLOCK_FLAGS_BYTES;
}

/* Rank `from`'s slot of parity `par` in a buffer */
__host__ __device__ __forceinline__ char *rlx_ar_slot(char *buf, int world, int par, int from) {
    return buf + ((size_t)par * world + from) * RLX_AR_SLOT_BYTES;
}

/* The flags region of a buffer */
__host__ __device__ __forceinline__ uint32_t *rlx_ar_flags(char *buf, int world) {
    return (uint32_t *)(buf + 2 * (size_t)world * RLX_AR_SLOT_BYTES);
}

/* Rank `from`'s flag of block b in parity `par` of a buffer */
__host__ __device__ __forceinline__ uint32_t *rlx_ar_block_flag(char *buf, int world, int par, int from, int b) {
    return rlx_ar_flags(buf, world) + RLX_AR_FLAGS_BYTES / 4 + ((size_t)par * RLX_AR_MAX_WORLD + from) * RLX_AR_MAX_BLOCKS + b;
}

/* A flag store every earlier store of this thread (and, after a barrier, of its block) is ordered before, at system
   scope; and the load that pairs with it */
__device__ __forceinline__ void rlx_ar_release(uint32_t *p, uint32_t v) {
#ifdef RLX_AR_EMU
    std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release);
#else
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}

__device__ __forceinline__ uint32_t rlx_ar_acquire(const uint32_t *p) {
#ifdef RLX_AR_EMU
    return std::atomic_ref<uint32_t>(*(uint32_t *)p).load(std::memory_order_acquire);
#else
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}

/* The call's number (the last one this rank finished + 1), read by every block before it signals anything (all
   the block's threads call it) */
__device__ __forceinline__ uint32_t rlx_ar_call(const RlxArPeers &peers, int rank, int world) {
    __shared__ uint32_t epoch;
    if (threadIdx.x == 0)
        epoch = rlx_ar_flags(peers.buf[rank], world)[RLX_AR_COUNTER] + 1;
    __syncthreads();
    return epoch;
}

/* Spin until *f holds e (a rank's flag of call e) */
__device__ __forceinline__ void rlx_ar_await(const uint32_t *f, uint32_t e) {
    for (long long spins = 0; rlx_ar_acquire(f) != e; ++spins)
        if (spins > RLX_AR_SPIN_LIMIT)
            __trap();
}
