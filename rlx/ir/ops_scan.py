"""MIR ops that hold a sub-graph: `scan` (a bounded loop) and `custom_fn` (a function with its own derivatives).

A sub-graph is stored as a `Body`: a frozen, hashable copy of a MIR graph's
nodes and outputs (build one with `Graph.as_body()`, read it back with
`Graph.from_body`). Being a plain value, a body is compared, hashed,
serialized (inside the op's JSON) and fed to the LIR hash like any other
attribute, so changing one op inside it changes the program's identity.

`Scan` follows the original RLX IR's `Op::Scan`: inputs are
``[init, *bcasts, *xs]``; the body's inputs, in declaration order, are the
carry, the broadcast inputs (the same value every step) and one row of each
`xs` (``xs[i][t]``, xs having shape ``[length, *row]``); its one output is the
next carry. The op's value is the final carry, or with `save_trajectory` the
stacked carries ``[length, *carry]`` (row t is the carry after step t). With
`reverse` the steps run t = length-1 .. 0 (row t still belongs to step t).
`length` may be a dynamic dim. `num_checkpoints` > 0 asks autodiff for a
memory-bounded backward that keeps that many carries and recomputes the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx.errors import IRError, ShapeError
from rlx.ir.ops import LEAF_KINDS, Input, Op
from rlx.ir.shape import Dim, Shape

#: Deepest nesting of bodies (a scan in a scan in ...) a graph may hold.
MAX_BODY_DEPTH = 8


@dataclass(frozen=True)
class BodyNode:
    """One node of a body: `op` applied to earlier nodes `inputs`, with its inferred `shape`."""

    op: Op
    inputs: tuple[int, ...]
    shape: Shape
    name: str = ""


@dataclass(frozen=True)
class Body:
    """A sub-graph as a value: nodes in topological order and the ids of its outputs."""

    name: str
    nodes: tuple[BodyNode, ...]
    outputs: tuple[int, ...]
    output_names: tuple[str, ...] = ()

    def input_ids(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if isinstance(n.op, Input)]

    def input_shapes(self) -> list[Shape]:
        return [self.nodes[i].shape for i in self.input_ids()]

    def output_shapes(self) -> list[Shape]:
        return [self.nodes[o].shape for o in self.outputs]

    def depth(self) -> int:
        """How many bodies deep this one nests (1: it holds no op with a body)."""
        inner = [b for n in self.nodes for b in _bodies_of(n.op)]
        return 1 + max((b.depth() for b in inner), default=0)

    def verify(self) -> None:
        """Re-infer every shape (bodies are checked when a graph holding them is built or loaded)."""
        if self.depth() > MAX_BODY_DEPTH:
            raise ShapeError(f"body {self.name!r} nests bodies deeper than {MAX_BODY_DEPTH}")
        if not self.outputs:
            raise ShapeError(f"body {self.name!r} has no outputs")
        for idx, n in enumerate(self.nodes):
            for i in n.inputs:
                if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < idx:
                    raise ShapeError(f"body {self.name!r} node {idx} uses {i!r}, which is not an earlier node")
            if n.op.kind in LEAF_KINDS:
                if n.op.kind == "param":
                    raise ShapeError(f"body {self.name!r} holds param {n.op.name!r}: pass weights in as inputs")
                if n.inputs:
                    raise ShapeError(f"body {self.name!r} leaf node {idx} takes inputs")
            else:
                n.op.check_arity(len(n.inputs))
            shape = n.op.infer([self.nodes[i].shape for i in n.inputs])
            if shape != n.shape:
                raise ShapeError(f"body {self.name!r} node {idx} {n.op.kind}: recorded {n.shape}, inputs give {shape}")
        for o in self.outputs:
            if not 0 <= o < len(self.nodes):
                raise ShapeError(f"body {self.name!r} output {o} does not exist")

    def __str__(self) -> str:
        return f"body {self.name}[{len(self.nodes)} nodes]"


def _bodies_of(op: Op) -> list[Body]:
    # scan and custom_fn fields, then control flow's (rlx/ir/ops_control.py, which builds on this module)
    fields = ("body", "fwd", "vjp", "jvp", "true_body", "false_body", "cond_body")
    return [v for v in (getattr(op, f, None) for f in fields) if isinstance(v, Body)]


def _check_int(kind: str, name: str, v: object, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ShapeError(f"{kind} {name} must be an int >= {lo}, got {v!r}")


@dataclass(frozen=True)
class Scan(Op):
    """A bounded loop over a sub-graph (see the module docstring for the input and body conventions)."""

    kind: ClassVar[str] = "scan"
    arity: ClassVar[tuple[int, int]] = (1, 64)
    body: Body
    length: Dim
    num_bcast: int = 0
    num_xs: int = 0
    save_trajectory: bool = False
    reverse: bool = False
    num_checkpoints: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.body, Body):
            raise IRError(f"scan body must be a Body (Graph.as_body()), got {type(self.body).__name__}")
        object.__setattr__(self, "length", Dim.of(self.length))

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        _check_int("scan", "num_bcast", self.num_bcast, 0)
        _check_int("scan", "num_xs", self.num_xs, 0)
        _check_int("scan", "num_checkpoints", self.num_checkpoints, 0)
        if len(inputs) != 1 + self.num_bcast + self.num_xs:
            raise ShapeError(f"scan with {self.num_bcast} bcasts and {self.num_xs} xs takes "
                             f"{1 + self.num_bcast + self.num_xs} inputs, got {len(inputs)}")
        if self.num_checkpoints and (not self.length.is_static or self.num_checkpoints > self.length.value):
            raise ShapeError(f"scan num_checkpoints={self.num_checkpoints} needs a static length >= it, "
                             f"got length {self.length}")
        self.body.verify()
        want = self.body.input_shapes()
        if len(want) != len(inputs):
            raise ShapeError(f"scan body takes {len(want)} inputs (carry, bcasts, xs rows) but the scan passes "
                             f"{len(inputs)}")
        if len(self.body.outputs) != 1:
            raise ShapeError(f"scan body must have one output (the next carry), has {len(self.body.outputs)}")
        init = inputs[0]
        if want[0] != init or self.body.output_shapes()[0] != init:
            raise ShapeError(f"scan carry must keep one shape: init {init}, body carry input {want[0]}, "
                             f"body output {self.body.output_shapes()[0]}")
        for i in range(self.num_bcast):
            if want[1 + i] != inputs[1 + i]:
                raise ShapeError(f"scan bcast {i} is {inputs[1 + i]} but the body takes {want[1 + i]}")
        for i in range(self.num_xs):
            x = inputs[1 + self.num_bcast + i]
            row = want[1 + self.num_bcast + i]
            if x.rank < 1 or x.dims[0] != self.length or x.with_dims(x.dims[1:]) != row:
                raise ShapeError(f"scan xs {i} must be [{self.length},{','.join(map(str, row.dims))}] {row.dtype}, "
                                 f"got {x}")
        if self.save_trajectory:
            return init.with_dims((self.length, *init.dims))
        return init

    def describe(self) -> str:
        parts = [f"length={self.length}", f"body={len(self.body.nodes)} nodes"]
        for k in ("num_bcast", "num_xs", "save_trajectory", "reverse", "num_checkpoints"):
            v = getattr(self, k)
            if v:
                parts.append(f"{k}={v}")
        return f"scan[{', '.join(parts)}]"


@dataclass(frozen=True)
class CustomFn(Op):
    """A function given as a body, with optional derivative bodies replacing the derived ones.

    `fwd` takes the op's inputs (its inputs in order) and has one output. `vjp`
    takes the primal inputs, then inputs named ``primal_output`` and
    ``d_output``, and returns one cotangent per primal input. `jvp` takes the
    primal inputs, then ``tangent_0 .. tangent_{n-1}``, and returns the output
    tangent (JAX's `custom_vjp` / `custom_jvp`). Backends run `fwd` inlined.
    """

    kind: ClassVar[str] = "custom_fn"
    arity: ClassVar[tuple[int, int]] = (1, 64)
    fwd: Body
    vjp: Body | None = None
    jvp: Body | None = None

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        self.fwd.verify()
        want = self.fwd.input_shapes()
        if list(want) != list(inputs):
            raise ShapeError(f"custom_fn fwd takes ({', '.join(map(str, want))}), got ({', '.join(map(str, inputs))})")
        if len(self.fwd.outputs) != 1:
            raise ShapeError(f"custom_fn fwd must have one output, has {len(self.fwd.outputs)}")
        out = self.fwd.output_shapes()[0]
        n = len(inputs)
        if self.vjp is not None:
            self.vjp.verify()
            names = [self.vjp.nodes[i].op.name for i in self.vjp.input_ids()]
            if names[n:] != ["primal_output", "d_output"] or len(names) != n + 2:
                raise ShapeError(f"custom_fn vjp must take the {n} primal inputs, then 'primal_output' and "
                                 f"'d_output'; it takes {names}")
            if self.vjp.input_shapes()[:n] != list(inputs) or self.vjp.input_shapes()[n:] != [out, out]:
                raise ShapeError("custom_fn vjp input shapes differ from the primal inputs and output")
            if self.vjp.output_shapes() != list(inputs):
                raise ShapeError(f"custom_fn vjp must return one cotangent per input ({n}), shaped like it")
        if self.jvp is not None:
            self.jvp.verify()
            names = [self.jvp.nodes[i].op.name for i in self.jvp.input_ids()]
            if names[n:] != [f"tangent_{i}" for i in range(n)]:
                raise ShapeError(f"custom_fn jvp must take the {n} primal inputs, then tangent_0..tangent_{n - 1}; "
                                 f"it takes {names}")
            if self.jvp.input_shapes() != list(inputs) * 2 or self.jvp.output_shapes() != [out]:
                raise ShapeError("custom_fn jvp shapes differ from the primal inputs and output")
        return out
