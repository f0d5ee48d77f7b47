/*
 * rlx.h — the C ABI every RLX-generated library exports (ABI version 4).
 *
 * One header serves every graph: the graph-specific facts (input, output and
 * param names, dtypes, shapes, dynamic dims and their bounds) are in the JSON
 * text returned by rlx_manifest(). Indices below are positions in the
 * manifest's "inputs", "outputs", "params" and "symbols" lists.
 *
 * Typical use from C (no Python needed):
 *
 *     void *ctx = rlx_create();                       // NULL: out of memory
 *     rlx_set_param(ctx, 0, w, sizeof w);             // every param, once
 *     int64_t sym[1] = {seq_len};                     // dynamic dims, manifest order
 *     const void *in[1] = {x};  void *out[1] = {y};
 *     if (rlx_run(ctx, sym, in, out) != 0)
 *         fprintf(stderr, "%s\n", rlx_last_error(ctx));
 *     rlx_destroy(ctx);
 *
 * Data layout: every tensor is dense, row-major, in its declared dtype
 * (bf16 and f16 as their 16-bit patterns, bool as one byte 0/1). Params are
 * passed in the layout the user declared; the library applies any internal
 * re-layout (manifest "layout") while copying, and stores weights that only
 * feed matrix products packed for its own GEMM kernel (which kernel depends
 * on the instruction set the library was built for). Param storage is private:
 * set a param again to change it. A param stored as the caller passes it (no
 * re-layout, packing or widening) may instead be bound in place
 * (rlx_bind_param): the context then reads the caller's memory, which must
 * stay valid and unchanged while it is bound (a table the library gathers many
 * rows of a run, such as an embedding table: RLX_PARAM_RESIDENT in the source,
 * is copied into the context's own large pages by the first run gathering many
 * rows, and read there afterwards).
 *
 * Threads: a context is not thread-safe; use one context per thread
 * (rlx_clone); contexts may run concurrently. Inside rlx_run all parallelism
 * is OpenMP (rlx_set_num_threads): products with a packed weight run on the
 * library's own kernel, and every other GEMM thread calls the BLAS
 * single-threaded on its own block, so the library sets its BLAS to one
 * thread (process-wide, for that BLAS library only) instead of letting two
 * thread pools compete for the cores.
 */
#ifndef RLX_H
#define RLX_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RLX_ABI_VERSION 4

/* ABI version the library was generated for (compare with RLX_ABI_VERSION). */
int32_t rlx_abi_version(void);

/* JSON manifest: name, inputs, outputs, params (name, dtype, shape, layout),
 * symbols (name, max), arena_bytes, abi_version, target, isa, key. Static storage. */
const char *rlx_manifest(void);

/* A new execution context: arena, param storage, scratch. NULL on failure. */
void *rlx_create(void);

/* Frees a context (NULL is ignored). */
void rlx_destroy(void *ctx);

/* A new context with ctx's params and thread count copied (params bound with
 * rlx_bind_param stay bound to the same memory, shared). NULL on failure. */
void *rlx_clone(void *ctx);

/* Copy param `index` from `data` (user layout, declared dtype, exactly
 * `nbytes` bytes). Returns 0, or nonzero with a message in rlx_last_error. */
int32_t rlx_set_param(void *ctx, int32_t index, const void *data, int64_t nbytes);

/* Use `data` (user layout, declared dtype, exactly `nbytes` bytes, aligned to
 * the element size) as param `index` in place, without copying: the context,
 * and every context cloned from it, reads that memory until the param is set
 * or bound again or the context is destroyed; the caller keeps it valid and
 * unchanged meanwhile. Only for params stored in the caller's layout; for one
 * stored packed, permuted, quantized or widened (or misaligned data) it returns
 * nonzero with a message in rlx_last_error, and the param is left as it was:
 * copy it with rlx_set_param instead. Returns 0 on success. */
int32_t rlx_bind_param(void *ctx, int32_t index, const void *data, int64_t nbytes);

/* Param `index` in the layout this library stores it (packed for its GEMM
 * kernel, permuted, quantized, widened, or as given): sets *data to the
 * context's copy and returns its size in bytes (the layout plus padding), or
 * -1 (and NULL) when the param is unset or bound to other memory. Those bytes,
 * kept (e.g. in a file) and given back to rlx_bind_stored of a context of
 * the same library, skip re-packing the caller's weight. */
int64_t rlx_param_stored(void *ctx, int32_t index, const void **data);

/* Use `data` (a param's stored bytes as rlx_param_stored gave them, for this
 * very library: exactly that size, 64-byte aligned) as param `index` in place,
 * like rlx_bind_param: read, never written, until the param is set or bound
 * again or the context is destroyed. Returns 0, or nonzero with a message. */
int32_t rlx_bind_stored(void *ctx, int32_t index, const void *data, int64_t nbytes);

/* Run the graph. `symbols` holds the values of the dynamic dims (each in
 * 1..max) in manifest order (may be NULL when there are none); `inputs` and
 * `outputs` hold one pointer per manifest entry; outputs are written in place
 * and must not overlap inputs. Never allocates. Returns 0, or nonzero with a
 * message in rlx_last_error (bad symbol, NULL pointer, unset param, gather
 * index out of range, integer division by zero). */
int32_t rlx_run(void *ctx, const int64_t *symbols, const void *const *inputs, void *const *outputs);

/* Message of the last failed call on ctx ("" if none). Valid until the next call. */
const char *rlx_last_error(void *ctx);

/* Threads used by rlx_run for both OpenMP loops and BLAS. n < 1 selects the
 * OpenMP default (OMP_NUM_THREADS or all cores). Returns the count now in
 * effect, or -1 if scratch space for n threads could not be allocated. */
int32_t rlx_set_num_threads(void *ctx, int32_t n);

/* The team of the next runs: `threads` (clamped to 1..the count last given to
 * rlx_set_num_threads) and whether the OpenMP team's idle threads spin
 * (`spins` nonzero: forks are cheap, so small products are split too; pass 0
 * when the process runs with OMP_WAIT_POLICY=passive). Allocates nothing.
 * RLX's Python runtime calls it between runs to shrink the team while other
 * processes compete for the cores. Returns the count set, -1 if ctx is NULL. */
int32_t rlx_set_team(void *ctx, int32_t threads, int32_t spins);

/* Bytes the context holds, as allocated: out[0] arena, out[1] params,
 * out[2] scratch (for the threads reserved so far), out[3] the context
 * record. Returns 0, or 1 if ctx or out is NULL. */
int32_t rlx_memory(void *ctx, int64_t out[4]);

/* ── collectives (only libraries of graphs with all_reduce / all_gather / reduce_scatter) ──
 *
 * Such a graph runs once per rank; each rank's context is given that rank's transport, a
 * function table its collectives call. Libraries with collectives export the functions below;
 * others do not (and are otherwise unchanged). The table, RlxTransport, is declared once, in
 * kernels/transport.h; an artifact's copy of this header has that file's text in place of the
 * #include below, so it stands alone. */
#include "kernels/transport.h"

/* Attach a transport to ctx (NULL detaches); it must outlive the runs. 0, or 1 with a message. */
int32_t rlx_set_transport(void *ctx, const RlxTransport *t);

/* The built-in shared-memory transport, for ranks that are threads of one process or processes
 * mapping one region: rlx_shm_region_bytes(world, slot_bytes) sizes the region (zero-filled,
 * 64-byte aligned; a 128-byte header, abort flag at byte 8, then two sets of one slot per rank);
 * rlx_shm_transport_open makes rank `rank`'s transport over it (NULL on bad arguments), whose
 * collectives fail after waiting `timeout_ms` for the others or once the abort flag is set. */
int64_t rlx_shm_region_bytes(int32_t world, int64_t slot_bytes);
RlxTransport *rlx_shm_transport_open(void *region, int64_t bytes, int32_t rank, int32_t world, int64_t timeout_ms);
void rlx_shm_transport_close(RlxTransport *t);

#ifdef __cplusplus
}
#endif

#endif /* RLX_H */
