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

/* Whether idle OpenMP threads spin (RLX's default: GOMP_SPINCOUNT=200000 from RLX_OMP_WAIT, or
 * OMP_WAIT_POLICY=active): then forking a team costs a few microseconds and small products split
 * across it pay; with sleeping threads (OMP_WAIT_POLICY=passive, or a spin count too short to span
 * one kernel) waking the team costs tens of microseconds. With neither variable set the OpenMP
 * runtime's own default spins (libgomp: 300000). Read once; every thread computes the same value. */
#define RLX_SPINNING_SPINCOUNT 10000
static inline int rlx_team_spins(void)
{
    static int cached = -1; /* -1: not read yet */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *policy = getenv("OMP_WAIT_POLICY");
        const char *spins = getenv("GOMP_SPINCOUNT");
        if (policy != NULL && (policy[0] == 'a' || policy[0] == 'A'))
            v = 1;
        else if (policy != NULL && (policy[0] == 'p' || policy[0] == 'P'))
            v = 0;
        else if (spins != NULL && spins[0] != '\0') {
            /* libgomp's syntax: "infinite"/"infinity", or a count with an optional k/M/G/T suffix */
            char *end = NULL;
            long long n = strtoll(spins, &end, 10);
            if (end != NULL && (*end == 'k' || *end == 'K')) n *= 1000LL;
            else if (end != NULL && *end != '\0' && *end != ' ' && end != spins) n = RLX_SPINNING_SPINCOUNT;
            v = spins[0] == 'i' || spins[0] == 'I' || n >= RLX_SPINNING_SPINCOUNT;
        } else
            v = 1;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

#endif /* RLX_KERNELS_THREADS_H */
