"""CPU lowering for decode steps: quantized projections of one activation as one GEMV pass, and the weights
of integer-activation GEMVs stored interleaved by 16 rows (`interleaved_params`: `InterleavedQuantParam`).

`quant_gemv_groups(lir)` records a `QuantGemvGroup` (`rlx.ir.decisions_quant`) for each run of
`dequant_matmul` nodes that read the same activation with the same block format and activation mode
(q8/q16 integer activations or f32), scheduled one after another (a decoder layer's Q/K/V, its gate/up),
and absorbs the `silu(gate) * up` region of a gate/up pair when it is scheduled right after them and is
their only reader. In decode steps the first member's kernel then quantizes the activation once (q8/q16)
and forks one team for all of them (`templates/cpu/kernels/qgemv_group.h`): one fork where there were
three, and the SwiGLU reads gate and up in the cache of the thread that computed them (a separate
SwiGLU kernel read half of them from the other core's: 6-9% of a 16-row SmolLM2 step's kernel time on 2 cores).
With f32 activations each row gets the arithmetic of the member's own GEMV, so a row's result does not
depend on the other rows of its step (batch invariance).

Running the later members (and the SwiGLU) at the first member's slot writes their outputs early.
That is safe here: the buffers that die between the first member and the last absorbed node are
read only by the group itself — the activation, which the pass has quantized into scratch before
any thread writes, and (for the SwiGLU) the gate and up outputs, which the pass never writes.

>>> from rlx.ir.graph import Graph
>>> from rlx.ir.quant import row_bytes
>>> from rlx.opt.memplan import plan
>>> from rlx.opt.pipeline import optimize
>>> g = Graph("ffn")
>>> x = g.input("x", [1, 64])
>>> gate, up = (g.dequant_matmul(x, g.param(n, [96, row_bytes("q4_1", 64)], "u8"), quant="q4_1", act="q16")
...             for n in ("gate", "up"))
>>> g.set_outputs([g.mul(g.activation("silu", gate), up)])
>>> [d.describe() for d in quant_gemv_groups(plan(optimize(g)))]
['%2 %4 run as one quantized GEMV pass when a step has <= 16 rows, writing the SwiGLU %5']
"""

from __future__ import annotations

from rlx.ir import ops as O
from rlx.ir.decisions_quant import INTERLEAVE_ROWS, InterleavedQuantParam, QuantGemvGroup
from rlx.ir.graph import Node
from rlx.ir.lir import LirModule
from rlx.opt.fusion import is_silu_times, scheduled_runs

#: Rows of activations up to which the pass runs (RLX_QDECODE_MAX_M of kernels/quant.h): every decode
#: row, and the rows of a speculative verification, take the same per-row arithmetic (batch-invariant).
DECODE_GEMV_ROWS = 16
#: Most projections one pass computes (RLX_QGROUP_MAX of kernels/qgemv_group.h).
DECODE_GEMV_MEMBERS = 4


#: Block formats whose params may be stored interleaved by 16 rows (kernels/quant_interleaved.h).
INTERLEAVED_FORMATS = ("q8_0", "q4_0", "q4_1")


def interleaved_params(lir: LirModule) -> tuple[InterleavedQuantParam, ...]:
    """`InterleavedQuantParam` for every q8_0 / q4_0 / q4_1 weight param whose readers are all integer-activation
    (q8 / q16) `dequant_matmul`s of its format, with a multiple of 16 rows, stored as given (no re-layout).

    >>> from rlx.ir.graph import Graph
    >>> from rlx.ir.quant import row_bytes
    >>> from rlx.opt.memplan import plan
    >>> g = Graph("q")
    >>> x = g.input("x", [2, 64])
    >>> g.set_outputs([g.dequant_matmul(x, g.param("w", [32, row_bytes("q4_1", 64)], "u8"), quant="q4_1", act="q16")])
    >>> [d.describe() for d in interleaved_params(plan(g))]
    ['%1 param stored interleaved by 16 rows (q4_1 blocks) for the integer decode GEMV']
    """
    graph = lir.graph
    found: list[InterleavedQuantParam] = []
    for spec, readers in lir.param_readers():
        nid = spec.node
        if not readers or (spec.layout is not None and list(spec.layout) != sorted(spec.layout)):
            continue
        first = readers[0].op
        if not all(isinstance(r.op, O.DequantMatMul) and r.inputs[1] == nid and r.inputs[0] != nid
                   and r.op.act in ("q8", "q16") and r.op.quant == first.quant for r in readers):
            continue
        rows = graph.node(nid).shape.dims[0].value
        if first.quant in INTERLEAVED_FORMATS and rows % INTERLEAVE_ROWS == 0:
            found.append(InterleavedQuantParam(nid, first.quant))
    return tuple(found)


def quant_gemv_groups(lir: LirModule, interleaved: frozenset[int] = frozenset()) -> tuple[QuantGemvGroup, ...]:
    """The `QuantGemvGroup` decisions of `lir` (see the module docstring); `interleaved`: the weight params stored
    interleaved (a group's members share one layout)."""
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    schedule = list(lir.schedule)

    def at(i: int) -> Node | None:
        return graph.node(schedule[i]) if 0 <= i < len(schedule) else None

    def member(n: Node) -> bool:
        return (isinstance(n.op, O.DequantMatMul) and n.op.act in ("f32", "q8", "q16")
                and lir.buffers[n.id].storage in ("arena", "output")
                and graph.node(n.inputs[0]).shape.dims[-1].value % 32 == 0)

    pos = {nid: i for i, nid in enumerate(schedule)}
    found: list[QuantGemvGroup] = []
    for members in scheduled_runs(lir, member, lambda n: (n.inputs[0], n.op.quant, n.op.act,
                                                                   n.inputs[1] in interleaved),
                                  DECODE_GEMV_MEMBERS):
        ids = tuple(m.id for m in members)
        swiglu: tuple[int, ...] = ()
        if len(members) == 2 and members[0].shape == members[1].shape and not outputs & set(ids):
            region = at(pos[ids[-1]] + 1)
            if (region is not None and is_silu_times(region.op) and region.inputs == ids
                    and all(set(users[m]) == {region.id} for m in ids) and region.shape == members[0].shape
                    and lir.buffers[region.id].storage in ("arena", "output")):
                swiglu = (region.id,)
        if len(members) > 1:
            found.append(QuantGemvGroup(ids, DECODE_GEMV_ROWS, swiglu))
    return tuple(found)
