"""User-defined ops: `rlx.custom_op` registers an op from outside the package (the MIR op `user_op`).

A user op is named; its registration (`UserOpSpec`) says how its output's
shape and dtype follow from its inputs' (`infer`), what it computes (`reference`,
numpy: the oracle every backend is tested against) and, per backend, the C,
CUDA or MSL function that computes it on a device, given as a header file the
user points to (`OpSource`). Registrations live in this process (`USER_OPS`,
like the MIR op set `OPS`); a graph holding the op, or loading one, needs it.

The node (`UserOp`) holds the op's name, the digest of its registration (the
header files' bytes and function names: `UserOpSpec.digest`) and, when the
user gave one, the traced derivative body `vjp`. The digest is an attribute, so
it is part of the graph's hash, the compile index's fingerprint and the LIR's
identity: editing a header and tracing again compiles anew. A graph traced
before the edit is refused (`check_current`) rather than run with a stale program.

Each backend's function follows one calling convention (the struct is in
``templates/cpu/kernels/user_op.h``, ``templates/cuda/kernels/user_op.cuh`` and
``templates/metal/kernels/user_op.metal``)::

    int fn(const rlx_user_tensor *inputs, int32_t n_inputs, rlx_user_tensor *output, int32_t nthreads);  /* C */
    int fn(const rlx_user_tensor *inputs, int32_t n_inputs, rlx_user_tensor *output, cudaStream_t stream); /* CUDA */
    int fn(thread const rlx_user_tensor *inputs, int n_inputs, thread const rlx_user_tensor *output,
           long i);                                                                                     /* MSL */

returning 0, or a nonzero status the run reports as an error (naming the op
on the CPU and CUDA). A tensor is its data pointer, dtype code (`DTYPE_CODES`),
rank, element count and dims (row-major, contiguous). A CUDA function launches
its kernels on `stream` (it must neither synchronize nor allocate: runs are
captured as CUDA Graphs). An MSL function runs on the GPU, once per output
element (one thread each): it writes output element `i`, reading any input.

>>> import numpy as np
>>> spec = UserOpSpec("twice_demo", infer=lambda x: x, reference=lambda x: 2 * x)
>>> register_user_op(spec)
>>> from rlx.ir.graph import Graph
>>> g = Graph("u")
>>> g.set_outputs([g.user_op("twice_demo", [g.input("x", [3])])])
>>> str(g.node(g.outputs[0]).shape)
'f32[3]'
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rlx.errors import BuildError, IRError, ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import Op
from rlx.ir.ops_scan import Body
from rlx.ir.shape import Shape

#: Backends a user op may bring code for (the keyword arguments of `rlx.custom_op`).
USER_BACKENDS = ("cpu", "cuda", "metal")
#: The largest rank of a user op's input or output (the tensor struct's dims array).
MAX_USER_RANK = 8
#: The largest number of inputs a user op takes.
MAX_USER_INPUTS = 16
#: The dtype codes of `rlx_user_tensor.dtype` (the RLX_USER_* constants of the C and CUDA headers).
DTYPE_CODES = {DType.F32: 1, DType.F64: 2, DType.F16: 3, DType.BF16: 4, DType.I8: 5, DType.I32: 6,
               DType.I64: 7, DType.U8: 8, DType.BOOL: 9}


@dataclass(frozen=True)
class OpSource:
    """One backend's code of a user op: `function` defined in the header file `header`."""

    header: Path
    function: str

    @staticmethod
    def of(name: str, backend: str, value: object) -> OpSource:
        """`value` (a path, or a (path, function) pair; the function defaults to the op's name) as a source."""
        path, function = (value if isinstance(value, tuple) else (value, name))
        if not isinstance(path, (str, Path)) or not isinstance(function, str) or not function.isidentifier():
            raise IRError(f"custom op {name!r}: {backend}= takes a header path or a (path, function name) pair, "
                          f"got {value!r}")
        header = Path(path).expanduser().resolve()
        if not header.is_file():
            raise IRError(f"custom op {name!r}: the {backend} header {str(header)!r} does not exist")
        return OpSource(header, function)

    def text(self) -> str:
        """The header's text (read now: the digest is checked against it where it is rendered)."""
        try:
            return self.header.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BuildError(f"cannot read the custom op header {str(self.header)!r}: {exc}") from None


@dataclass(frozen=True)
class UserOpSpec:
    """A user op's registration: see the module docstring.

    `infer(*input_shapes) -> Shape` (or a `(dims, dtype)` pair); `reference(*arrays) -> array`;
    `sources`: (backend, `OpSource`) pairs; `vjp(*inputs, output, d_output) -> cotangents`, written with
    traced ops (None: the op has no derivative).
    """

    name: str
    infer: Callable[..., object]
    reference: Callable[..., object]
    sources: tuple[tuple[str, OpSource], ...] = ()
    vjp: Callable[..., object] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise IRError(f"custom op name must be an identifier, got {self.name!r}")
        if not callable(self.infer) or not callable(self.reference):
            raise IRError(f"custom op {self.name!r} needs callable infer= and reference=")
        if self.vjp is not None and not callable(self.vjp):
            raise IRError(f"custom op {self.name!r}: vjp= must be callable, got {self.vjp!r}")
        for backend, _ in self.sources:
            if backend not in USER_BACKENDS:
                raise IRError(f"custom op {self.name!r}: unknown backend {backend!r}; expected {USER_BACKENDS}")

    def source(self, backend: str) -> OpSource | None:
        """The code of `backend`, or None when the op brings none."""
        return dict(self.sources).get(backend)

    def digest(self) -> str:
        """sha256 of the op's name and every backend's function name and header bytes (read now)."""
        h = hashlib.sha256(f"rlx-user-op\0{self.name}\0".encode())
        for backend, src in sorted(self.sources):
            h.update(f"{backend}\0{src.function}\0{len(src.text())}\0".encode())
            h.update(src.text().encode())
        return h.hexdigest()

    def output_shape(self, inputs: Sequence[Shape]) -> Shape:
        """The output `infer` gives for `inputs`, checked."""
        if not 1 <= len(inputs) <= MAX_USER_INPUTS:
            raise ShapeError(f"custom op {self.name!r} takes 1..{MAX_USER_INPUTS} inputs, got {len(inputs)}")
        for i, s in enumerate(inputs):
            if s.rank > MAX_USER_RANK:
                raise ShapeError(f"custom op {self.name!r} input {i} has rank {s.rank} > {MAX_USER_RANK}")
            if s.dtype not in DTYPE_CODES:
                raise ShapeError(f"custom op {self.name!r} input {i} is {s.dtype}, which rlx_user_tensor has no "
                                 f"code for (it takes {', '.join(d.value for d in DTYPE_CODES)})")
        out = self.infer(*inputs)
        if isinstance(out, tuple) and len(out) == 2 and not isinstance(out, Shape):
            out = Shape.of(list(out[0]), out[1])
        if not isinstance(out, Shape):
            raise ShapeError(f"custom op {self.name!r}: infer must return a Shape or (dims, dtype), got {out!r}")
        if out.rank > MAX_USER_RANK:
            raise ShapeError(f"custom op {self.name!r} output has rank {out.rank} > {MAX_USER_RANK}")
        if out.dtype not in DTYPE_CODES:
            raise ShapeError(f"custom op {self.name!r} output is {out.dtype}, which rlx_user_tensor has no code for")
        return out


#: The user ops registered in this process, by name.
USER_OPS: dict[str, UserOpSpec] = {}


def register_user_op(spec: UserOpSpec) -> None:
    """Register (or replace: a header edited in a session) the op `spec.name`."""
    if not isinstance(spec, UserOpSpec):
        raise IRError(f"expected a UserOpSpec, got {type(spec).__name__}")
    USER_OPS[spec.name] = spec


def user_op_spec(name: str) -> UserOpSpec:
    """The registration of `name`, or a clear error."""
    spec = USER_OPS.get(name)
    if spec is None:
        raise IRError(f"custom op {name!r} is not registered in this process: call rlx.custom_op({name!r}, ...) "
                      f"before building, loading or compiling a graph that uses it (rlxc replay: --setup FILE.py)")
    return spec


@dataclass(frozen=True)
class UserOp(Op):
    """A user-defined op (`rlx.custom_op`): `name`'s registration applied to the inputs.

    `digest` is `UserOpSpec.digest()` when the node was made; `vjp` the derivative body (inputs, then
    ``primal_output`` and ``d_output``; one cotangent per input), or None.
    """

    kind: ClassVar[str] = "user_op"
    arity: ClassVar[tuple[int, int]] = (1, MAX_USER_INPUTS)
    name: str
    digest: str
    vjp: Body | None = None

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        out = user_op_spec(self.name).output_shape(inputs)
        if self.vjp is not None:
            self.vjp.verify()
            n = len(inputs)
            if self.vjp.input_shapes() != [*inputs, out, out] or self.vjp.output_shapes() != list(inputs):
                raise ShapeError(f"custom op {self.name!r} vjp must take the {n} inputs, the output and its "
                                 f"cotangent, and return one cotangent per input, shaped like it")
        return out

    def describe(self) -> str:
        return f"user_op[{self.name}, digest={self.digest[:12]}" + (", vjp" if self.vjp is not None else "") + "]"


def check_current(ops: Sequence[Op]) -> None:
    """Refuse user ops whose headers changed since their nodes were made (their programs would be stale)."""
    for op in user_ops_of(ops):
        if user_op_spec(op.name).digest() != op.digest:
            raise BuildError(f"custom op {op.name!r}: its registration or header changed since the graph was "
                             f"traced; trace the graph again")


def user_ops_of(ops: Sequence[Op]) -> list[UserOp]:
    """The user ops among `ops`, and inside the bodies they hold (scan, custom_fn), in order."""
    found: list[UserOp] = []
    for op in ops:
        if isinstance(op, UserOp):
            found.append(op)
        for field in ("body", "fwd", "vjp", "jvp"):
            body = getattr(op, field, None)
            if isinstance(body, Body):
                found += user_ops_of([n.op for n in body.nodes])
    return found
