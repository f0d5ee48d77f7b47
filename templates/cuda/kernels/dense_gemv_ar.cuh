/* ── A row-parallel dense GEMV summed over the clique where it is made (an `AllReduceP2P` with `gemv`) ──────────────
 * In a tensor-parallel decode step the attention output and FFN down projections are row-parallel: each rank's GEMV
 * (kernels/dense_gemv.cuh, K split over blocks) gives a partial row that the one-shot all-reduce then sums over the
 * ranks (kernels/collectives.cuh), a kernel and a round trip between the ranks after the GEMV. Here the split GEMV's
 * blocks store their f32 partials straight into every rank's exchange buffer (kernels/exchange.cuh: NVLink / PCIe
 * stores while the GEMV still runs), the block arriving last raises this rank's flag of the call in every buffer,
 * and rlx_dgemv_reduce_ar, launched right after, waits for every rank's flag and adds: each rank's splits in split
 * order, rounded to T (the row that rank's rlx_dgemv_reduce would give), then the ranks in rank order in f32, rounded
 * to T, then the residual (RES): the bits of rlx_dgemv_reduce + rlx_all_reduce_p2p on every rank. The all-reduce's
 * own kernel does not run. Plain EPI only (one member, no norm in the epilogue: the residual add is the sum's). */

/* rlx_dgemv's sink for a split block's sums: every rank's partials slot of this call's parity (W ranks) */
template <int W>
struct RlxDgemvExchange {
    const RlxArPeers *peers;
    int rank;
    uint32_t e;
    float *dst[W];
    /* after the kernel's wait: the call's number (the last one this rank finished + 1) and its slots */
    __device__ __forceinline__ void begin() {
        e = rlx_ar_flags(peers->buf[rank], W)[RLX_AR_COUNTER] + 1;
#pragma unroll
        for (int r = 0; r < W; r++)
            dst[r] = rlx_ar_part(peers->buf[r], W, (int)(e & 1), rank);
    }
    __device__ __forceinline__ void put(int64_t i, float v) const {
#pragma unroll
        for (int r = 0; r < W; r++)
            dst[r][i] = v;
    }
    /* after the block's barrier: its stores before its arrival; the last block to arrive raises the flag of call e
       (with the split count) in every buffer and records e as this rank's last call */
    __device__ __forceinline__ void end() const {
        if (threadIdx.x != 0)
            return;
        uint32_t *own = rlx_ar_flags(peers->buf[rank], W);
        __threadfence_system();
        const unsigned blocks = gridDim.x * gridDim.y;
        if (atomicAdd(own + RLX_AR_ARRIVALS, 1u) + 1u != blocks)
            return;
        own[RLX_AR_ARRIVALS] = 0u;  /* (the next call's blocks start after this kernel ends) */
        __threadfence_system();      /* every block's stores, fenced before its arrival, before the flags */
        const int par = (int)(e & 1);
#pragma unroll
        for (int r = 0; r < W; r++) {
            uint32_t *fl = rlx_ar_flags(peers->buf[r], W);
            fl[RLX_AR_SPLITS + par * RLX_AR_MAX_WORLD + rank] = gridDim.y;
            rlx_ar_release(fl + par * RLX_AR_MAX_WORLD + rank, e);
        }
        own[RLX_AR_COUNTER] = e;
    }
};

/* The split rlx_dgemv (EPI 0, one member) with its partials stored into every rank's exchange buffer */
template <typename T, bool BF, bool NORM, bool VEC, int W>
__global__ void __launch_bounds__(RLX_DGEMV_THREADS, RLX_DGEMV_MIN_BLOCKS)
rlx_dgemv_ar(const T *__restrict__ X, const T *__restrict__ gamma, float eps, const __grid_constant__ RlxQMembers mem,
             int64_t K64, int lg, int splits, const __grid_constant__ RlxArPeers peers, int rank) {
    RlxDgemvExchange<W> out;
    out.peers = &peers;
    out.rank = rank;
    rlx_dgemv_block<T, BF, NORM, 0, VEC, true>(X, gamma, eps, mem, (const T *)nullptr, K64, lg, out, splits);
}

/* After rlx_dgemv_ar: y[i] (n columns) = the ranks' rows summed as the file's comment says; with RES, res[i] added
   (y may be res itself, element for element). One thread a column. */
template <typename T, bool RES, int W>
__global__ void __launch_bounds__(RLX_DGEMV_REDUCE_THREADS)
rlx_dgemv_reduce_ar(const T *res, T *y, int64_t n, const __grid_constant__ RlxArPeers peers, int rank) {
    __shared__ int splits[W];
    rlx_pdl_wait();
    rlx_pdl_trigger();
    char *own = peers.buf[rank];
    uint32_t *flags = rlx_ar_flags(own, W);
    const uint32_t e = flags[RLX_AR_COUNTER];  /* this rank's GEMV (the kernel before) made call e */
    const int par = (int)(e & 1);
    if (threadIdx.x < W) {
        rlx_ar_await(flags + par * RLX_AR_MAX_WORLD + threadIdx.x, e);
        splits[threadIdx.x] = (int)flags[RLX_AR_SPLITS + par * RLX_AR_MAX_WORLD + threadIdx.x];
    }
    __syncthreads();
    for (int64_t i = (int64_t)blockIdx.x * RLX_DGEMV_REDUCE_THREADS + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * RLX_DGEMV_REDUCE_THREADS) {
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < W; r++) {
            const float *p = rlx_ar_part(own, W, par, r);
            float a = 0.0f;
            for (int s = 0; s < splits[r]; s++)
                a += p[s * n + i];
            acc += rlx_f(rlx_to<T>(a));
        }
        y[i] = RES ? rlx_to<T>(rlx_f(res[i]) + rlx_f(rlx_to<T>(acc))) : rlx_to<T>(acc);
    }
}
