/* ── A row-parallel dense GEMV's reduce that also sums over the clique (an `AllReduceP2P` with `gemv`) ──────────────
 * In a tensor-parallel decode step the attention output and FFN down projections are row-parallel: each rank's split
 * GEMV (kernels/dense_gemv.cuh) leaves f32 partials [splits][n], rlx_dgemv_reduce adds them into the rank's row, and
 * the one-shot all-reduce (kernels/collectives.cuh, one block) sums the rows over the ranks: two kernels and the
 * ranks' meeting after the GEMV. rlx_dgemv_reduce_ar is both, over as many blocks as the reduce: block b adds its
 * columns' splits in split order and rounds them to T (the row rlx_dgemv_reduce gives), stores them into this rank's
 * slot of every rank's exchange buffer (kernels/exchange.cuh), raises this rank's flag of block b there, waits for
 * every rank's flag of block b in its own buffer, and adds the ranks' values in rank order in f32, rounded to T, then
 * the residual (RES): the bits of rlx_dgemv_reduce + rlx_all_reduce_p2p, the same on every rank. Block b of a rank
 * meets only block b of the others (the same columns), so the blocks need not be resident together. */
#define RLX_DGEMV_AR_THREADS 256

/* The block's columns of this rank's row (the splits added in split order, rounded to T) into this rank's slot of
   every buffer, then this rank's flag of the block raised in every buffer */
template <typename T, int W>
__device__ __forceinline__ void rlx_dgemv_ar_publish(const float *__restrict__ partials, int splits, int64_t n,
                                                     const RlxArPeers &peers, int rank, uint32_t e) {
    const int par = (int)(e & 1);
    const int64_t i = (int64_t)blockIdx.x * RLX_DGEMV_AR_THREADS + threadIdx.x;
    if (i < n) {
        float a = 0.0f;
        for (int s = 0; s < splits; s++)
            a += partials[s * n + i];
        const T v = rlx_to<T>(a);
#pragma unroll
        for (int r = 0; r < W; r++)
            ((T *)rlx_ar_slot(peers.buf[r], W, par, rank))[i] = v;
    }
    __syncthreads();  /* the block's stores, then (system-scope release) its flag */
    if (threadIdx.x < W)
        rlx_ar_release(rlx_ar_block_flag(peers.buf[threadIdx.x], W, par, rank, (int)blockIdx.x), e);
}

/* Once every rank's flag of the block is up in this rank's buffer: y = the ranks' values added in rank order (+ res) */
template <typename T, bool RES, int W>
__device__ __forceinline__ void rlx_dgemv_ar_sum(const T *res, T *y, int64_t n, const RlxArPeers &peers, int rank,
                                                 uint32_t e) {
    const int par = (int)(e & 1);
    char *own = peers.buf[rank];
    if (threadIdx.x < W)
        rlx_ar_await(rlx_ar_block_flag(own, W, par, (int)threadIdx.x, (int)blockIdx.x), e);
    __syncthreads();
    const int64_t i = (int64_t)blockIdx.x * RLX_DGEMV_AR_THREADS + threadIdx.x;
    if (i < n) {
        float acc = 0.0f;
#pragma unroll
        for (int r = 0; r < W; r++)
            acc += rlx_f(((const T *)rlx_ar_slot(own, W, par, r))[i]);
        y[i] = RES ? rlx_to<T>(rlx_f(res[i]) + rlx_f(rlx_to<T>(acc))) : rlx_to<T>(acc);
    }
}

/* The last block of the call to finish records e as this rank's last call (every block read the counter first) */
__device__ __forceinline__ void rlx_ar_call_done(const RlxArPeers &peers, int rank, int world, uint32_t e) {
    if (threadIdx.x != 0)
        return;
    uint32_t *own = rlx_ar_flags(peers.buf[rank], world);
    if (atomicAdd(own + RLX_AR_DONE, 1u) + 1u == gridDim.x) {
        own[RLX_AR_DONE] = 0u;
        own[RLX_AR_COUNTER] = e;
    }
}

/* After the split rlx_dgemv (EPI 0, one member of n columns; its partials [splits][n]): y = the sum over the clique
   (+ res with RES; y may be res itself, element for element). ceil(n / RLX_DGEMV_AR_THREADS) <= RLX_AR_MAX_BLOCKS
   blocks, one column a thread; n T values fit a slot. */
template <typename T, bool RES, int W>
__global__ void __launch_bounds__(RLX_DGEMV_AR_THREADS)
rlx_dgemv_reduce_ar(const float *__restrict__ partials, int splits, const T *res, T *y, int64_t n,
                    const __grid_constant__ RlxArPeers peers, int rank) {
    rlx_pdl_wait();
    rlx_pdl_trigger();  /* the next kernel may launch and fetch its weights while the ranks meet */
    const uint32_t e = rlx_ar_call(peers, rank, W);
    rlx_dgemv_ar_publish<T, W>(partials, splits, n, peers, rank, e);
    rlx_dgemv_ar_sum<T, RES, W>(res, y, n, peers, rank, e);
    rlx_ar_call_done(peers, rank, W, e);
}
