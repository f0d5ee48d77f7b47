/* Kernel time spans of a profiled CUDA build (RLX_PROFILE=1 / Session(Device.CUDA, profile=True)); never
 * included otherwise. Host code, inserted verbatim (no template code).
 *
 * rlx_forward records a CUDA event on the context's stream before the first kernel and after each kernel
 * with work; once the run has synchronized, rlx_prof_collect turns the events into spans on the host clock:
 * the run's start (CLOCK_MONOTONIC, taken as the run is enqueued) plus each event's time since the first
 * one (cudaEventElapsedTime, ~0.5 us resolution). A profiled build runs eagerly (no CUDA Graph replay), so
 * each kernel's events bracket that kernel alone. Spans go into a ring in the context, read back by
 * rlx_profile_read: the CPU backend's ring and reader (kernels/profile_ring.h, inserted before this
 * text), so the fields are the same (t0, t1, kernel, thread, run, flops, bytes); thread is always -1
 * (the stream). */
#ifndef RLX_CUDA_PROFILE_CUH
#define RLX_CUDA_PROFILE_CUH

/* kernels/profile_ring.h (the span record, the ring, rlx_now_ns, rlx_prof_read) precedes this text. */
typedef rlx_prof_ring RlxProfRing;

/* One span of the stream (thread -1): the ring's record, as rlx_forward's event times give it. */
static inline void rlx_prof_record(RlxProfRing *ring, int32_t kernel, int64_t t0, int64_t t1, double flops,
                                   double bytes) {
    rlx_prof_record(ring, kernel, -1, t0, t1, flops, bytes);
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

#endif /* RLX_CUDA_PROFILE_CUH */
