/* OpenMP team helpers (one thread policy for OpenMP loops and BLAS alike).
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_THREADS_H
#define RLX_KERNELS_THREADS_H

#include <stdint.h>
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

/* Whether the team's idle threads spin (forks are cheap) is not read here from the environment: the
 * runtime decides the wait policy and the team size between runs and passes both in (rlx_set_team:
 * ctx->nthreads, ctx->spins; rlx.runtime.team). */

#endif /* RLX_KERNELS_THREADS_H */
