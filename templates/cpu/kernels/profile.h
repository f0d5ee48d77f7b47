/* Time spans of a profiled build (RLX_PROFILE=1 / Session(profile=True)); never included otherwise.
 * A fixed RLX kernel header: no template code.
 *
 * Every run records one span per kernel (thread -1: the calling thread, timed around the kernel's
 * function) and, for kernels whose parallel regions carry the `rlx_prof` reduction, one span per
 * OpenMP thread: the reduction's initializer runs when a thread enters the region and its combiner
 * when that thread leaves it, so the span is that thread's share of the region. Spans go into a ring
 * in the execution context (the oldest are overwritten once RLX_PROF_CAP are held), read back by
 * rlx_profile_read. Timestamps are CLOCK_MONOTONIC nanoseconds: one clock for every thread. */
#ifndef RLX_KERNELS_PROFILE_H
#define RLX_KERNELS_PROFILE_H

#include <stdint.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define RLX_PROF_CAP 16384
#define RLX_PROF_FIELDS 7 /* t0, t1, kernel, thread, run, flops, bytes */

typedef struct {
    int64_t t0, t1;
    int32_t kernel, thread;
    int64_t run;
    double flops, bytes;
} rlx_prof_span;

typedef struct {
    int64_t next;   /* spans ever recorded; slot = next % RLX_PROF_CAP */
    int64_t runs;   /* runs started on this context */
    int64_t current; /* the kernel rlx_run is in: kernel bodies read it, so nodes can share one body */
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

/* The reduction variable of a profiled parallel region: where to record, for which kernel, since when. */
typedef struct {
    rlx_prof_ring *ring;
    int32_t kernel;
    int64_t t0;
} rlx_tspan;

static inline rlx_tspan rlx_tspan_enter(rlx_tspan orig)
{
    orig.t0 = rlx_now_ns();
    return orig;
}

static inline rlx_tspan rlx_tspan_leave(rlx_tspan out, rlx_tspan in)
{
#ifdef _OPENMP
    const int32_t thread = (int32_t)omp_get_thread_num();
#else
    const int32_t thread = 0;
#endif
    if (in.ring)
        rlx_prof_record(in.ring, in.kernel, thread, in.t0, rlx_now_ns(), 0.0, 0.0);
    return out;
}

#ifdef _OPENMP
#pragma omp declare reduction(rlx_prof : rlx_tspan : omp_out = rlx_tspan_leave(omp_out, omp_in)) \
    initializer(omp_priv = rlx_tspan_enter(omp_orig))
#endif

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

#endif /* RLX_KERNELS_PROFILE_H */
