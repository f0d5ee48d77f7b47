/* Test harness (tests/codegen/test_cpu_tasks.py): rlx_tasks (templates/cpu/kernels/threads.h) in an OpenMP region,
 * recording which thread ran each task. Built with -fopenmp and RLX's base flags. */
#include <stdint.h>
#include <time.h>

#include "kernels/threads.h"

#define EXPORT __attribute__((visibility("default")))

static void rlx_test_sleep_us(int64_t us)
{
    const struct timespec d = {us / 1000000, (long)(us % 1000000) * 1000};
    nanosleep(&d, NULL);
}

/* Tasks [0, n) on `nt` threads, each starting on its range of the pool's even split [n t / nt, n (t + 1) / nt)
 * (`take` 0: rlx_tasks_next, 1: rlx_tasks_take), with a spinning team's policy (`spins`). Thread `slow` sleeps
 * `delay_us` before it starts and after each of its tasks. owner[i] <- the thread that ran task i, count[i] <- how
 * many times it ran. Returns the team size the region got. */
EXPORT int chk_tasks(int64_t n, int nt, int spins, int take, int slow, int64_t delay_us, int32_t *owner,
                     int32_t *count)
{
    int got = 0;
    rlx_task_pool pool;
    rlx_task_pool_split(&pool, n, nt);
    #pragma omp parallel num_threads(nt)
    {
        const int me = rlx_thread_id();
        if (me == 0)
            got = rlx_team_size();
        const int64_t lo = n * me / rlx_team_size(), hi = n * (me + 1) / rlx_team_size();
        if (me == slow)
            rlx_test_sleep_us(delay_us);
        rlx_tasks q = rlx_tasks_begin_pool(n, lo, hi, spins, &pool);
        int64_t t0, t1;
        for (;;) {
            if (take) {
                if (!rlx_tasks_take(&q, &t0, &t1))
                    break;
            } else {
                t0 = rlx_tasks_next(&q);
                t1 = t0 + 1;
                if (t0 >= q.end)
                    break;
            }
            for (int64_t t = t0; t < t1; t++) {
                owner[t] = me;
                __atomic_fetch_add(&count[t], 1, __ATOMIC_RELAXED);
                if (me == slow)
                    rlx_test_sleep_us(delay_us);
            }
        }
    }
    return got;
}
