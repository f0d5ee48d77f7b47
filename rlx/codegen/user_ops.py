"""What the CPU, CUDA and Metal rules of user-defined ops (`rlx.custom_op`) share: the user's code checked
against the node's digest, a backend's `accepts`, and the tensor struct each call fills."""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.text import comment
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.ops_user import DTYPE_CODES, UserOp, user_op_spec
from rlx.ir.shape import Shape


@dataclass(frozen=True)
class UserTensor:
    """C expressions of one `rlx_user_tensor` initializer."""

    ptr: str
    dtype: int
    rank: int
    numel: str
    dims: tuple[str, ...]


def user_tensor(emitter, ptr: str, dtype: DType, shape: Shape) -> UserTensor:
    """The `rlx_user_tensor` initializer of a buffer at `ptr` holding `shape` in `dtype`, its sizes as the
    backend `emitter` writes dims (`numel`, `dim`: expressions of the dynamic dims)."""
    return UserTensor(ptr=ptr, dtype=DTYPE_CODES[dtype], rank=shape.rank, numel=emitter.numel(shape.dims),
                      dims=tuple(emitter.dim(d) for d in shape.dims) or ("0",))


def source_comment(op: UserOp, backend: str) -> str:
    """A comment naming the header `op`'s `backend` code comes from."""
    return comment(user_op_spec(op.name).source(backend).header.name, 160)


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


__all__ = ["UserTensor", "accepts_for", "source_comment", "user_code", "user_tensor"]
