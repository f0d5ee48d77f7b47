"""MIR control flow: `cond` (run one of two bodies) and `while_loop` (run a body while a predicate holds).

Both follow JAX's `lax.cond` / `lax.while_loop`, with bodies stored as `Body`
values like `scan`'s (rlx/ir/ops_scan.py), so they hash, serialize and nest alike.

`Cond`: inputs ``[pred, *operands]``; `pred` is one bool (shape ``[]`` or
``[1]``). Both branches take the operands (their shapes and dtypes, in order)
and return one value; the two branches must return the same shape and dtype,
which is the op's value (``true_body(*operands) if pred else false_body(*operands)``).

`WhileLoop`: inputs ``[init, *bcasts]``. `cond_body` takes ``(carry, *bcasts)``
and returns one bool; `body` takes ``(carry, *bcasts)`` and returns the next
carry, with the carry's shape and dtype. The op's value is the first carry for
which `cond_body` is false, or the carry after `max_trips` trips when that is
given (None: unbounded, as in JAX; the CPU runs it so, CUDA needs the bound,
see rlx/opt/control.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx.errors import IRError, ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import Op
from rlx.ir.ops_scan import Body, Scan
from rlx.ir.shape import Shape

#: Attributes of the control-flow ops that hold bodies (what passes over bodies rewrite).
BODY_FIELDS = ("true_body", "false_body", "cond_body", "body")


def _fmt(shapes: Sequence[Shape]) -> str:
    return "(" + ", ".join(map(str, shapes)) + ")"


def _is_predicate(s: Shape) -> bool:
    return s.dtype is DType.BOOL and s.is_static and s.max_numel == 1 and s.rank <= 1


def _check_body(kind: str, what: str, body: Body, want: Sequence[Shape], names: Sequence[str]) -> Shape:
    """Verify `body` takes `want` (one per name in `names`) and returns one value; returns its shape."""
    if not isinstance(body, Body):
        raise IRError(f"{kind} {what} must be a Body (Graph.as_body()), got {type(body).__name__}")
    body.verify()
    got = body.input_shapes()
    if len(got) != len(want):
        raise ShapeError(f"{kind} {what} takes {len(got)} inputs but the {kind} passes {len(want)} "
                         f"({', '.join(names) or 'none'})")
    for name, g, w in zip(names, got, want):
        if g != w:
            raise ShapeError(f"{kind} {what} takes {g} for {name}, but {name} is {w}")
    if len(body.outputs) != 1:
        raise ShapeError(f"{kind} {what} must return one value, returns {len(body.outputs)}")
    return body.output_shapes()[0]


@dataclass(frozen=True)
class Cond(Op):
    """One of two bodies applied to the operands, chosen by a bool (see the module docstring)."""

    kind: ClassVar[str] = "cond"
    arity: ClassVar[tuple[int, int]] = (1, 64)
    true_body: Body
    false_body: Body

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        pred, operands = inputs[0], list(inputs[1:])
        if not _is_predicate(pred):
            raise ShapeError(f"cond predicate must be one bool (bool[] or bool[1]), got {pred}")
        names = [f"operand {i}" for i in range(len(operands))]
        t = _check_body("cond", "true branch", self.true_body, operands, names)
        f = _check_body("cond", "false branch", self.false_body, operands, names)
        if t != f:
            raise ShapeError(f"cond branches must return one shape and dtype: the true branch returns {t}, "
                             f"the false branch {f}")
        return t

    def describe(self) -> str:
        return (f"cond[true={len(self.true_body.nodes)} nodes, false={len(self.false_body.nodes)} nodes]")


@dataclass(frozen=True)
class WhileLoop(Op):
    """`carry = body(carry, *bcasts)` while `cond_body(carry, *bcasts)` (see the module docstring)."""

    kind: ClassVar[str] = "while_loop"
    arity: ClassVar[tuple[int, int]] = (1, 64)
    cond_body: Body
    body: Body
    max_trips: int | None = None

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        m = self.max_trips
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise ShapeError(f"while_loop max_trips must be None or an int >= 0, got {m!r}")
        init, bcasts = inputs[0], list(inputs[1:])
        names = ["the carry", *(f"bcast {i}" for i in range(len(bcasts)))]
        p = _check_body("while_loop", "cond", self.cond_body, [init, *bcasts], names)
        if not _is_predicate(p):
            raise ShapeError(f"while_loop cond must return one bool (bool[] or bool[1]), returns {p}")
        out = _check_body("while_loop", "body", self.body, [init, *bcasts], names)
        if out != init:
            raise ShapeError(f"while_loop carry must keep its shape and dtype: init is {init}, "
                             f"the body returns {out}")
        return init

    def describe(self) -> str:
        bound = "" if self.max_trips is None else f", max_trips={self.max_trips}"
        return f"while_loop[cond={len(self.cond_body.nodes)} nodes, body={len(self.body.nodes)} nodes{bound}]"


def bodies_of(op: Op) -> dict[str, Body]:
    """The bodies a control-flow op holds, by attribute name (empty for any other op)."""
    if not isinstance(op, (Cond, WhileLoop)):
        return {}
    return {f: getattr(op, f) for f in BODY_FIELDS if isinstance(getattr(op, f, None), Body)}


def step_bodies(op: Op) -> tuple[Body, ...]:
    """The bodies a backend renders for `op`, in the order `LirModule.bodies` holds them: a scan's body,
    a cond's true and false branches, a while_loop's cond and body; () for an op without bodies."""
    if isinstance(op, Scan):
        return (op.body,)
    if isinstance(op, Cond):
        return (op.true_body, op.false_body)
    if isinstance(op, WhileLoop):
        return (op.cond_body, op.body)
    return ()
