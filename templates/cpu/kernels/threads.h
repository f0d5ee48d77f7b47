/* OpenMP team helpers (one thread policy for OpenMP loops and BLAS alike).
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_THREADS_H
#define RLX_KERNELS_THREADS_H

#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int rlx_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static int rlx_team_size(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

static int rlx_default_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Whether idle OpenMP threads spin (OMP_WAIT_POLICY=active, set by RLX_OMP_WAIT=active): then forking a
 * team is cheap and small products split across it pay; with sleeping threads (RLX's default) waking
 * the team costs tens of microseconds. Read once; every thread computes the same value. */
static inline int rlx_team_spins(void)
{
    static int cached = -1; /* -1: not read yet */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *policy = getenv("OMP_WAIT_POLICY");
        v = policy != NULL && (policy[0] == 'a' || policy[0] == 'A');
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

#endif /* RLX_KERNELS_THREADS_H */
