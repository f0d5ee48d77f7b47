/* The transport ABI: how a compiled graph's collectives reach the other ranks.
 * A fixed RLX kernel header, included by graphs with collective ops (and mirrored in rlx.h).
 *
 * A transport is a function table for one rank. Every rank calls the same collectives in the
 * same order with the same counts (the ranks run the same graph); each call returns when this
 * rank's result is complete, 0 on success or nonzero with a message in last_error(state).
 * Layout as NCCL's: all_gather writes rank r's `count` elements at recv + r * count;
 * reduce_scatter reads `world` blocks of `recvcount` elements and rank r keeps the reduction
 * of block r. send == recv is allowed for all_reduce. */
#ifndef RLX_TRANSPORT_DEFINED
#define RLX_TRANSPORT_DEFINED

#include <stdint.h>

#define RLX_TRANSPORT_VERSION 1

/* element types (dtype) and reductions (op) */
enum { RLX_DT_F32 = 0, RLX_DT_F16 = 1, RLX_DT_BF16 = 2 };
enum { RLX_RED_SUM = 0, RLX_RED_MAX = 1 };

typedef struct RlxTransport {
    int32_t version; /* RLX_TRANSPORT_VERSION */
    int32_t rank, world;
    int32_t reserved;
    void *state;     /* the implementation's own, passed back to every call */
    int32_t (*all_reduce)(void *state, const void *send, void *recv, int64_t count, int32_t dtype, int32_t op);
    int32_t (*all_gather)(void *state, const void *send, void *recv, int64_t count, int32_t dtype);
    int32_t (*reduce_scatter)(void *state, const void *send, void *recv, int64_t recvcount, int32_t dtype,
                              int32_t op);
    const char *(*last_error)(void *state);
} RlxTransport;

#endif /* RLX_TRANSPORT_DEFINED */
