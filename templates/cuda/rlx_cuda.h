/*
 * rlx_cuda.h — what an RLX library generated for NVIDIA GPUs (Session(Device.CUDA)) exports.
 *
 * It implements the common RLX C ABI of templates/cpu/rlx.h (same names, same meaning, same manifest),
 * with these CUDA specifics, then adds the functions below.
 *
 *   rlx_create      one cudaMalloc for everything (params, constants, IO staging, the arena, scratch,
 *                   the cuBLASLt workspace) on the current device, a stream, a cuBLASLt handle. NULL on
 *                   failure (no device, out of device memory, built for another GPU arch); the reason
 *                   is then in rlx_last_error(NULL).
 *   rlx_set_param   host data in the declared dtype and user layout; converted on the device once to the
 *                   compute precision (manifest "precision") and to the internal layout.
 *   rlx_run         host buffers: copies inputs in, replays the CUDA Graph captured for these dynamic-dim
 *                   values (the first run with new values runs eagerly, reporting errors per node, then
 *                   captures), copies outputs out, synchronizes. Symbols may be 0..max.
 *   rlx_clone       a new context with the params copied device to device.
 *   rlx_set_num_threads  no effect on a GPU program; returns 1.
 *
 * Return codes: 0 success, -1 a bad argument (message in rlx_last_error), -2 a CUDA or cuBLASLt failure
 * (launch failure, out of memory, ...). After an error that corrupts the CUDA context (an illegal
 * address, say) the context refuses further work; the process keeps running.
 *
 * A context is not thread-safe; it owns one stream, created with default flags so that it orders
 * itself after work on the legacy default stream (PyTorch's default).
 */
#ifndef RLX_CUDA_H
#define RLX_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Like rlx_run, but inputs and outputs are device pointers on the context's device (dense, declared
 * dtypes). Inputs are read, and outputs written, on the context's stream; the call returns once the
 * outputs are written. A caller producing inputs on another stream must synchronize it first
 * (rlx_cuda_stream_sync). */
int32_t rlx_run_device(void *ctx, const int64_t *symbols, const void *const *inputs, void *const *outputs);

/* Like rlx_run_device, but state inputs (a KV cache) stay resident in the context between runs: a state buffer
 * is read when a run passes it for the first time, and written back when a run passes another buffer for that
 * state or at rlx_state_release. Until then the caller must not read, write or free it. */
int32_t rlx_run_device_resident(void *ctx, const int64_t *symbols, const void *const *inputs,
                                void *const *outputs);

/* One step of a loop fed from host memory (a decoder's token step): state inputs are device pointers kept resident
 * (as rlx_run_device_resident), the other inputs host pointers, packed into a pinned copy of their staging span
 * (the layout keeps it contiguous) and sent in one transfer; outputs are host pointers, NULL for an output not
 * wanted (it is not copied back). Returns once the wanted outputs are written. */
int32_t rlx_run_host_step(void *ctx, const int64_t *symbols, const void *const *inputs, void *const *outputs);

/* rlx_run_host_step in two calls, so that the host can prepare (and launch) the next step while one runs.
 * rlx_host_step_launch queues the step — its inputs are read before it returns; `outputs` only says which are
 * wanted (non-NULL) — and sets *ticket; rlx_host_step_finish waits for that step, copies its wanted outputs to
 * `outputs` (host pointers) and reports its errors (the device error flag included). At most two steps may be
 * launched and not finished; each has pinned mirrors of its own, and steps of different dims may be in flight
 * together (they run in launch order). */
int32_t rlx_host_step_launch(void *ctx, const int64_t *symbols, const void *const *inputs, void *const *outputs,
                             int32_t *ticket);
int32_t rlx_host_step_finish(void *ctx, int32_t ticket, void *const *outputs);

/* Write every resident state back to its buffer and forget it; returns once done. 0, -1 or -2. */
int32_t rlx_state_release(void *ctx);

/* Device memory for callers without a CUDA library of their own. NULL on failure (rlx_last_error(NULL)). */
void   *rlx_cuda_malloc(int64_t nbytes);
void    rlx_cuda_free(void *p);

/* How many CUDA graphs ctx holds captured for its runs: 0 once a capture failed (it runs eagerly since), -1 for NULL. */
int32_t rlx_cuda_graphs_captured(void *ctx);

/* Pinned (page-locked, portable) host memory, or NULL with rlx_last_error(NULL) set; freed by rlx_cuda_host_free. */
void   *rlx_cuda_host_alloc(int64_t nbytes);
void    rlx_cuda_host_free(void *p);

/* Synchronous copy; kind 0 host->device, 1 device->host, 2 device->device. 0 or -2. */
int32_t rlx_cuda_memcpy(void *dst, const void *src, int64_t nbytes, int32_t kind);

/* Wait for a stream: a cudaStream_t, or 2 for the per-thread default stream
 * (the "stream" entry of __cuda_array_interface__). 0 or -2. */
int32_t rlx_cuda_stream_sync(uint64_t stream);

#ifdef __cplusplus
}
#endif

#endif /* RLX_CUDA_H */
