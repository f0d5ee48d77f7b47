"""The one cffi declaration of the RLX C ABI, shared by every generated library.

The declarations are not repeated here: `CDEF` is `templates/cpu/rlx.h` read at import, with
the RLX headers it includes inlined (the transport table's one declaration,
`kernels/transport.h`; `standalone_header`, which also writes the `rlx.h` an artifact ships)
and its preprocessor lines dropped. `ABI_VERSION` (from `rlx.abi_version`, shared with the
code generators) must equal what libraries report from `rlx_abi_version()`.

>>> ffi.sizeof("int64_t")
8
"""

from __future__ import annotations

import re
from pathlib import Path

from rlx.abi_version import ABI_VERSION
from rlx.runtime.ffi_memo import load_ffi
from rlx.templates_path import templates_dir

#: A header's include of another RLX header (`#include "kernels/transport.h"`), relative to its target's templates.
_LOCAL_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$', re.MULTILINE)


def c_declarations(text: str) -> str:
    """C header text without its preprocessor lines (guards, includes, defines) and its C++-only
    `#ifdef __cplusplus` blocks: what cffi's cdef parses.

    >>> c_declarations("#ifndef X\\n#ifdef __cplusplus\\nextern \\"C\\" {\\n#endif\\nint f(void);\\n#endif").strip()
    'int f(void);'
    """
    out: list[str] = []
    in_cplusplus = False
    for line in text.splitlines():
        directive = line.strip()
        if directive.startswith("#ifdef __cplusplus"):
            in_cplusplus = True
        elif in_cplusplus and directive.startswith("#endif"):
            in_cplusplus = False
        elif not in_cplusplus and not directive.startswith("#"):
            out.append(line)
    return "\n".join(out)


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


#: The ABI header (templates/cpu/rlx.h); every library exports its functions, except the transport's
#: (rlx_set_transport, rlx_shm_*: graphs with collective ops only; `rlx.runtime.transport`).
ABI_HEADER = templates_dir() / "cpu" / "rlx.h"
CDEF = c_declarations(standalone_header(ABI_HEADER))

#: Exported by profiled builds only (templates/cpu/observe.c.j2); looked up when asked for.
PROFILE_CDEF = """
const char *rlx_profile_info(void);
int64_t     rlx_profile_read(void *ctx, int64_t *out, int64_t max);
void        rlx_profile_clear(void *ctx);
"""

#: Exported by CUDA graphs with collective ops only (templates/cuda/nccl_abi.cu.j2; `rlx.runtime.nccl`).
NCCL_CDEF = """
int32_t rlx_set_nccl(void *ctx, const void *unique_id, int32_t rank, int32_t world);
int32_t rlx_nccl_p2p(void *ctx);
"""

#: Parsed once per machine (the cache's memo, `rlx.runtime.ffi_memo`), not in every process.
ffi = load_ffi((CDEF, PROFILE_CDEF, NCCL_CDEF))

__all__ = ["ABI_VERSION", "CDEF", "NCCL_CDEF", "PROFILE_CDEF", "ffi"]
