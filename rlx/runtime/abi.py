"""The one cffi declaration of the RLX C ABI, shared by every generated library.

It mirrors `templates/cpu/rlx.h`; `ABI_VERSION` (from `rlx.abi_version`, shared with the
code generators) must equal what libraries report from `rlx_abi_version()`.

>>> ffi.sizeof("int64_t")
8
"""

from __future__ import annotations

import cffi

from rlx.abi_version import ABI_VERSION

CDEF = """
int32_t     rlx_abi_version(void);
const char *rlx_manifest(void);
void       *rlx_create(void);
void        rlx_destroy(void *ctx);
void       *rlx_clone(void *ctx);
int32_t     rlx_set_param(void *ctx, int32_t index, const void *data, int64_t nbytes);
int32_t     rlx_run(void *ctx, const int64_t *symbols, const void *const *inputs, void *const *outputs);
const char *rlx_last_error(void *ctx);
int32_t     rlx_set_num_threads(void *ctx, int32_t n);
int32_t     rlx_memory(void *ctx, int64_t *out);
"""

#: Exported by profiled builds only (templates/cpu/observe.c.j2); looked up when asked for.
PROFILE_CDEF = """
const char *rlx_profile_info(void);
int64_t     rlx_profile_read(void *ctx, int64_t *out, int64_t max);
void        rlx_profile_clear(void *ctx);
"""

#: Exported by graphs with collective ops only: on the CPU the transport (templates/cpu/kernels/
#: collectives.h, transport.h, transport_shm.h; `rlx.runtime.transport`), on CUDA rlx_set_nccl
#: (templates/cuda/nccl_abi.cu.j2; `rlx.runtime.nccl`).
TRANSPORT_CDEF = """
typedef struct RlxTransport {
    int32_t version;
    int32_t rank, world;
    int32_t reserved;
    void *state;
    int32_t (*all_reduce)(void *state, const void *send, void *recv, int64_t count, int32_t dtype, int32_t op);
    int32_t (*all_gather)(void *state, const void *send, void *recv, int64_t count, int32_t dtype);
    int32_t (*reduce_scatter)(void *state, const void *send, void *recv, int64_t recvcount, int32_t dtype,
                              int32_t op);
    const char *(*last_error)(void *state);
} RlxTransport;
int32_t       rlx_set_transport(void *ctx, const RlxTransport *t);
int64_t       rlx_shm_region_bytes(int32_t world, int64_t slot_bytes);
RlxTransport *rlx_shm_transport_open(void *region, int64_t bytes, int32_t rank, int32_t world, int64_t timeout_ms);
void          rlx_shm_transport_close(RlxTransport *t);
int32_t       rlx_set_nccl(void *ctx, const void *unique_id, int32_t rank, int32_t world);
"""

ffi = cffi.FFI()
ffi.cdef(CDEF)
ffi.cdef(PROFILE_CDEF)
ffi.cdef(TRANSPORT_CDEF)

__all__ = ["ABI_VERSION", "CDEF", "PROFILE_CDEF", "TRANSPORT_CDEF", "ffi"]
