/* The span ring of a profiled build, shared by the CPU backend (kernels/profile.h includes it) and the
 * CUDA backend (rlx.codegen.cuda.emit inserts this text before cuda/kernels/profile.cuh): one record
 * layout and one reader, so rlx_profile_read returns the same fields on both (rlx.runtime.profile).
 * A fixed RLX kernel header: no template code; plain C that also compiles as C++ host code.
 *
 * Spans go into a ring in the execution context (the oldest are overwritten once RLX_PROF_CAP are
 * held). Timestamps are CLOCK_MONOTONIC nanoseconds: one clock for every thread (and, on CUDA, the
 * host clock the event times are placed on). */
#ifndef RLX_KERNELS_PROFILE_RING_H
#define RLX_KERNELS_PROFILE_RING_H

#include <stdint.h>
#include <time.h>

#define RLX_PROF_CAP 16384
#define RLX_PROF_FIELDS 7 /* t0, t1, kernel, thread, run, flops, bytes */

typedef struct {
    int64_t t0, t1;
    int32_t kernel, thread; /* thread -1: the calling thread (CPU) or the stream (CUDA) */
    int64_t run;
    double flops, bytes;
} rlx_prof_span;

typedef struct {
    int64_t next;   /* spans ever recorded; slot = next % RLX_PROF_CAP */
    int64_t runs;   /* runs started on this context */
    int64_t current; /* CPU: the kernel rlx_run is in (kernel bodies read it, so nodes can share one body) */
    rlx_prof_span spans[RLX_PROF_CAP];
} rlx_prof_ring;

static inline int64_t rlx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void rlx_prof_record(rlx_prof_ring *ring, int32_t kernel, int32_t thread, int64_t t0, int64_t t1,
                                   double flops, double bytes)
{
    /* Threads of one region finish concurrently: each claims its own slot. */
    const int64_t i = __atomic_fetch_add(&ring->next, 1, __ATOMIC_RELAXED) % RLX_PROF_CAP;
    rlx_prof_span *s = &ring->spans[i];
    s->t0 = t0;
    s->t1 = t1;
    s->kernel = kernel;
    s->thread = thread;
    s->run = ring->runs;
    s->flops = flops;
    s->bytes = bytes;
}

/* Copies the held spans, oldest first, as RLX_PROF_FIELDS int64 each (flops and bytes rounded);
 * returns how many were copied (at most max). */
static int64_t rlx_prof_read(const rlx_prof_ring *ring, int64_t *out, int64_t max)
{
    const int64_t held = ring->next < RLX_PROF_CAP ? ring->next : RLX_PROF_CAP;
    const int64_t first = ring->next - held;
    int64_t n = 0;
    for (int64_t j = first; j < ring->next && n < max; j++, n++) {
        const rlx_prof_span *s = &ring->spans[j % RLX_PROF_CAP];
        int64_t *o = out + n * RLX_PROF_FIELDS;
        o[0] = s->t0;
        o[1] = s->t1;
        o[2] = s->kernel;
        o[3] = s->thread;
        o[4] = s->run;
        o[5] = (int64_t)s->flops;
        o[6] = (int64_t)s->bytes;
    }
    return n;
}

#endif /* RLX_KERNELS_PROFILE_RING_H */
