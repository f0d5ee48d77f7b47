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
 * the work. A task's result does not depend on which thread ran it.
 *
 * With a task pool (rlx_tasks_begin_pool) a spinning team's threads also start on their own ranges, but take
 * them one task at a time from the front of a slot the team shares, and a thread whose range is done takes
 * tasks from the back of the range with the most left (work stealing). Equal ranges do not finish together
 * on a shared machine: one core runs a few percent slower for a while (another tenant on its sibling, a
 * frequency step), and at every region's end the other waited for it (MiniLM 8x128 on a 2-vCPU VM: the two
 * threads of a GEMM ended 1-8% of its time apart, either one the late one). The ranges are set before the
 * region (rlx_task_pool_range), so a thread that starts late loses the end of its range, not all of it. */
#define RLX_STEAL_SLOTS 64

/* One thread's remaining range [front, back), packed as front | back << 32, alone on its cache line. */
typedef struct {
    uint64_t range;
    char pad[56];
} __attribute__((aligned(64))) rlx_steal_slot;

/* What a region's threads share to take tasks: the claim counter and, for a team of `nt` threads, their ranges. */
typedef struct {
    int64_t next;
    int nt;
    rlx_steal_slot slot[RLX_STEAL_SLOTS];
} rlx_task_pool;

typedef struct {
    int64_t next, end;
    int64_t *shared;
    int claim;
    rlx_task_pool *pool;  /* stealing: tasks come from pool->slot (front: the own range, back: another's) */
} rlx_tasks;

/* Before the region, for a team of `nt` threads: nothing claimed; thread t's range [lo, hi) is set with
 * rlx_task_pool_range for every t (all of them before the region: a thread that starts late still has its range
 * taken from its end by the others). */
static inline void rlx_task_pool_init(rlx_task_pool *pool, int nt)
{
    pool->next = 0;
    pool->nt = nt;
}

static inline void rlx_task_pool_range(rlx_task_pool *pool, int t, int64_t lo, int64_t hi)
{
    if (t < RLX_STEAL_SLOTS)
        pool->slot[t].range = (uint64_t)lo | (uint64_t)hi << 32;
}

/* rlx_task_pool_init with the even split of [0, n): thread t's range [n t / nt, n (t + 1) / nt). */
static inline void rlx_task_pool_split(rlx_task_pool *pool, int64_t n, int nt)
{
    rlx_task_pool_init(pool, nt);
    for (int t = 0; t < nt; t++)
        rlx_task_pool_range(pool, t, n * t / nt, n * (t + 1) / nt);
}

static inline rlx_tasks rlx_tasks_begin(int64_t n, int64_t lo, int64_t hi, int spins, int64_t *shared)
{
    rlx_tasks q;
    q.claim = !spins && rlx_team_size() > 1;
    q.next = q.claim ? 0 : lo;
    q.end = q.claim ? n : hi;
    q.shared = shared;
    q.pool = NULL;
    return q;
}

/* rlx_tasks_begin, stealing when the team spins and is the team the pool's ranges were set for (of 2 to
 * RLX_STEAL_SLOTS threads, [lo, hi) this thread's range there; tasks [0, n) fewer than 2^31). */
static inline rlx_tasks rlx_tasks_begin_pool(int64_t n, int64_t lo, int64_t hi, int spins, rlx_task_pool *pool)
{
    rlx_tasks q = rlx_tasks_begin(n, lo, hi, spins, &pool->next);
    const int nt = rlx_team_size();
    if (!q.claim && nt > 1 && nt == pool->nt && nt <= RLX_STEAL_SLOTS && n < ((int64_t)1 << 31)) {
        q.pool = pool;
        q.end = n;
    }
    return q;
}

/* The next task from the pool: the front of the own range, else the back of the fullest other one; q->end if none. */
static inline int64_t rlx_tasks_steal(rlx_tasks *q)
{
    const int me = rlx_thread_id(), nt = rlx_team_size();
    uint64_t *own = &q->pool->slot[me].range;
    uint64_t v = __atomic_load_n(own, __ATOMIC_RELAXED);
    while ((uint32_t)v < (uint32_t)(v >> 32))
        if (__atomic_compare_exchange_n(own, &v, v + 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return (int64_t)(uint32_t)v;
    for (;;) {
        int victim = -1;
        int64_t most = 0;
        for (int t = 0; t < nt; t++) {
            const uint64_t r = __atomic_load_n(&q->pool->slot[t].range, __ATOMIC_RELAXED);
            const int64_t left = (int64_t)(uint32_t)(r >> 32) - (int64_t)(uint32_t)r;
            if (t != me && left > most) {
                most = left;
                victim = t;
            }
        }
        if (victim < 0)
            return q->end;
        uint64_t *slot = &q->pool->slot[victim].range;
        uint64_t r = __atomic_load_n(slot, __ATOMIC_RELAXED);
        while ((uint32_t)r < (uint32_t)(r >> 32))
            if (__atomic_compare_exchange_n(slot, &r, r - ((uint64_t)1 << 32), 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                return (int64_t)(uint32_t)(r >> 32) - 1;
    }
}

/* The thread's next task, or a value >= q->end when none is left. */
static inline int64_t rlx_tasks_next(rlx_tasks *q)
{
    if (q->pool)
        return rlx_tasks_steal(q);
    return q->claim ? __atomic_fetch_add(q->shared, 1, __ATOMIC_RELAXED) : q->next++;
}

/* The thread's next run of tasks [*t0, *t1): its whole range at once, or one claimed (or stolen) task; 0 when
 * none is left. */
static inline int rlx_tasks_take(rlx_tasks *q, int64_t *t0, int64_t *t1)
{
    if (q->pool) {
        *t0 = rlx_tasks_steal(q);
        *t1 = *t0 + 1;
        return *t0 < q->end;
    }
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
