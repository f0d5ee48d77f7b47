/* Time spans of a profiled build (RLX_PROFILE=1 / Session(profile=True)); never included otherwise.
 * A fixed RLX kernel header: no template code.
 *
 * Every run records one span per kernel (thread -1: the calling thread, timed around the kernel's
 * function) and, for kernels whose parallel regions carry the `rlx_prof` reduction, one span per
 * OpenMP thread: the reduction's initializer runs when a thread enters the region and its combiner
 * when that thread leaves it, so the span is that thread's share of the region. Spans go into the
 * ring of kernels/profile_ring.h (shared with the CUDA backend), read back by rlx_profile_read. */
#ifndef RLX_KERNELS_PROFILE_H
#define RLX_KERNELS_PROFILE_H

#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/profile_ring.h" /* the span record, the ring, rlx_now_ns, rlx_prof_record / _read */

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

#endif /* RLX_KERNELS_PROFILE_H */
