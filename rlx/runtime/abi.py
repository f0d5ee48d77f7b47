"""The one cffi declaration of the RLX C ABI, shared by every generated library.

It mirrors `templates/cpu/rlx.h`; `ABI_VERSION` (from `rlx.abi_version`, shared with the
code generators) must equal what libraries report from `rlx_abi_version()`. The transport
table (`RlxTransport`) is not repeated here: its one declaration,
`templates/cpu/kernels/transport.h`, is read at import without its preprocessor lines
(`standalone_header` likewise inlines it into the `rlx.h` an artifact ships).

>>> ffi.sizeof("int64_t")
8
"""

from __future__ import annotations

import re
from pathlib import Path

import cffi

from rlx.abi_version import ABI_VERSION
from rlx.templates_path import templates_dir

#: A header's include of another RLX header (`#include "kernels/transport.h"`), relative to its target's templates.
_LOCAL_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$', re.MULTILINE)


def c_declarations(text: str) -> str:
    """C header text without its preprocessor lines (guards, includes, defines): what cffi's cdef parses.

    >>> c_declarations("#ifndef X\\n#define X\\nint f(void);\\n#endif").strip()
    'int f(void);'
    """
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def standalone_header(path: Path, root: Path | None = None) -> str:
    """The text of RLX header `path` with each `#include "..."` of another RLX header (relative to
    `root`, the target's templates directory: `path`'s own by default) replaced by that header's
    text, so a C program needs only this file.

    >>> "typedef struct RlxTransport" in standalone_header(templates_dir() / "cpu" / "rlx.h")
    True
    """
    root = path.parent if root is None else root
    return _LOCAL_INCLUDE.sub(lambda m: standalone_header(root / m.group(1), root).rstrip("\n"),
                              path.read_text(encoding="utf-8"))


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
TRANSPORT_TABLE = templates_dir() / "cpu" / "kernels" / "transport.h"
TRANSPORT_CDEF = c_declarations(TRANSPORT_TABLE.read_text(encoding="utf-8")) + """
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
