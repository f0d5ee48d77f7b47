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

/* Independent tasks [0, n) of a parallel region, as one thread takes them. While the team's idle threads spin
 * (the runtime says the cores are the team's), each thread runs its own contiguous range [lo, hi) (the caller's
 * split). Otherwise (passive waiting, or cores taken by other processes) a thread may be descheduled mid-region,
 * and a fixed range would keep the whole team waiting for it at the region's end: tasks are then claimed one at a
 * time from `shared` (a counter the region's threads share, 0 before the region), so the threads that run finish
 * the work. A task's result does not depend on which thread ran it. */
typedef struct {
    int64_t next, end;
    int64_t *shared;
    int claim;
} rlx_tasks;

static inline rlx_tasks rlx_tasks_begin(int64_t n, int64_t lo, int64_t hi, int spins, int64_t *shared)
{
    rlx_tasks q;
    q.claim = !spins && rlx_team_size() > 1;
    q.next = q.claim ? 0 : lo;
    q.end = q.claim ? n : hi;
    q.shared = shared;
    return q;
}

/* The thread's next task, or a value >= q->end when none is left. */
static inline int64_t rlx_tasks_next(rlx_tasks *q)
{
    return q->claim ? __atomic_fetch_add(q->shared, 1, __ATOMIC_RELAXED) : q->next++;
}

/* The thread's next run of tasks [*t0, *t1): its whole range at once, or one claimed task; 0 when none is left. */
static inline int rlx_tasks_take(rlx_tasks *q, int64_t *t0, int64_t *t1)
{
    if (q->claim) {
        *t0 = __atomic_fetch_add(q->shared, 1, __ATOMIC_RELAXED);
        *t1 = *t0 + 1;
        return *t0 < q->end;
    }
    *t0 = q->next;
    *t1 = q->end;
    q->next = q->end;
    return *t0 < *t1;
}

#endif /* RLX_KERNELS_THREADS_H */
