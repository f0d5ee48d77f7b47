/* Collective ops (all_reduce, all_gather, reduce_scatter) of a compiled graph: calls through
 * the transport the caller gave the context (rlx_set_transport; kernels/transport.h).
 * A fixed RLX kernel header, included only by graphs with collective ops; such graphs' rlx_ctx
 * has a `transport` member (prelude.c.j2) and they export rlx_set_transport. */
#ifndef RLX_KERNELS_COLLECTIVES_H
#define RLX_KERNELS_COLLECTIVES_H

#include <stdint.h>
#include <string.h>

#include "kernels/transport.h"

/* Attach rank's transport to ctx (NULL detaches). Every collective of the graph goes through it,
 * so it must outlive the runs. Returns 0, or 1 with a message in rlx_last_error. A clone
 * (rlx_clone) starts without one. */
RLX_EXPORT int32_t rlx_set_transport(void *vctx, const RlxTransport *t)
{
    rlx_ctx *ctx = (rlx_ctx *)vctx;
    if (!ctx)
        return 1;
    ctx->err[0] = 0;
    if (t && t->version != RLX_TRANSPORT_VERSION)
        return rlx_fail(ctx, "transport version %d, this library takes %d", (int)t->version, RLX_TRANSPORT_VERSION);
    if (t && (!t->all_reduce || !t->all_gather || !t->reduce_scatter || !t->last_error || t->world < 1 ||
              t->rank < 0 || t->rank >= t->world))
        return rlx_fail(ctx, "transport is incomplete (a NULL function, or rank %d outside world %d)",
                        (int)t->rank, (int)t->world);
    ctx->transport = t;
    return 0;
}

/* The transport for a collective of `world` ranks, or NULL after rlx_fail. */
static const RlxTransport *rlx_transport_for(rlx_ctx *ctx, const char *label, int32_t world)
{
    const RlxTransport *t = ctx->transport;
    if (!t) {
        rlx_fail(ctx, "%s: no transport; a graph with collectives runs once per rank, each context given "
                 "its rank's transport (rlx_set_transport)", label);
        return NULL;
    }
    if (t->world != world) {
        rlx_fail(ctx, "%s: the op is for %d ranks but the transport has %d", label, (int)world, (int)t->world);
        return NULL;
    }
    return t;
}

static int rlx_transport_failed(rlx_ctx *ctx, const char *label, const RlxTransport *t)
{
    const char *why = t->last_error(t->state);
    return rlx_fail(ctx, "%s: %s", label, why && why[0] ? why : "the transport failed");
}

/* dst[o, r, :] = src[r, o, :] for o < outer, r < world (rank-major gather -> gathered axis). */
static void rlx_gather_interleave(char *dst, const char *src, int64_t outer, int32_t world, size_t inner_bytes)
{
    for (int64_t o = 0; o < outer; o++)
        for (int32_t r = 0; r < world; r++)
            memcpy(dst + ((size_t)o * world + r) * inner_bytes, src + ((size_t)r * outer + o) * inner_bytes,
                   inner_bytes);
}

/* dst[r, o, :] = src[o, r, :] (the scattered axis -> rank-major blocks). */
static void rlx_scatter_deinterleave(char *dst, const char *src, int64_t outer, int32_t world, size_t inner_bytes)
{
    for (int64_t o = 0; o < outer; o++)
        for (int32_t r = 0; r < world; r++)
            memcpy(dst + ((size_t)r * outer + o) * inner_bytes, src + ((size_t)o * world + r) * inner_bytes,
                   inner_bytes);
}

#endif /* RLX_KERNELS_COLLECTIVES_H */
