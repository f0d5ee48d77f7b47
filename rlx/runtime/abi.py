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

ffi = cffi.FFI()
ffi.cdef(CDEF)
ffi.cdef(PROFILE_CDEF)

__all__ = ["ABI_VERSION", "CDEF", "PROFILE_CDEF", "ffi"]
