/* The execution context's life cycle and the param-loading half of the RLX C ABI (rlx.h).
 * A fixed RLX kernel header: no template code. The generated file includes it after defining
 * rlx_ctx, the RLX_N_* sizes and the rlx_params / name tables it reads. */
#ifndef RLX_KERNELS_CONTEXT_H
#define RLX_KERNELS_CONTEXT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Fresh 64-byte aligned memory, deliberately not zeroed: every buffer is written before it is
 * read (rlx_run refuses to start until every param is set), and leaving the pages untouched
 * keeps rlx_create from faulting in the whole arena and param storage up front. Blocks of
 * 2 MiB and more are huge-page aligned; the param storage (`huge_pages`) is also advised as
 * such (fewer TLB misses while weights stream through the GEMMs; set_param writes all of it
 * anyway), a hint the kernel may ignore. The arena and scratch are not: a run touches only
 * what its dynamic dims need, spread over the arena, and a huge page would make the first
 * touch of each such spot zero (and maybe compact) 2 MiB: a small first run of MiniLM took a
 * median 42 ms instead of 18 (8 fresh processes each; 22 instead of 18 in another set). The
 * arena goes to huge pages later, if the LIR says so, once a run uses enough of it
 * (rlx_arena_pages). */
static size_t rlx_alloc_align(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    return bytes >= huge ? huge : RLX_ALIGN;
}

/* The bytes rlx_alloc takes for a block of `bytes`. */
static size_t rlx_alloc_size(size_t bytes)
{
    const size_t align = rlx_alloc_align(bytes);
    return bytes ? (bytes + align - 1) / align * align : RLX_ALIGN;
}

static int rlx_alloc(char **out, size_t bytes, int huge_pages)
{
    const size_t huge = (size_t)2 << 20;
    const size_t align = rlx_alloc_align(bytes);
    const size_t n = rlx_alloc_size(bytes);
    void *p = NULL;
    if (posix_memalign(&p, align, n) != 0)
        return 1;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (huge_pages && align == huge)
        (void)madvise(p, n, MADV_HUGEPAGE);
#else
    (void)huge_pages;
#endif
    *out = (char *)p;
    return 0;
}

/* Size the scratch block for exactly `threads` threads: it shrinks too, so a context set to fewer threads than
 * rlx_create's default holds (and rlx_memory reports) what Session.estimate predicts for that count. */
static int rlx_reserve_scratch(rlx_ctx *ctx, int threads)
{
    if (RLX_SCRATCH_SHARED + RLX_SCRATCH_PER_THREAD == 0 || threads == ctx->scratch_threads)
        return 0;
    char *fresh = NULL;
    if (rlx_alloc(&fresh, (size_t)RLX_SCRATCH_SHARED + (size_t)threads * RLX_SCRATCH_PER_THREAD, 0))
        return 1;
    free(ctx->scratch);
    ctx->scratch = fresh;
    ctx->scratch_threads = threads;
    return 0;
}

RLX_EXPORT const char *rlx_manifest(void) { return rlx_manifest_text; }

RLX_EXPORT void rlx_destroy(void *vctx)
{
    rlx_ctx *ctx = (rlx_ctx *)vctx;
    if (!ctx)
        return;
    free(ctx->arena);
    free(ctx->params);
    free(ctx->scratch);
    free(ctx);
}

RLX_EXPORT void *rlx_create(void)
{
    rlx_ctx *ctx = (rlx_ctx *)calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    ctx->nthreads = rlx_default_threads();
    if (ctx->nthreads < 1)
        ctx->nthreads = 1;
    ctx->spins = 1;
    if (rlx_alloc(&ctx->arena, RLX_ARENA_BYTES, 0) || rlx_alloc(&ctx->params, RLX_PARAMS_BYTES, 1) ||
        rlx_reserve_scratch(ctx, ctx->nthreads)) {
        rlx_destroy(ctx);
        return NULL;
    }
    for (int i = 0; i < RLX_N_PARAMS; i++)
        ctx->param_at[i] = ctx->params + rlx_params[i].offset;
    return ctx;
}

/* Bytes of param `i`'s slot in ctx->params (the slots are laid out in order, each up to the next). */
static size_t rlx_param_slot_bytes(int i)
{
    const int64_t end = i + 1 < RLX_N_PARAMS ? rlx_params[i + 1].offset : RLX_PARAMS_BYTES;
    return (size_t)(end - rlx_params[i].offset);
}

/* HugePageArena: the first run whose share of the arena (the arena times the product of its dynamic dims over their
 * bounds') reaches RLX_ARENA_HUGE_RUN bytes advises the arena 2 MiB pages before its kernels, and first drops what
 * earlier runs faulted in as 4 KiB pages (MADV_DONTNEED: nothing in the arena outlives a run, every buffer is
 * written before it is read), so the run faults in huge pages wherever it writes. Such a run walks more 4 KiB pages
 * than the TLB holds (MiniLM at 8 x 128: 0.3-2.3% of a call), while a small run never pays for zeroing whole 2 MiB
 * pages. (MADV_COLLAPSE instead of dropping the pages: 2.5-175 ms for 10-76 MiB, against ~1 ms a 10 MiB run's own
 * faults.) Needs rlx_symbol_max. */
static void rlx_arena_pages(rlx_ctx *ctx, const int64_t *sym)
{
#if RLX_ARENA_HUGE_RUN > 0 && defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MADV_DONTNEED)
    if (ctx->arena_huge)
        return;
    double share = (double)RLX_ARENA_BYTES;
    for (int i = 0; i < RLX_N_SYMBOLS; i++)
        share *= (double)sym[i] / (double)rlx_symbol_max[i];
    if (share < (double)RLX_ARENA_HUGE_RUN)
        return;
    ctx->arena_huge = 1;
    const size_t n = rlx_alloc_size(RLX_ARENA_BYTES);
    if (madvise(ctx->arena, n, MADV_HUGEPAGE) == 0)
        (void)madvise(ctx->arena, n, MADV_DONTNEED);
#else
    (void)ctx;
    (void)sym;
#endif
}

/* ResidentTable: param `index` (RLX_PARAM_RESIDENT), when bound to memory that is not its slot (the caller's, mapped
 * from a weights file on 4 KiB pages: a TLB miss a gathered row), is copied into the slot (ctx->params: 2 MiB pages)
 * by the first run gathering `rows` >= `min_rows` of its rows, before that run's kernels; later runs read the copy,
 * until the param is bound again. A run gathering fewer rows (a short sentence) reads it where it is. */
static inline void rlx_resident_table(rlx_ctx *ctx, int index, int64_t rows, int64_t min_rows)
{
    char *slot = ctx->params + rlx_params[index].offset;
    if (rows < min_rows || ctx->param_at[index] == slot)
        return;
    memcpy(slot, ctx->param_at[index], (size_t)rlx_params[index].nbytes);
    ctx->param_at[index] = slot;
}

RLX_EXPORT void *rlx_clone(void *vsrc)
{
    const rlx_ctx *src = (const rlx_ctx *)vsrc;
    if (!src)
        return NULL;
    rlx_ctx *ctx = (rlx_ctx *)rlx_create();
    if (!ctx)
        return NULL;
    if (rlx_reserve_scratch(ctx, src->nthreads)) {
        rlx_destroy(ctx);
        return NULL;
    }
    ctx->nthreads = src->nthreads;
    ctx->spins = src->spins;
    /* a param bound to the caller's memory is shared (read-only: nothing to copy); one stored in src's
     * slot is copied; an unset slot holds nothing yet (copying it would only fault its pages in) */
    for (int i = 0; i < RLX_N_PARAMS; i++) {
        if (src->param_at[i] != src->params + rlx_params[i].offset)
            ctx->param_at[i] = src->param_at[i];
        else if (src->param_set[i])
            memcpy(ctx->param_at[i], src->param_at[i], rlx_param_slot_bytes(i));
    }
    memcpy(ctx->param_set, src->param_set, sizeof ctx->param_set);
    return ctx;
}

/* What the context holds, in bytes as allocated: out[0] arena, out[1] params, out[2] scratch (for the
 * threads reserved so far), out[3] the context record itself. Returns 0, or 1 for a NULL argument. */
RLX_EXPORT int32_t rlx_memory(void *vctx, int64_t *out)
{
    const rlx_ctx *ctx = (const rlx_ctx *)vctx;
    if (!ctx || !out)
        return 1;
    const size_t scratch = (size_t)RLX_SCRATCH_SHARED + (size_t)ctx->scratch_threads * RLX_SCRATCH_PER_THREAD;
    out[0] = (int64_t)rlx_alloc_size(RLX_ARENA_BYTES);
    out[1] = (int64_t)rlx_alloc_size(RLX_PARAMS_BYTES);
    out[2] = ctx->scratch ? (int64_t)rlx_alloc_size(scratch) : 0;
    out[3] = (int64_t)sizeof *ctx;
    return 0;
}

RLX_EXPORT const char *rlx_last_error(void *vctx)
{
    return vctx ? ((rlx_ctx *)vctx)->err : "null context";
}

RLX_EXPORT int32_t rlx_set_num_threads(void *vctx, int32_t n)
{
    rlx_ctx *ctx = (rlx_ctx *)vctx;
    if (!ctx)
        return -1;
    if (n < 1)
        n = rlx_default_threads();
    if (n < 1)
        n = 1;
    if (rlx_reserve_scratch(ctx, n)) {
        rlx_fail(ctx, "cannot allocate scratch space for %d threads", (int)n);
        return -1;
    }
    ctx->nthreads = n;
    return n;
}

/* The team of the next runs, as the runtime decides it between runs (rlx.runtime.team): `threads`
 * (clamped to 1..the count rlx_set_num_threads reserved scratch for) and whether the idle threads of
 * the OpenMP team spin (`spins` nonzero: forking is cheap, so small products are split too). Sets
 * nothing else and allocates nothing, so it is cheap enough to call before any run. Returns the
 * thread count set, or -1 for a NULL context. */
RLX_EXPORT int32_t rlx_set_team(void *vctx, int32_t threads, int32_t spins)
{
    rlx_ctx *ctx = (rlx_ctx *)vctx;
    if (!ctx)
        return -1;
    const int32_t most = ctx->scratch_threads > 0 ? ctx->scratch_threads : ctx->nthreads;
    ctx->nthreads = threads < 1 ? 1 : (threads > most ? most : threads);
    ctx->spins = spins != 0;
    return ctx->nthreads;
}

/* The checks rlx_set_param and rlx_bind_param share: the param `index` names, or NULL with a message. */
/* The param `index` names, once the call's arguments are checked; NULL (the error recorded in a context) if not. */
static const rlx_param_info *rlx_param_arg(rlx_ctx *ctx, int32_t index, const void *data, int64_t nbytes)
{
    if (!ctx)
        return NULL;
    ctx->err[0] = 0;
    if (index < 0 || index >= RLX_N_PARAMS) {
        rlx_fail(ctx, "param index %d is out of range (the graph has %d params)", (int)index, RLX_N_PARAMS);
        return NULL;
    }
    const rlx_param_info *p = &rlx_params[index];
    if (!data) {
        rlx_fail(ctx, "param '%s': data is NULL", p->name);
        return NULL;
    }
    if (nbytes != p->nbytes) {
        rlx_fail(ctx, "param '%s' takes %lld bytes, got %lld", p->name, (long long)p->nbytes, (long long)nbytes);
        return NULL;
    }
    return p;
}

RLX_EXPORT int32_t rlx_bind_param(void *vctx, int32_t index, const void *data, int64_t nbytes)
{
    rlx_ctx *ctx = (rlx_ctx *)vctx;
    const rlx_param_info *p = rlx_param_arg(ctx, index, data, nbytes);
    if (!p)
        return 1;
    if (p->mode != RLX_PARAM_COPY && p->mode != RLX_PARAM_RESIDENT)
        return rlx_fail(ctx, "param '%s' is stored in another layout than the caller's (packed, permuted, "
                        "quantized or widened): copy it with rlx_set_param", p->name);
    if ((uintptr_t)data % p->elsize != 0)
        return rlx_fail(ctx, "param '%s': data is not aligned to its %zu-byte elements", p->name, p->elsize);
    ctx->param_at[index] = (char *)(uintptr_t)data;  /* never written through: the kernels only read params */
    ctx->param_set[index] = 1;
    return 0;
}

/* Param `index` as this context stores it (packed, permuted, quantized or widened, or as given): its
 * slot's bytes (the layout plus alignment padding) at *data. -1 (and *data NULL) when the param is not
 * set, or is bound to memory that is not its slot (rlx_bind_param, rlx_bind_stored). What a cache keeps
 * to bind again later with rlx_bind_stored instead of re-packing the caller's weight. */
RLX_EXPORT int64_t rlx_param_stored(void *vctx, int32_t index, const void **data)
{
    rlx_ctx *ctx = (rlx_ctx *)vctx;
    if (data)
        *data = NULL;
    if (!ctx || !data || index < 0 || index >= RLX_N_PARAMS || !ctx->param_set[index] ||
        ctx->param_at[index] != ctx->params + rlx_params[index].offset)
        return -1;
    *data = ctx->param_at[index];
    return (int64_t)rlx_param_slot_bytes(index);
}

/* Use `data` as param `index` in the layout this library stores it (bytes rlx_param_stored gave, e.g.
 * kept in a file and mapped again), without converting: exactly the slot's size, 64-byte aligned (the
 * packed kernels load it aligned). The contexts read that memory as rlx_bind_param's. */
RLX_EXPORT int32_t rlx_bind_stored(void *vctx, int32_t index, const void *data, int64_t nbytes)
{
    rlx_ctx *ctx = (rlx_ctx *)vctx;
    if (!ctx)
        return 1;
    ctx->err[0] = 0;
    if (index < 0 || index >= RLX_N_PARAMS)
        return rlx_fail(ctx, "param index %d is out of range (the graph has %d params)", (int)index, RLX_N_PARAMS);
    const rlx_param_info *p = &rlx_params[index];
    if (!data)
        return rlx_fail(ctx, "param '%s': data is NULL", p->name);
    if (nbytes != (int64_t)rlx_param_slot_bytes(index))
        return rlx_fail(ctx, "param '%s' is stored in %lld bytes, got %lld", p->name,
                        (long long)rlx_param_slot_bytes(index), (long long)nbytes);
    if ((uintptr_t)data % RLX_ALIGN != 0)
        return rlx_fail(ctx, "param '%s': stored data is not %d-byte aligned", p->name, (int)RLX_ALIGN);
    ctx->param_at[index] = (char *)(uintptr_t)data;  /* never written through: the kernels only read params */
    ctx->param_set[index] = 1;
    return 0;
}

RLX_EXPORT int32_t rlx_set_param(void *vctx, int32_t index, const void *data, int64_t nbytes)
{
    rlx_ctx *ctx = (rlx_ctx *)vctx;
    const rlx_param_info *p = rlx_param_arg(ctx, index, data, nbytes);
    if (!p)
        return 1;
    ctx->param_at[index] = ctx->params + p->offset;  /* back in its own slot, should it have been bound */
#ifdef RLX_KERNELS_INT8_GEMM_H
    if (p->mode == RLX_PARAM_INT8)  /* quantized per output channel into the int8 panels (int8_gemm) */
        rlx_i8_quantize_param(ctx->params + p->offset, (const float *)data, p->dims, p->src_strides);
    else
#endif
#ifdef RLX_KERNELS_GEMM_BF16_H
    if (p->mode == RLX_PARAM_PACK_BF16 || p->mode == RLX_PARAM_PACK_F16)
        rlx_pack_param_half((uint16_t *)(ctx->params + p->offset), (const uint16_t *)data, p->rank - 2, p->dims,
                            p->src_strides, p->mode == RLX_PARAM_PACK_BF16);
    else
#endif
#ifdef RLX_KERNELS_CONV_H
    if (p->mode == RLX_PARAM_WINOGRAD)  /* a 3x3 conv weight as its Winograd transform (conv) */
        rlx_conv_winograd_weight((float *)(ctx->params + p->offset), (const float *)data, p->dims);
    else if (p->mode == RLX_PARAM_WINOGRAD4)  /* the same as its Winograd F(4x4, 3x3) transform */
        rlx_conv_winograd4_weight((float *)(ctx->params + p->offset), (const float *)data, p->dims);
    else
#endif
#ifdef RLX_KERNELS_QUANT_H
    if (p->mode == RLX_PARAM_QI_Q8_0 || p->mode == RLX_PARAM_QI_Q4_0 || p->mode == RLX_PARAM_QI_Q4_1)
        /* GGUF rows interleaved by 16 (kernels/quant.h) */
        rlx_qi_interleave_param(p->mode == RLX_PARAM_QI_Q4_1 ? RLX_Q4_1 : p->mode == RLX_PARAM_QI_Q4_0 ? RLX_Q4_0 : RLX_Q8_0,
                                (uint8_t *)(ctx->params + p->offset), (const uint8_t *)data, p->dims[0], p->dims[1]);
    else
#endif
#ifdef RLX_KERNELS_PACKED_GEMM_H
    if (p->mode == RLX_PARAM_PACK)
        rlx_pack_param((float *)(ctx->params + p->offset), (const float *)data, p->rank - 2, p->dims, p->src_strides);
    else
#endif
    if (p->mode == RLX_PARAM_WIDEN_BF16 || p->mode == RLX_PARAM_WIDEN_F16) {
        /* exact: every f16/bf16 value is an f32; the run reads this copy (no per-call cast) */
        const uint16_t *src = (const uint16_t *)data;
        float *dst = (float *)(ctx->params + p->offset);
        for (int64_t i = 0; i < nbytes / 2; i++)
            dst[i] = p->mode == RLX_PARAM_WIDEN_BF16 ? rlx_bf2f(src[i]) : rlx_h2f(src[i]);
    } else if (p->mode == RLX_PARAM_PERMUTE)
        rlx_permute_copy(ctx->params + p->offset, (const char *)data, p->rank, p->dims, p->src_strides, p->elsize);
    else
        memcpy(ctx->params + p->offset, data, (size_t)nbytes);
    ctx->param_set[index] = 1;
    return 0;
}

#endif /* RLX_KERNELS_CONTEXT_H */
