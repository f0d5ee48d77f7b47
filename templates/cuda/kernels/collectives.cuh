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
