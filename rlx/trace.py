"""Tracing: build a MIR graph by writing ordinary Python on traced tensors.

`trace(name, fn)` calls `fn` with a `Tracer`; the tensors it hands out
(`TracedTensor`) record every operation into the graph instead of computing
anything. Operators and methods infer shapes immediately, so a shape mistake
raises `ShapeError` at the line that made it, naming the shapes involved.

A `TracedTensor` is an immutable handle to one graph value: reuse it as often
as you like (``x * x``), keep it in lists or dicts. Every operator or method
call adds exactly one node, plus one constant node the first time a given
scalar appears with a given dtype. Python numbers (and numpy arrays) mixed
with tensors become constants of the tensor's dtype: ``2 * x`` on an f16 `x`
multiplies by an f16 constant 2.

>>> import numpy as np
>>> from rlx import reference
>>> def mlp(t):
...     x = t.input("x", [2, 3])
...     w = t.param("w", [3, 4])
...     return (x @ w + 1).relu()
>>> g = trace("mlp", mlp)
>>> print(g)
graph mlp {
  %0: f32[2,3] = input 'x'()  # x
  %1: f32[3,4] = param 'w'()  # w
  %2: f32[2,4] = matmul(%0, %1)
  %3: f32[] = constant[1.0]()
  %4: f32[2,4] = binary[fn=add](%2, %3)
  %5: f32[2,4] = activation[fn=relu](%4)
  return out0=%5
}
>>> reference.run(g, {"x": np.ones((2, 3), np.float32)}, {"w": np.ones((3, 4), np.float32)})[0][0].tolist()
[4.0, 4.0, 4.0, 4.0]
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

import numpy as np

from rlx.errors import IRError, ShapeError
from rlx.ir.dtype import DType, f32_to_bf16
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.ops import Constant
from rlx.ir.ops_user import OpSource, UserOpSpec, register_user_op, user_op_spec
from rlx.ir.shape import Dim, DimLike, Shape, normalize_axis

Operand = Union["TracedTensor", int, float, np.ndarray, np.generic]
TraceOutputs = Union["TracedTensor", Sequence["TracedTensor"], Mapping[str, "TracedTensor"]]


class Tracer:
    """Records operations into one MIR graph; handed to the function given to `trace`.

    Leaves are made here (`input`, `param`, `constant`); so are the ops that
    take several tensors on an equal footing (`concat`, `where`, `attention`…).
    """

    def __init__(self, name: str) -> None:
        self._graph = Graph(name)
        self._open = True
        self._scalars: dict[tuple[DType, bytes], NodeId] = {}

    @property
    def name(self) -> str:
        return self._graph.name

    @property
    def graph(self) -> Graph:
        """The graph recorded so far (read it; build through the tracer)."""
        return self._graph

    # ── leaves ────────────────────────────────────────────────────────

    def input(self, name: str, dims: Iterable[DimLike] | Shape, dtype: DType | str = DType.F32) -> TracedTensor:
        """A graph input; dims may hold `Dim.dynamic(...)` symbols."""
        return self._emit(f"input {name!r}", [], lambda g: g.input(name, dims, dtype))

    def param(self, name: str, dims: Iterable[DimLike] | Shape, dtype: DType | str = DType.F32) -> TracedTensor:
        """A weight (static shape), set on the compiled graph with `set_param`."""
        return self._emit(f"param {name!r}", [], lambda g: g.param(name, dims, dtype))

    def constant(self, value: np.ndarray | float | int, dtype: DType | str | None = None) -> TracedTensor:
        """A constant baked into the program; floats default to f32.

        bf16 values are given as ordinary numbers and rounded to bf16.
        """
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise IRError(f"constant must be numeric, got {arr.dtype} value {value!r}")
        dt = DType.parse(dtype) if dtype is not None else (DType.F32 if arr.dtype.kind == "f" else None)
        if dt is None:
            dt = DType.parse(arr.dtype)
        return self._wrap(self._constant_id(arr, dt, cache=False))

    # ── multi-operand ops ─────────────────────────────────────────────

    def matmul(self, a: TracedTensor, b: Operand) -> TracedTensor:
        return a.matmul(b)

    def softmax(self, x: TracedTensor, axis: int = -1) -> TracedTensor:
        return x.softmax(axis)

    def layer_norm(self, x: TracedTensor, gamma: Operand, beta: Operand, eps: float = 1e-5) -> TracedTensor:
        return x.layer_norm(gamma, beta, eps)

    def rms_norm(self, x: TracedTensor, gamma: Operand, eps: float = 1e-6) -> TracedTensor:
        return x.rms_norm(gamma, eps)

    def gather(self, table: TracedTensor, indices: TracedTensor, axis: int = 0) -> TracedTensor:
        """``table.take(indices, axis)`` (embedding lookup); indices are i32/i64."""
        ops = [self._own(table), self._own(indices)]
        return self._emit("gather", ops, lambda g: g.gather(table.id, indices.id, axis))

    def concat(self, xs: Sequence[TracedTensor], axis: int) -> TracedTensor:
        ops = [self._own(x) for x in xs]
        return self._emit("concat", ops, lambda g: g.concat([x.id for x in ops], axis))

    def where(self, cond: TracedTensor, a: Operand, b: Operand) -> TracedTensor:
        """``cond ? a : b``; scalar branches take the other branch's dtype."""
        self._own(cond)
        if not isinstance(a, TracedTensor) and not isinstance(b, TracedTensor):
            raise IRError("where needs at least one tensor branch to decide the dtype")
        ta = a if isinstance(a, TracedTensor) else self._coerce(a, b.dtype)
        tb = b if isinstance(b, TracedTensor) else self._coerce(b, ta.dtype)
        ops = [cond, self._own(ta), self._own(tb)]
        return self._emit("where", ops, lambda g: g.where(cond.id, ta.id, tb.id))

    def attention(self, q: TracedTensor, k: TracedTensor, v: TracedTensor, *, num_heads: int, head_dim: int,
                  mask: str = "none", mask_input: TracedTensor | None = None, scale: float | None = None,
                  num_kv_heads: int | None = None) -> TracedTensor:
        """Multi-head attention over ``[B, S, H*D]`` tensors (see `rlx.ir.ops.Attention`)."""
        ops = [self._own(t) for t in (q, k, v, *([mask_input] if mask_input is not None else []))]
        return self._emit("attention", ops, lambda g: g.attention(
            q.id, k.id, v.id, num_heads=num_heads, head_dim=head_dim, mask=mask,
            mask_input=mask_input.id if mask_input is not None else None, scale=scale, num_kv_heads=num_kv_heads))

    def rope(self, x: TracedTensor, cos: TracedTensor, sin: TracedTensor, *, head_dim: int,
             n_rot: int | None = None, variant: str = "neox") -> TracedTensor:
        """Rotary embedding of ``[B, S, H*head_dim]`` with ``[S, n_rot/2]`` tables (see `rlx.ir.ops.Rope`)."""
        ops = [self._own(t) for t in (x, cos, sin)]
        return self._emit("rope", ops, lambda g: g.rope(x.id, cos.id, sin.id, head_dim=head_dim, n_rot=n_rot,
                                                        variant=variant))

    # ── loops and custom functions (rlx/ir/ops_scan.py) ─────────────────

    def scan(self, fn: Callable[..., TracedTensor], init: TracedTensor, *, xs: Sequence[TracedTensor] = (),
             bcasts: Sequence[TracedTensor] = (), length: DimLike | None = None, trajectory: bool = False,
             reverse: bool = False, checkpoints: int = 0) -> TracedTensor:
        """A loop: ``carry = fn(carry, *bcasts, *rows)`` for each row t of every xs (``[length, ...]``).

        `fn` is traced once into the loop body; tensors it uses from outside must be
        passed as `bcasts`. Returns the final carry, or the stacked carries with
        `trajectory`. `checkpoints` > 0 makes the reverse-mode derivative keep that
        many carries and recompute the rest (`scan_checkpointed`).

        >>> def f(t):
        ...     xs = t.input("xs", [5, 3])
        ...     return t.scan(lambda c, x: c * 0.5 + x, t.input("c0", [3]), xs=[xs])
        >>> str(trace("s", f).node(trace("s", f).outputs[0]).shape)
        'f32[3]'
        """
        carry, bs, rows = self._own(init), [self._own(b) for b in bcasts], [self._own(x) for x in xs]
        sub = Tracer(f"{self.name}_body")
        args = [sub.input("carry", carry.node.shape)]
        args += [sub.input(f"bcast{i}", b.node.shape) for i, b in enumerate(bs)]
        for i, x in enumerate(rows):
            shape = x.node.shape
            if shape.rank < 1:
                raise IRError(f"scan xs {i} must have a leading length axis, got {shape}")
            args.append(sub.input(f"x{i}", shape.with_dims(shape.dims[1:])))
        out = fn(*args)
        sub._own(out)
        sub._open = False
        body = sub.graph
        body.set_outputs([out.id])
        ops = [carry, *bs, *rows]
        return self._emit("scan", ops, lambda g: g.scan(
            body, carry.id, xs=[x.id for x in rows], bcasts=[b.id for b in bs], length=length,
            save_trajectory=trajectory, reverse=reverse, num_checkpoints=checkpoints))

    def custom_fn(self, fn: Callable[..., TracedTensor], inputs: Sequence[TracedTensor], *,
                  vjp: Callable[..., Sequence[TracedTensor]] | None = None,
                  jvp: Callable[..., TracedTensor] | None = None) -> TracedTensor:
        """`fn(*inputs)` as one op whose derivatives are `vjp(*inputs, primal_output, d_output)` → one
        cotangent per input and/or `jvp(*inputs, *tangents)` → the output tangent (JAX's custom_vjp/jvp)."""
        ins = [self._own(t) for t in inputs]
        shapes = [t.node.shape for t in ins]

        def body(name: str, f: Callable, extra: list[tuple[str, Shape]]) -> Graph:
            sub = Tracer(name)
            args = [sub.input(f"in{i}", s) for i, s in enumerate(shapes)] + [sub.input(n, s) for n, s in extra]
            res = f(*args)
            outs = [res] if isinstance(res, TracedTensor) else list(res)
            for o in outs:
                sub._own(o)
            sub._open = False
            sub.graph.set_outputs([o.id for o in outs])
            return sub.graph

        fwd = body(f"{self.name}_fn", fn, [])
        out_shape = fwd.node(fwd.outputs[0]).shape
        vjp_g = body(f"{self.name}_vjp", vjp, [("primal_output", out_shape), ("d_output", out_shape)]) \
            if vjp is not None else None
        jvp_g = body(f"{self.name}_jvp", jvp, [(f"tangent_{i}", s) for i, s in enumerate(shapes)]) \
            if jvp is not None else None
        return self._emit("custom_fn", ins, lambda g: g.custom_fn([t.id for t in ins], fwd, vjp=vjp_g, jvp=jvp_g))

    # ── control flow (rlx/ir/ops_control.py) ─────────────────────────────

    def _body(self, what: str, fn: Callable[..., TracedTensor], args: Sequence[tuple[str, Shape]]) -> Graph:
        """`fn` traced into a body graph taking `args`; errors name `what` (e.g. "cond true branch")."""
        sub = Tracer(f"{self.name}_{what.replace(' ', '_')}")
        try:
            out = fn(*(sub.input(n, s) for n, s in args))
            if not isinstance(out, TracedTensor):
                raise IRError(f"must return one TracedTensor, returned {type(out).__name__}")
            sub._own(out)
        except IRError as exc:
            raise type(exc)(f"{what}: {exc}") from None
        sub._open = False
        sub.graph.set_outputs([out.id])
        return sub.graph

    def cond(self, pred: TracedTensor, true_fn: Callable[..., TracedTensor], false_fn: Callable[..., TracedTensor],
             *operands: TracedTensor) -> TracedTensor:
        """``true_fn(*operands) if pred else false_fn(*operands)`` (JAX's `lax.cond`): `pred` is one bool;
        both functions are traced, take the operands and return the same shape and dtype. Tensors they
        use from outside must be passed as operands.

        >>> import numpy as np
        >>> from rlx import reference
        >>> def f(t):
        ...     x = t.input("x", [3])
        ...     return t.cond(x.sum() > 0, lambda v: v * 2.0, lambda v: -v, x)
        >>> g = trace("c", f)
        >>> reference.run(g, {"x": np.array([1.0, -2.0, 3.0], np.float32)})[0].tolist()
        [2.0, -4.0, 6.0]
        """
        p, ops = self._own(pred), [self._own(o) for o in operands]
        args = [(f"operand{i}", o.node.shape) for i, o in enumerate(ops)]
        true_g = self._body("cond true branch", true_fn, args)
        false_g = self._body("cond false branch", false_fn, args)
        return self._emit("cond", [p, *ops], lambda g: g.cond(p.id, true_g, false_g, [o.id for o in ops]))

    def while_loop(self, cond_fn: Callable[..., TracedTensor], body_fn: Callable[..., TracedTensor],
                   init: TracedTensor, *, bcasts: Sequence[TracedTensor] = (),
                   max_trips: int | None = None) -> TracedTensor:
        """``carry = body_fn(carry, *bcasts)`` from `init` while ``cond_fn(carry, *bcasts)`` (one bool)
        holds, at most `max_trips` times when given (JAX's `lax.while_loop`). The carry keeps its shape
        and dtype. CUDA needs `max_trips` (it runs a masked loop of that many steps), and so does
        reverse-mode autodiff.

        >>> import numpy as np
        >>> from rlx import reference
        >>> def f(t):
        ...     x = t.input("x", [2])
        ...     return t.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 3.0, x, max_trips=20)
        >>> reference.run(trace("w", f), {"x": np.array([1.0, 2.0], np.float32)})[0].tolist()
        [81.0, 162.0]
        """
        carry, bs = self._own(init), [self._own(b) for b in bcasts]
        args = [("carry", carry.node.shape), *((f"bcast{i}", b.node.shape) for i, b in enumerate(bs))]
        cond_g = self._body("while_loop cond", cond_fn, args)
        body_g = self._body("while_loop body", body_fn, args)
        return self._emit("while_loop", [carry, *bs], lambda g: g.while_loop(
            cond_g, body_g, carry.id, bcasts=[b.id for b in bs], max_trips=max_trips))

    def custom_fn_multi(self, fn: Callable[..., Sequence[TracedTensor]], inputs: Sequence[TracedTensor], *,
                        vjp: Callable[..., Sequence[TracedTensor]] | None = None) -> tuple[TracedTensor, ...]:
        """`fn(*inputs)` returning several outputs, with a custom VJP over all of them.

        `vjp(*inputs, *outputs, *d_outputs)` returns one cotangent per input. Output k is a
        `custom_fn` node whose body is `fn` kept to that output, and whose vjp is `vjp` with the
        cotangents of the other outputs zero; autodiff sums the per-output VJPs, which equals `vjp`
        on all cotangents because a VJP is linear in them. The optimizer inlines the bodies, so CSE
        computes their shared work once.

        >>> import numpy as np
        >>> from rlx import reference
        >>> def f(t):
        ...     s, d = t.custom_fn_multi(lambda a, b: (a + b, a - b), [t.input("a", [2]), t.input("b", [2])])
        ...     return [s, d]
        >>> g = trace("sd", f)
        >>> [o.tolist() for o in reference.run(g, {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)})]
        [[2.0, 2.0], [0.0, 0.0]]
        """
        ins = [self._own(t) for t in inputs]
        shapes = [t.node.shape for t in ins]
        probe = Tracer(f"{self.name}_fn")
        outs = fn(*[probe.input(f"in{i}", s) for i, s in enumerate(shapes)])
        outs = [outs] if isinstance(outs, TracedTensor) else list(outs)
        if not outs:
            raise IRError("custom_fn_multi: fn returned no outputs")
        out_shapes = [probe._own(o).node.shape for o in outs]
        results = []
        for k in range(len(outs)):
            def fwd_k(*args: TracedTensor, k: int = k) -> TracedTensor:
                return list(fn(*args))[k]

            def vjp_k(*args: TracedTensor, k: int = k) -> Sequence[TracedTensor]:
                primal, y_k, dy_k = args[:len(ins)], args[len(ins)], args[len(ins) + 1]
                ys = list(fn(*primal))
                ys[k] = y_k
                zero = [y.tracer._coerce(0, y.node.shape.dtype).expand(y.node.shape.dims) for y in ys]
                dys = [dy_k if j == k else zero[j] for j in range(len(ys))]
                res = vjp(*primal, *ys, *dys)
                return [res] if isinstance(res, TracedTensor) else list(res)

            out = self.custom_fn(fwd_k, ins, vjp=vjp_k if vjp is not None else None)
            if out.node.shape != out_shapes[k]:  # pragma: no cover - fn traced twice must agree
                raise IRError(f"custom_fn_multi: output {k} traced as {out.node.shape}, then {out_shapes[k]}")
            results.append(out)
        return tuple(results)

    def user_op(self, name: str, inputs: Sequence[TracedTensor]) -> TracedTensor:
        """The registered user op `name` (`rlx.custom_op`) on `inputs`; its `vjp`, if any, traced for them."""
        ins = [self._own(t) for t in inputs]
        spec = user_op_spec(name)
        shapes = [t.node.shape for t in ins]
        vjp_g = None
        if spec.vjp is not None:
            out = spec.output_shape(shapes)
            sub = Tracer(f"{name}_vjp")
            args = [sub.input(f"in{i}", s) for i, s in enumerate(shapes)]
            args += [sub.input("primal_output", out), sub.input("d_output", out)]
            res = spec.vjp(*args)
            outs = [res] if isinstance(res, TracedTensor) else list(res)
            for o in outs:
                sub._own(o)
            sub._open = False
            sub.graph.set_outputs([o.id for o in outs])
            vjp_g = sub.graph
        return self._emit(f"custom op {name!r}", ins, lambda g: g.user_op(name, [t.id for t in ins], vjp=vjp_g))

    # ── state-space and linear-attention layers (rlx/ir/ops_ssm.py) ──────

    def selective_scan(self, x: TracedTensor, delta: TracedTensor, A: TracedTensor, B: TracedTensor,
                       C: TracedTensor) -> TracedTensor:
        """Mamba's selective scan: x, delta ``[b,s,h]``, A ``[h,n]``, B, C ``[b,s,n]`` → ``[b,s,h]``.

        >>> g = trace("ssm", lambda t: t.selective_scan(t.input("x", [1, 4, 8]), t.input("dt", [1, 4, 8]),
        ...     t.param("A", [8, 16]), t.input("B", [1, 4, 16]), t.input("C", [1, 4, 16])))
        >>> str(g.node(g.outputs[0]).shape)
        'f32[1,4,8]'
        """
        ops = [self._own(t) for t in (x, delta, A, B, C)]
        return self._emit("selective_scan", ops, lambda g: g.selective_scan(*(o.id for o in ops)))

    def gated_delta_net(self, q: TracedTensor, k: TracedTensor, v: TracedTensor, g: TracedTensor,
                        beta: TracedTensor, *, state: TracedTensor | None = None,
                        scale: float | None = None) -> TracedTensor:
        """Gated delta rule over q, k, v ``[b,s,h,n]`` and g, beta ``[b,s,h]``; `state` ``[b,h,n,n]`` carries."""
        ops = [self._own(t) for t in (q, k, v, g, beta, *([state] if state is not None else []))]
        return self._emit("gated_delta_net", ops, lambda gr: gr.gated_delta_net(
            q.id, k.id, v.id, g.id, beta.id, state=state.id if state is not None else None, scale=scale))

    def depthwise_conv1d_causal(self, x: TracedTensor, weight: TracedTensor,
                                left_pad: TracedTensor | None = None) -> TracedTensor:
        """Causal depthwise conv1d of x ``[b,s,c]`` with weight ``[c,k]`` (and the previous k-1 rows)."""
        ops = [self._own(t) for t in (x, weight, *([left_pad] if left_pad is not None else []))]
        return self._emit("depthwise_conv1d_causal", ops, lambda g: g.depthwise_conv1d_causal(
            x.id, weight.id, left_pad.id if left_pad is not None else None))

    # ── internals ─────────────────────────────────────────────────────

    def _wrap(self, node_id: NodeId) -> TracedTensor:
        return TracedTensor(self, node_id)

    def _check_open(self) -> None:
        if not self._open:
            raise IRError(f"trace {self.name!r} has finished; its tensors can no longer record operations")

    def _own(self, t: object) -> TracedTensor:
        """`t` as a tensor of this trace, or a clear error."""
        if not isinstance(t, TracedTensor):
            raise IRError(f"expected a TracedTensor, got {type(t).__name__} {t!r}")
        if t.tracer is not self:
            raise IRError(f"tensor %{t.id} belongs to trace {t.tracer.name!r}, not {self.name!r}: "
                          f"tensors of two traces cannot be mixed")
        return t

    def _emit(self, what: str, operands: Sequence[TracedTensor], build: Callable[[Graph], NodeId]) -> TracedTensor:
        """Add one node through `build`; shape errors name the operation and its operand shapes."""
        self._check_open()
        try:
            node_id = build(self._graph)
        except IRError as exc:
            shapes = ", ".join(str(o.node.shape) for o in operands)
            raise type(exc)(f"{what}({shapes}): {exc}") from None
        return self._wrap(node_id)

    def _coerce(self, value: object, dtype: DType) -> TracedTensor:
        """A tensor of this trace, or a constant of `dtype` made from a Python/numpy value."""
        if isinstance(value, TracedTensor):
            return self._own(value)
        if isinstance(value, bool) or not isinstance(value, (numbers.Number, np.ndarray, np.generic)):
            raise IRError(f"cannot use {type(value).__name__} {value!r} as a tensor operand")
        arr = np.asarray(value)
        if arr.dtype.kind not in "iuf":
            raise IRError(f"cannot use {arr.dtype} value {value!r} as a tensor operand")
        return self._wrap(self._constant_id(arr, dtype, cache=arr.ndim == 0))

    def _constant_id(self, arr: np.ndarray, dtype: DType, cache: bool) -> NodeId:
        self._check_open()
        if dtype is DType.BF16:
            stored = f32_to_bf16(arr.astype(np.float32)).reshape(arr.shape)
        else:
            with np.errstate(all="ignore"):
                stored = arr.astype(dtype.np)
            if dtype.is_float:
                if np.any(np.isfinite(arr) & ~np.isfinite(stored)):
                    raise ShapeError(f"value {_short(arr)} overflows {dtype}")
            elif not np.array_equal(stored, arr):
                raise ShapeError(f"value {_short(arr)} is not exactly representable as {dtype}")
        key = (dtype, stored.tobytes())
        if cache and key in self._scalars:
            return self._scalars[key]
        node_id = self._graph.add(Constant.from_array(stored, dtype))  # already stored as `dtype`
        if cache:
            self._scalars[key] = node_id
        return node_id


def _activation(fn: str) -> Callable[[TracedTensor], TracedTensor]:
    def method(self: TracedTensor) -> TracedTensor:
        return self._unary(fn)

    method.__name__ = fn
    method.__doc__ = f"Elementwise `{fn}` (MIR activation)."
    return method


@dataclass(frozen=True, eq=False)
class TracedTensor:
    """A value in a graph being traced. Immutable; `==` is identity (use `.eq()` for elementwise).

    >>> g = trace("t", lambda t: t.input("x", [2, 3]).t().unsqueeze(0))
    >>> str(g.shape(g.outputs[0]))
    'f32[1,3,2]'
    """

    tracer: Tracer
    id: NodeId

    #: Make numpy defer to our reflected operators (``np.float32(2) * x``).
    __array_ufunc__ = None

    # ── introspection ────────────────────────────────────────────────

    @property
    def node(self) -> Node:
        return self.tracer.graph.node(self.id)

    @property
    def shape(self) -> tuple[int | Dim, ...]:
        """Static dims as ints, dynamic dims as `Dim`."""
        return tuple(d.value if d.is_static else d for d in self.node.shape.dims)

    @property
    def dtype(self) -> DType:
        return self.node.shape.dtype

    @property
    def rank(self) -> int:
        return self.node.shape.rank

    ndim = rank

    def __repr__(self) -> str:
        return f"TracedTensor(%{self.id}: {self.node.shape}, trace={self.tracer.name!r})"

    def __bool__(self) -> bool:
        raise IRError(f"{self!r} has no value while tracing: Python control flow cannot depend on tensor values")

    # ── plumbing ──────────────────────────────────────────────────────

    def _emit(self, what: str, operands: Sequence[TracedTensor], build: Callable[[Graph], NodeId]) -> TracedTensor:
        return self.tracer._emit(what, operands, build)

    def _unary(self, fn: str) -> TracedTensor:
        return self._emit(fn, [self], lambda g: g.activation(fn, self.id))

    def _binary(self, fn: str, symbol: str, other: object, reverse: bool = False) -> TracedTensor:
        if isinstance(other, TracedTensor):
            o = self.tracer._own(other)
        elif isinstance(other, bool) or not isinstance(other, (numbers.Number, np.ndarray, np.generic)):
            return NotImplemented
        else:
            o = self.tracer._coerce(other, self.dtype)
        a, b = (o, self) if reverse else (self, o)
        return self._emit(symbol, [a, b], lambda g: g.binary(fn, a.id, b.id))

    def _compare(self, fn: str, other: object) -> TracedTensor:
        o = self.tracer._coerce(other, self.dtype)
        return self._emit(fn, [self, o], lambda g: g.compare(fn, self.id, o.id))

    # ── arithmetic operators ──────────────────────────────────────────

    def __add__(self, other: Operand) -> TracedTensor:
        return self._binary("add", "+", other)

    def __radd__(self, other: Operand) -> TracedTensor:
        return self._binary("add", "+", other, reverse=True)

    def __sub__(self, other: Operand) -> TracedTensor:
        return self._binary("sub", "-", other)

    def __rsub__(self, other: Operand) -> TracedTensor:
        return self._binary("sub", "-", other, reverse=True)

    def __mul__(self, other: Operand) -> TracedTensor:
        return self._binary("mul", "*", other)

    def __rmul__(self, other: Operand) -> TracedTensor:
        return self._binary("mul", "*", other, reverse=True)

    def __truediv__(self, other: Operand) -> TracedTensor:
        return self._binary("div", "/", other)

    def __rtruediv__(self, other: Operand) -> TracedTensor:
        return self._binary("div", "/", other, reverse=True)

    def __pow__(self, other: Operand) -> TracedTensor:
        return self._binary("pow", "**", other)

    def __rpow__(self, other: Operand) -> TracedTensor:
        return self._binary("pow", "**", other, reverse=True)

    def __neg__(self) -> TracedTensor:
        return self._unary("neg")

    def __abs__(self) -> TracedTensor:
        return self._unary("abs")

    def __matmul__(self, other: Operand) -> TracedTensor:
        if not isinstance(other, (TracedTensor, np.ndarray)):
            return NotImplemented
        return self.matmul(other)

    def __rmatmul__(self, other: Operand) -> TracedTensor:
        if not isinstance(other, np.ndarray):
            return NotImplemented
        o = self.tracer._coerce(other, self.dtype)
        return o.matmul(self)

    def __lt__(self, other: Operand) -> TracedTensor:
        return self._compare("lt", other)

    def __le__(self, other: Operand) -> TracedTensor:
        return self._compare("le", other)

    def __gt__(self, other: Operand) -> TracedTensor:
        return self._compare("gt", other)

    def __ge__(self, other: Operand) -> TracedTensor:
        return self._compare("ge", other)

    def eq(self, other: Operand) -> TracedTensor:
        """Elementwise ``==`` (bool result)."""
        return self._compare("eq", other)

    def ne(self, other: Operand) -> TracedTensor:
        """Elementwise ``!=`` (bool result)."""
        return self._compare("ne", other)

    def maximum(self, other: Operand) -> TracedTensor:
        """Elementwise max with broadcasting."""
        return self._binary("max", "maximum", other)

    def minimum(self, other: Operand) -> TracedTensor:
        """Elementwise min with broadcasting."""
        return self._binary("min", "minimum", other)

    # ── elementwise functions ─────────────────────────────────────────

    gelu = _activation("gelu")
    gelu_tanh = _activation("gelu_tanh")
    silu = _activation("silu")
    softplus = _activation("softplus")
    relu = _activation("relu")
    sigmoid = _activation("sigmoid")
    tanh = _activation("tanh")
    exp = _activation("exp")
    log = _activation("log")
    sqrt = _activation("sqrt")
    rsqrt = _activation("rsqrt")
    neg = _activation("neg")
    abs = _activation("abs")
    sin = _activation("sin")
    cos = _activation("cos")

    def cast(self, dtype: DType | str) -> TracedTensor:
        """Convert to `dtype`."""
        return self._emit(f"cast to {dtype}", [self], lambda g: g.cast(self.id, dtype))

    to = cast

    # ── compute ───────────────────────────────────────────────────────

    def matmul(self, other: Operand) -> TracedTensor:
        """Batched ``self @ other``; batch dims broadcast."""
        o = self.tracer._coerce(other, self.dtype)
        return self._emit("matmul", [self, o], lambda g: g.matmul(self.id, o.id))

    mm = matmul

    def softmax(self, axis: int = -1) -> TracedTensor:
        return self._emit("softmax", [self], lambda g: g.softmax(self.id, axis))

    def layer_norm(self, gamma: Operand, beta: Operand, eps: float = 1e-5) -> TracedTensor:
        ga, be = self.tracer._coerce(gamma, self.dtype), self.tracer._coerce(beta, self.dtype)
        return self._emit("layer_norm", [self, ga, be], lambda g: g.layer_norm(self.id, ga.id, be.id, eps))

    def rms_norm(self, gamma: Operand, eps: float = 1e-6) -> TracedTensor:
        ga = self.tracer._coerce(gamma, self.dtype)
        return self._emit("rms_norm", [self, ga], lambda g: g.rms_norm(self.id, ga.id, eps))

    def _reduce(self, fn: str, axis: int | Sequence[int] | None, keepdim: bool) -> TracedTensor:
        axes = () if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
        return self._emit(fn, [self], lambda g: g.reduce(fn, self.id, axes, keepdim))

    def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> TracedTensor:
        """Sum over `axis` (an int, several, or None for all)."""
        return self._reduce("sum", axis, keepdim)

    def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> TracedTensor:
        return self._reduce("mean", axis, keepdim)

    def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> TracedTensor:
        """Reduction; for the elementwise max of two tensors use `maximum`."""
        return self._reduce("max", axis, keepdim)

    def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> TracedTensor:
        return self._reduce("min", axis, keepdim)

    def prod(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> TracedTensor:
        return self._reduce("prod", axis, keepdim)

    # ── shape ─────────────────────────────────────────────────────────

    def reshape(self, *shape: DimLike | Sequence[DimLike]) -> TracedTensor:
        """``reshape(2, -1)`` or ``reshape([2, -1])``; dims may be `Dim`s, one may be -1."""
        dims = _varargs(shape)
        return self._emit(f"reshape to {_dims_text(dims)}", [self], lambda g: g.reshape(self.id, dims))

    def permute(self, *perm: int | Sequence[int]) -> TracedTensor:
        """Reorder axes: output axis i is input axis ``perm[i]``."""
        p = _varargs(perm)
        return self._emit(f"permute {list(p)}", [self], lambda g: g.transpose(self.id, p))

    def transpose(self, *args: int | Sequence[int]) -> TracedTensor:
        """``transpose(a, b)`` swaps two axes; ``transpose([p0, p1, …])`` is `permute`."""
        if len(args) == 2 and all(isinstance(a, int) for a in args):
            shape = self.node.shape
            try:
                a, b = (normalize_axis(x, shape.rank, "transpose axis") for x in args)
            except ShapeError as exc:
                raise ShapeError(f"transpose{args}({shape}): {exc}") from None
            perm = list(range(shape.rank))
            perm[a], perm[b] = perm[b], perm[a]
            return self.permute(perm)
        if len(args) == 1 and not isinstance(args[0], int):
            return self.permute(args[0])
        raise IRError(f"transpose takes two axes to swap or one permutation, got {args!r}; "
                      f"use permute for a full permutation")

    def t(self) -> TracedTensor:
        """Swap the last two axes."""
        if self.rank < 2:
            raise ShapeError(f"t() needs rank >= 2, got {self.node.shape}")
        return self.transpose(-2, -1)

    def unsqueeze(self, axis: int) -> TracedTensor:
        """Insert a size-1 axis at `axis` (negative counts from the end of the result)."""
        dims = list(self.node.shape.dims)
        try:
            pos = normalize_axis(axis, len(dims) + 1, "unsqueeze axis")
        except ShapeError as exc:
            raise ShapeError(f"unsqueeze({self.node.shape}): {exc}") from None
        dims.insert(pos, Dim(1))
        return self._emit(f"unsqueeze({axis})", [self], lambda g: g.reshape(self.id, dims))

    def squeeze(self, axis: int | None = None) -> TracedTensor:
        """Drop the size-1 axis `axis`, or every size-1 axis when `axis` is None."""
        s = self.node.shape
        if axis is None:
            dims = [d for d in s.dims if d != 1]
        else:
            try:
                pos = normalize_axis(axis, s.rank, "squeeze axis")
            except ShapeError as exc:
                raise ShapeError(f"squeeze({s}): {exc}") from None
            if s.dims[pos] != 1:
                raise ShapeError(f"squeeze({s}): axis {axis} has size {s.dims[pos]}, not 1")
            dims = [d for i, d in enumerate(s.dims) if i != pos]
        return self._emit(f"squeeze({axis})", [self], lambda g: g.reshape(self.id, dims))

    def narrow(self, axis: int, start: int, length: int) -> TracedTensor:
        """``length`` elements from ``start`` along static axis `axis`."""
        return self._emit(f"narrow(axis={axis}, start={start}, length={length})", [self],
                          lambda g: g.narrow(self.id, axis, start, length))

    def expand(self, *shape: DimLike | Sequence[DimLike]) -> TracedTensor:
        """Broadcast to `shape` (numpy `broadcast_to` rules)."""
        dims = _varargs(shape)
        return self._emit(f"expand to {_dims_text(dims)}", [self], lambda g: g.expand(self.id, dims))


def _varargs(args: tuple) -> tuple:
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return tuple(args[0])
    return tuple(args)


def _short(arr: np.ndarray) -> str:
    text = repr(arr.tolist())
    return text if len(text) <= 60 else text[:57] + "..."


def _dims_text(dims: Sequence[object]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def trace(name: str, fn: Callable[[Tracer], TraceOutputs]) -> Graph:
    """Run `fn(tracer)` and return the recorded, verified MIR graph.

    `fn` returns the outputs: one tensor (named out0), a list/tuple (out0,
    out1…) or a dict name → tensor. The trace is closed afterwards: its
    tensors can no longer record operations.
    """
    tracer = Tracer(name)
    try:
        result = fn(tracer)
        if isinstance(result, TracedTensor):
            outputs: dict[str, TracedTensor] | list[TracedTensor] = [result]
        elif isinstance(result, Mapping):
            outputs = dict(result)
        elif isinstance(result, (list, tuple)):
            outputs = list(result)
        else:
            raise IRError(f"trace {name!r}: the function must return a TracedTensor or a list/tuple/dict of them, "
                          f"got {type(result).__name__}")
        values = outputs.values() if isinstance(outputs, dict) else outputs
        for t in values:
            tracer._own(t)
    finally:
        tracer._open = False
    graph = tracer.graph
    if isinstance(outputs, dict):
        graph.set_outputs({k: t.id for k, t in outputs.items()})
    else:
        graph.set_outputs([t.id for t in outputs])
    graph.verify()
    return graph


@dataclass(frozen=True)
class CustomOp:
    """A registered user op (`custom_op`): call it on traced tensors to add one node.

    `name` is its registration's (`rlx.ir.ops_user.USER_OPS`); a `Graph` uses it as
    ``g.user_op(op.name, [ids])``.
    """

    name: str

    def __call__(self, *inputs: TracedTensor) -> TracedTensor:
        if not inputs or not isinstance(inputs[0], TracedTensor):
            raise IRError(f"custom op {self.name!r} takes traced tensors, got {inputs!r}")
        return inputs[0].tracer.user_op(self.name, inputs)

    @property
    def spec(self) -> UserOpSpec:
        return user_op_spec(self.name)


def custom_op(name: str, *, infer: Callable[..., object], reference: Callable[..., object],
              cpu: object = None, cuda: object = None, metal: object = None,
              vjp: Callable[..., object] | None = None) -> CustomOp:
    """Register the op `name`, defined outside RLX, and return it as a callable on traced tensors.

    `infer(*input_shapes)` gives the output `Shape` (or `(dims, dtype)`); `reference(*arrays)` computes it
    in numpy; `cpu`, `cuda`, `metal` each name a header file holding that backend's function (called
    `name`), or a `(header, function)` pair — the calling convention is in `rlx.ir.ops_user`. A backend
    given no code refuses the op before any build.
    `vjp(*inputs, output, d_output)` returns one cotangent per input, written with traced ops.
    Registering a name again replaces it.

    >>> import numpy as np
    >>> from rlx import reference
    >>> twice = custom_op("twice_doc", infer=lambda x: x, reference=lambda x: 2 * x)
    >>> g = trace("g", lambda t: twice(t.input("x", [2])))
    >>> reference.run(g, {"x": np.array([1.0, 3.0], np.float32)})[0].tolist()
    [2.0, 6.0]
    """
    sources = tuple((backend, OpSource.of(name, backend, value))
                    for backend, value in (("cpu", cpu), ("cuda", cuda), ("metal", metal)) if value is not None)
    register_user_op(UserOpSpec(name, infer, reference, sources, vjp))
    return CustomOp(name)
