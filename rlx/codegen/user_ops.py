"""What the CPU and CUDA rules of user-defined ops (`rlx.custom_op`) share: the user's code checked against
the node's digest, a backend's `accepts`, and the tensor struct each call fills."""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.text import comment
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.ops_user import UserOp, user_op_spec


@dataclass(frozen=True)
class UserTensor:
    """C expressions of one `rlx_user_tensor` initializer."""

    ptr: str
    dtype: int
    rank: int
    numel: str
    dims: tuple[str, ...]


def user_code(op: UserOp, backend: str) -> tuple[str, str, str]:
    """(function, comment, header text) of `op` on `backend`, the header checked against the node's digest."""
    spec = user_op_spec(op.name)
    src = spec.source(backend)
    if src is None:
        raise BuildError(f"custom op {op.name!r} has no {backend}= code")
    if spec.digest() != op.digest:
        raise BuildError(f"custom op {op.name!r}: its header or registration changed since the graph was traced; "
                         f"trace the graph again")
    note = comment(f"custom op {op.name} ({backend}): {src.header.name}, sha256 {op.digest}", 200)
    return src.function, note, src.text()


def accepts_for(backend: str):
    """The `accepts` of a backend's user_op rule: the op must bring that backend's code."""

    def accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
        spec = user_op_spec(op.name)  # type: ignore[attr-defined]
        return None if spec.source(backend) is not None else f"{spec.name!r}: it was registered without {backend}= code"

    return accepts


__all__ = ["UserTensor", "accepts_for", "user_code"]
