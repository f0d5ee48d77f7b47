/* Collective ops on CUDA through NCCL (one process per GPU; the communicator is the context's,
 * made by rlx_set_nccl from the unique id the launcher created). Included only by graphs with
 * collective ops; their build adds the NCCL include and library paths (rlx/toolchain/nccl.py). */
#include <nccl.h>

/* An NCCL call on the context's stream; a failure is a CUDA-class error naming the node. */
#define RLX_NCCL(c, call, what)                                                                       \
    do {                                                                                              \
        ncclResult_t rlx_n_ = (call);                                                                 \
        if (rlx_n_ != ncclSuccess) {                                                                  \
            rlx_set_error((c), "NCCL error in %s: %s", (what), ncclGetErrorString(rlx_n_));           \
            return RLX_ECUDA;                                                                         \
        }                                                                                             \
    } while (0)

/* The communicator for a collective of `world` ranks, or an error (RLX_EUSAGE) naming the node. */
#define RLX_NCCL_COMM(c, world, what)                                                                 \
    do {                                                                                              \
        if (!(c)->comm)                                                                               \
            return rlx_set_error((c), "%s: no NCCL communicator; a graph with collectives runs once "  \
                                 "per rank, each context given its rank (rlx_set_nccl)", (what));     \
        if ((c)->comm_world != (world))                                                               \
            return rlx_set_error((c), "%s: the op is for %d ranks but the communicator has %d",       \
                                 (what), (int)(world), (int)(c)->comm_world);                         \
    } while (0)

/* ── One-shot all-reduce through the peers' memory (an `AllReduceP2P` decision of the lowering) ──────────────
 * For the small sums of a tensor-parallel decode step (a row of hidden values after the output and down
 * projections: 8 KB at hidden 4096 in f16) NCCL's ring costs ~10 us of protocol; here every rank writes its values
 * straight into a slot of every rank's exchange buffer (NVLink / PCIe peer stores through CUDA IPC mappings made
 * by rlx_set_nccl), raises a flag there, waits for every rank's flag in its own buffer, and sums the slots in rank
 * order, so every rank computes bit-identical sums. One block of RLX_AR_THREADS threads. The buffers, their flags
 * and the call counter: kernels/exchange.cuh. */
#define RLX_AR_THREADS 512

/* y = the sum of every rank's x; with RES, y = res + that sum (the add the sum's one reader did: AllReduceP2P.residual;
   y may be res itself, element for element). */
template <typename T, bool RES>
__global__ void __launch_bounds__(RLX_AR_THREADS)
rlx_all_reduce_p2p(const T *x, T *y, const T *res, int64_t n, const __grid_constant__ RlxArPeers peers, int rank,
                   int world) {
    constexpr int PER = 16 / (int)sizeof(T);  /* values per 16-byte vector */
    rlx_pdl_wait();     /* x is the kernel before's output */
    rlx_pdl_trigger();  /* the next kernel may launch and fetch its weights while the ranks meet */
    uint32_t *flags = rlx_ar_flags(peers.buf[rank], world), *counter = flags + RLX_AR_COUNTER;
    const uint32_t e = rlx_ar_call(peers, rank, world);
    const int par = (int)(e & 1);
    const int64_t nv = n / PER;
    /* 1. this rank's values into slot (par, rank) of every rank's buffer */
    for (int p = 0; p < world; ++p) {
        char *slot = rlx_ar_slot(peers.buf[p], world, par, rank);
        for (int64_t i = threadIdx.x; i < nv; i += blockDim.x)
            ((uint4 *)slot)[i] = ((const uint4 *)x)[i];
        for (int64_t i = nv * PER + threadIdx.x; i < n; i += blockDim.x)
            ((T *)slot)[i] = x[i];
    }
    __syncthreads();
    /* 2. raise this rank's flag of call e in every buffer: a system-scope release after the barrier orders every
       thread's stores above before the flag (no fence in each thread), 3. wait for every rank's in this one */
    if (threadIdx.x < world) {
        rlx_ar_release(rlx_ar_flags(peers.buf[threadIdx.x], world) + par * RLX_AR_MAX_WORLD + rank, e);
        rlx_ar_await(flags + par * RLX_AR_MAX_WORLD + threadIdx.x, e);
    }
    __syncthreads();
    /* 4. the sums, slots in rank order (the same order, so the same bits, on every rank) */
    const char *own = rlx_ar_slot(peers.buf[rank], world, par, 0);
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
        float acc[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k)
            acc[k] = 0.0f;
        for (int r = 0; r < world; ++r) {
            const uint4 v = ((const uint4 *)(own + (size_t)r * RLX_AR_SLOT_BYTES))[i];
            const T *t = (const T *)&v;
#pragma unroll
            for (int k = 0; k < PER; ++k)
                acc[k] += rlx_f(t[k]);
        }
        uint4 out;
        T *o = (T *)&out;
        if (RES) {  /* the add rounds the sum to T first, as the unfused add reads it */
            const uint4 rv = ((const uint4 *)res)[i];
            const T *rt = (const T *)&rv;
#pragma unroll
            for (int k = 0; k < PER; ++k)
                o[k] = rlx_to<T>(rlx_f(rt[k]) + rlx_f(rlx_to<T>(acc[k])));
        } else {
#pragma unroll
            for (int k = 0; k < PER; ++k)
                o[k] = rlx_to<T>(acc[k]);
        }
        ((uint4 *)y)[i] = out;
    }
    for (int64_t i = nv * PER + threadIdx.x; i < n; i += blockDim.x) {
        float acc = 0.0f;
        for (int r = 0; r < world; ++r)
            acc += rlx_f(((const T *)(own + (size_t)r * RLX_AR_SLOT_BYTES))[i]);
        y[i] = RES ? rlx_to<T>(rlx_f(res[i]) + rlx_f(rlx_to<T>(acc))) : rlx_to<T>(acc);
    }
    if (threadIdx.x == 0)
        *counter = e;
}
