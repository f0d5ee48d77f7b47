"""The version of RLX's exported C ABI (`rlx_abi_version()`, `RLX_ABI_VERSION` in rlx.h).

It lives in a module of its own at the bottom of the layer order, importing
nothing, so the code generators (which write it into every library) and the
runtime (which checks it when loading one) share the number without the
runtime importing a code generator.

>>> from rlx.abi_version import ABI_VERSION
>>> ABI_VERSION
4
"""

ABI_VERSION = 4  # 3: rlx_bind_param; 4: rlx_param_stored, rlx_bind_stored
#: Version of the transport function table (`RlxTransport.version`, `RLX_TRANSPORT_VERSION` in
#: templates/cpu/kernels/transport.h, which rlx.h includes) that graphs with collective ops take through
#: `rlx_set_transport`. Separate from ABI_VERSION: graphs without collectives are unchanged.
TRANSPORT_VERSION = 1

__all__ = ["ABI_VERSION", "TRANSPORT_VERSION"]
