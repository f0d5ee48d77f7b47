/* Kernel time spans of a profiled CUDA build (RLX_PROFILE=1 / Session(Device.CUDA, profile=True)); never
 * included otherwise. Host code, inserted verbatim (no template code).
 *
 * rlx_forward records a CUDA event on the context's stream before the first kernel and after each kernel
 * with work; once the run has synchronized, rlx_prof_collect turns the events into spans on the host clock:
 * the run's start (CLOCK_MONOTONIC, taken as the run is enqueued) plus each event's time since the first
 * one (cudaEventElapsedTime, ~0.5 us resolution). A profiled build runs eagerly (no CUDA Graph replay), so
 * each kernel's events bracket that kernel alone. Spans go into a ring in the context, read back by
 * rlx_profile_read in the same layout as the CPU backend's (t0, t1, kernel, thread, run, flops, bytes);
 * thread is always -1 (the stream). */
#ifndef RLX_CUDA_PROFILE_CUH
#define RLX_CUDA_PROFILE_CUH

#include <stdint.h>
#include <time.h>

#define RLX_PROF_CAP 16384
#define RLX_PROF_FIELDS 7

struct RlxProfSpan {
    int64_t t0, t1;
    int32_t kernel, thread;
    int64_t run;
    double flops, bytes;
};

struct RlxProfRing {
    int64_t next;
    int64_t runs;
    RlxProfSpan spans[RLX_PROF_CAP];
};

static inline int64_t rlx_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void rlx_prof_record(RlxProfRing *ring, int32_t kernel, int64_t t0, int64_t t1, double flops,
                                   double bytes) {
    RlxProfSpan *s = &ring->spans[ring->next % RLX_PROF_CAP];
    ring->next++;
    s->t0 = t0;
    s->t1 = t1;
    s->kernel = kernel;
    s->thread = -1;
    s->run = ring->runs;
    s->flops = flops;
    s->bytes = bytes;
}

/* Nanoseconds from event a to event b (both completed). */
static inline int64_t rlx_prof_between(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (int64_t)((double)ms * 1e6);
}

static int64_t rlx_prof_read(const RlxProfRing *ring, int64_t *out, int64_t max) {
    const int64_t held = ring->next < RLX_PROF_CAP ? ring->next : RLX_PROF_CAP;
    int64_t n = 0;
    for (int64_t j = ring->next - held; j < ring->next && n < max; j++, n++) {
        const RlxProfSpan *s = &ring->spans[j % RLX_PROF_CAP];
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

#endif /* RLX_CUDA_PROFILE_CUH */
