/* A shared-memory transport (kernels/transport.h) for N ranks of one machine: threads of one
 * process, or processes mapping the same region (POSIX shared memory, MAP_SHARED).
 * A fixed RLX kernel header, included by graphs with collective ops; its three functions are
 * exported so the runtime can make a rank's transport from the library it loaded.
 *
 * The region: a 128-byte header (a barrier: arrivals, phase; an abort flag at byte 8), then two
 * sets of one slot per rank. It must be zero-filled before the first rank opens it (a fresh
 * shared-memory segment is). A collective goes in chunks of at most one slot: each rank copies
 * its chunk into its own slot, all meet at the barrier, and each rank reads every slot and reduces
 * in rank order (every rank computes the same bits, as rlx/ir/transport.py does). Consecutive
 * steps use alternate sets, so one barrier per step suffices (see rlx_shm_set).
 *
 * No hang: a rank waits at most `timeout_ms` for the others, then raises the abort flag and
 * fails; a rank that sees the flag fails at once. The launcher raises it too when a rank dies. */
#ifndef RLX_KERNELS_TRANSPORT_SHM_H
#define RLX_KERNELS_TRANSPORT_SHM_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kernels/transport.h"

#define RLX_SHM_HEADER 128

typedef struct {
    _Atomic uint32_t arrived; /* ranks at the barrier in this phase */
    _Atomic uint32_t phase;   /* bumped by the last rank to arrive */
    _Atomic int32_t aborted;  /* byte 8: nonzero once any rank failed or timed out */
    _Atomic uint32_t sleepers; /* ranks blocked in the kernel waiting for the phase to move */
} rlx_shm_header;

typedef struct {
    RlxTransport t;
    rlx_shm_header *h;
    char *slots;
    int64_t slot; /* bytes per rank's slot (a multiple of 64) */
    int64_t timeout_ms;
    char err[256];
} rlx_shm;

static int32_t rlx_shm_fail(rlx_shm *s, const char *what)
{
    snprintf(s->err, sizeof s->err, "rank %d of %d: %s", (int)s->t.rank, (int)s->t.world, what);
    return 1;
}

static int64_t rlx_shm_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Block until *word != seen, at most 10 ms (the caller re-checks the abort flag and its deadline).
 * A futex on the shared page works across processes; elsewhere a short sleep stands in. */
static void rlx_shm_sleep(_Atomic uint32_t *word, uint32_t seen)
{
#if defined(__linux__)
    const struct timespec slice = {0, 10000000};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &slice, NULL, 0);
#else
    (void)word;
    (void)seen;
    const struct timespec nap = {0, 50000};
    nanosleep(&nap, NULL);
#endif
}

static void rlx_shm_wake(_Atomic uint32_t *word)
{
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

/* Phase barrier over the region: spin briefly (when every rank has a core, decode collectives are
 * microseconds apart), then block in the kernel until the last rank moves the phase — on a machine
 * with more runnable threads than cores a spinning rank would hold the core the late rank needs.
 * The abort flag and the deadline are checked between waits. */
static int32_t rlx_shm_barrier(rlx_shm *s)
{
    rlx_shm_header *h = s->h;
    const uint32_t phase = atomic_load_explicit(&h->phase, memory_order_acquire);
    if (atomic_load_explicit(&h->aborted, memory_order_acquire))
        return rlx_shm_fail(s, "a collective was abandoned: another rank failed");
    if (atomic_fetch_add_explicit(&h->arrived, 1, memory_order_acq_rel) == (uint32_t)s->t.world - 1) {
        atomic_store_explicit(&h->arrived, 0, memory_order_relaxed);
        atomic_fetch_add(&h->phase, 1);  /* seq_cst: ordered against the sleepers count below */
        if (atomic_load(&h->sleepers))
            rlx_shm_wake(&h->phase);
        return 0;
    }
    int64_t deadline = -1;
    for (uint64_t spin = 0; atomic_load_explicit(&h->phase, memory_order_acquire) == phase; spin++) {
        if (atomic_load_explicit(&h->aborted, memory_order_acquire))
            return rlx_shm_fail(s, "a collective was abandoned: another rank failed");
        if (spin < 2048)
            continue;
        /* announce the sleep before re-reading the phase: the last rank then either sees a sleeper
         * and wakes it, or moved the phase before this read (seq_cst both sides) */
        atomic_fetch_add(&h->sleepers, 1);
        if (atomic_load(&h->phase) == phase)
            rlx_shm_sleep(&h->phase, phase);
        atomic_fetch_sub(&h->sleepers, 1);
        const int64_t now = rlx_shm_now_ms();
        if (deadline < 0)
            deadline = now + s->timeout_ms;
        else if (now > deadline) {
            atomic_store_explicit(&h->aborted, 1, memory_order_release);
            return rlx_shm_fail(s, "timed out waiting for the other ranks at a collective");
        }
    }
    return 0;
}

static size_t rlx_shm_elsize(int32_t dtype)
{
    return dtype == RLX_DT_F32 ? 4 : (dtype == RLX_DT_F16 || dtype == RLX_DT_BF16) ? 2 : 0;
}

/* Rank r's slot in buffer set `set` (0 or 1). */
static char *rlx_shm_slot(const rlx_shm *s, int r, int set)
{
    return s->slots + ((size_t)set * s->t.world + (size_t)r) * (size_t)s->slot;
}

/* The buffer set of the collective step about to start: the parity of the barrier phase, which every
 * rank reads alike (it cannot change before all of them arrive). Two sets alternate, so one barrier
 * per step is enough: a rank writes set p&1 only after the barrier of step p-1, which every rank
 * reaches only once done reading step p-2 (the same set). */
static int rlx_shm_set(const rlx_shm *s)
{
    return (int)(atomic_load_explicit(&s->h->phase, memory_order_acquire) & 1u);
}

/* out[i] = slot_0[i] op slot_1[i] op ... in rank order (f32 values; a sum accumulates in double
 * and rounds once, as rlx.reference does, so every rank and the reference get the same bits). */
static void rlx_shm_reduce_f32(const rlx_shm *s, int set, int64_t first, int64_t n, float *out, int32_t op)
{
    const int W = s->t.world;
    for (int64_t i = 0; i < n; i++) {
        double acc = ((const float *)rlx_shm_slot(s, 0, set))[first + i];
        for (int r = 1; r < W; r++) {
            const double v = ((const float *)rlx_shm_slot(s, r, set))[first + i];
            acc = op == RLX_RED_SUM ? acc + v : (v > acc || v != v ? v : acc); /* max keeps a NaN, as np.maximum */
        }
        out[i] = (float)acc;
    }
}

static int32_t rlx_shm_check(rlx_shm *s, int32_t dtype, int32_t op, int reduces)
{
    if (reduces && dtype != RLX_DT_F32)
        return rlx_shm_fail(s, "the shared-memory transport reduces f32 only");
    if (!rlx_shm_elsize(dtype))
        return rlx_shm_fail(s, "unknown dtype code");
    if (reduces && op != RLX_RED_SUM && op != RLX_RED_MAX)
        return rlx_shm_fail(s, "unknown reduction code");
    return 0;
}

static int32_t rlx_shm_all_reduce(void *state, const void *send, void *recv, int64_t count, int32_t dtype, int32_t op)
{
    rlx_shm *s = (rlx_shm *)state;
    if (rlx_shm_check(s, dtype, op, 1))
        return 1;
    const int64_t chunk = s->slot / 4;
    for (int64_t off = 0; off < count; off += chunk) {
        const int64_t n = count - off < chunk ? count - off : chunk;
        const int set = rlx_shm_set(s);
        memcpy(rlx_shm_slot(s, s->t.rank, set), (const float *)send + off, (size_t)n * 4);
        if (rlx_shm_barrier(s))
            return 1;
        rlx_shm_reduce_f32(s, set, 0, n, (float *)recv + off, op);
    }
    return 0;
}

static int32_t rlx_shm_all_gather(void *state, const void *send, void *recv, int64_t count, int32_t dtype)
{
    rlx_shm *s = (rlx_shm *)state;
    if (rlx_shm_check(s, dtype, 0, 0))
        return 1;
    const size_t es = rlx_shm_elsize(dtype);
    const int64_t chunk = s->slot / (int64_t)es;
    for (int64_t off = 0; off < count; off += chunk) {
        const int64_t n = count - off < chunk ? count - off : chunk;
        const int set = rlx_shm_set(s);
        memcpy(rlx_shm_slot(s, s->t.rank, set), (const char *)send + off * es, (size_t)n * es);
        if (rlx_shm_barrier(s))
            return 1;
        for (int r = 0; r < s->t.world; r++)
            memcpy((char *)recv + ((size_t)r * count + off) * es, rlx_shm_slot(s, r, set), (size_t)n * es);
    }
    return 0;
}

static int32_t rlx_shm_reduce_scatter(void *state, const void *send, void *recv, int64_t recvcount, int32_t dtype,
                                      int32_t op)
{
    rlx_shm *s = (rlx_shm *)state;
    if (rlx_shm_check(s, dtype, op, 1))
        return 1;
    const int W = s->t.world;
    const int64_t chunk = s->slot / 4 / W; /* every block's share of this chunk fits one slot */
    if (chunk < 1)
        return rlx_shm_fail(s, "the shared-memory slot is too small for this world size");
    for (int64_t off = 0; off < recvcount; off += chunk) {
        const int64_t n = recvcount - off < chunk ? recvcount - off : chunk;
        const int set = rlx_shm_set(s);
        float *mine = (float *)rlx_shm_slot(s, s->t.rank, set);
        for (int b = 0; b < W; b++)
            memcpy(mine + (size_t)b * n, (const float *)send + (size_t)b * recvcount + off, (size_t)n * 4);
        if (rlx_shm_barrier(s))
            return 1;
        rlx_shm_reduce_f32(s, set, (int64_t)s->t.rank * n, n, (float *)recv + off, op);
    }
    return 0;
}

static const char *rlx_shm_last_error(void *state) { return ((rlx_shm *)state)->err; }

/* Bytes of a region for `world` ranks with `slot_bytes` (rounded up to 64) per rank and set. */
RLX_EXPORT int64_t rlx_shm_region_bytes(int32_t world, int64_t slot_bytes)
{
    if (world < 1 || slot_bytes < 64)
        return -1;
    return RLX_SHM_HEADER + 2 * (int64_t)world * ((slot_bytes + 63) / 64 * 64);
}

/* Rank `rank`'s transport over `region` (`bytes` long, shared by all `world` ranks).
 * NULL for bad arguments or no memory. Free it with rlx_shm_transport_close. */
RLX_EXPORT RlxTransport *rlx_shm_transport_open(void *region, int64_t bytes, int32_t rank, int32_t world,
                                                int64_t timeout_ms)
{
    if (!region || world < 1 || rank < 0 || rank >= world || timeout_ms < 1 || ((uintptr_t)region & 63))
        return NULL;
    const int64_t slot = (bytes - RLX_SHM_HEADER) / (2 * (int64_t)world) / 64 * 64; /* two sets of slots */
    if (slot < 64 * (int64_t)world)
        return NULL;
    rlx_shm *s = (rlx_shm *)calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->t.version = RLX_TRANSPORT_VERSION;
    s->t.rank = rank;
    s->t.world = world;
    s->t.state = s;
    s->t.all_reduce = rlx_shm_all_reduce;
    s->t.all_gather = rlx_shm_all_gather;
    s->t.reduce_scatter = rlx_shm_reduce_scatter;
    s->t.last_error = rlx_shm_last_error;
    s->h = (rlx_shm_header *)region;
    s->slots = (char *)region + RLX_SHM_HEADER;
    s->slot = slot;
    s->timeout_ms = timeout_ms;
    return &s->t;
}

RLX_EXPORT void rlx_shm_transport_close(RlxTransport *t) { free(t ? t->state : NULL); }

#endif /* RLX_KERNELS_TRANSPORT_SHM_H */
