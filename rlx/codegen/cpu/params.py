"""Where each param lives in the CPU context (`ctx->params`) and how `rlx_set_param` stores it.

A pure function of the decided LIR (`param_layout`): a param a GEMM reads packed (`PackedParam`)
takes padded panels in its own precision, a Winograd conv's weight (`ConvPlan`) its transform ``[16 or 36, O, C]``,
a conv's weight with the output channels in the lanes (`nchw_lanes`) its transpose ``[C*kh*kw, O]``,
an `int8_matmul` weight (`Int8Param`) its int8 panels, a q8_0 / q4_0 / q4_1 weight of integer decode GEMVs
(`InterleavedQuantParam`) its blocks interleaved by 16 rows (same size),
a narrow param read only through one cast (`WidenedParam`) its f32 copy, a table of wide gathers
(`ResidentTable`) its own bytes, which a wide run copies a bound table into, and every other param its
own bytes (re-laid out on set when its layout permutes it). Each slot starts on a cache line. The
emitter reads offsets from it, the prelude template the per-slot records, `memory_plan` the total.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("demo")
>>> x = g.input("x", [2, 8])
>>> w = g.param("w", [8, 3])
>>> g.set_outputs([g.matmul(x, w)])
>>> layout = param_layout(plan(g))
>>> layout.offsets, layout.nbytes, layout.slots[0]["mode"]
((0,), 128, 'copy')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from rlx.codegen.cpu.base import PACK_NR_MAX, c_string, comment, round_up
from rlx.ir.decisions import PackedParam, ResidentTable, WidenedParam
from rlx.ir.decisions_conv import WINOGRAD_TILE, ConvPlan
from rlx.ir.decisions_int8 import Int8Param
from rlx.ir.decisions_quant import InterleavedQuantParam
from rlx.ir.dtype import DType
from rlx.ir.graph import NodeId
from rlx.ir.lir import LirModule


@dataclass(frozen=True)
class ParamLayout:
    """The param storage of one CPU program."""

    #: One record per param slot for `templates/cpu/prelude.c.j2` (offset, mode, dims, source strides, ...).
    slots: tuple[Mapping[str, Any], ...]
    #: Byte offset of each slot in `ctx->params`.
    offsets: tuple[int, ...]
    #: Elements of one K x N matrix of each packed param (N padded to the widest panel, K to pairs if narrow).
    packed_floats: Mapping[NodeId, int]
    #: Bytes of `ctx->params`.
    nbytes: int


def param_layout(lir: LirModule) -> ParamLayout:
    """The storage of every param of a decided `lir` (the CPU's decisions say which are packed, int8, widened)."""
    packed = {d.node: d.transposed for d in lir.decided(PackedParam)}
    int8 = {d.node: d for d in lir.decided(Int8Param)}
    widened = {d.node for d in lir.decided(WidenedParam)}
    resident = {d.node for d in lir.decided(ResidentTable)}
    interleaved = {d.node: d.quant for d in lir.decided(InterleavedQuantParam)}
    conv_packed = {d.weight: d.depth for d in lir.decided(ConvPlan) if d.packed and d.algorithm == "implicit_gemm"}
    winograd = {d.weight: WINOGRAD_TILE[d.layout] for d in lir.decided(ConvPlan) if d.algorithm == "winograd"}
    lanes = {d.weight: d.vector for d in lir.decided(ConvPlan) if d.layout == "nchw_lanes"}
    slots: list[Mapping[str, Any]] = []
    offsets: list[int] = []
    packed_floats: dict[NodeId, int] = {}
    offset = 0
    for slot, spec in enumerate(lir.params):
        stored = lir.graph.node(spec.node).shape
        nbytes = stored.max_nbytes
        offsets.append(offset)
        user_dims = spec.shape.static_dims
        layout = spec.layout or tuple(range(len(user_dims)))
        user_strides = [math.prod(user_dims[i + 1:]) for i in range(len(user_dims))]
        permuted = spec.layout is not None and list(spec.layout) != list(range(len(user_dims)))
        dims = list(stored.static_dims)
        src_strides = [user_strides[p] for p in layout]
        storage = nbytes
        mode, note = ("permute", " (re-laid out on set)") if permuted else ("copy", "")
        if spec.node in packed:
            # dims/strides of the GEMM's right operand B[..., K, N] (the param, or its transpose)
            if packed[spec.node]:
                dims[-2], dims[-1] = dims[-1], dims[-2]
                src_strides[-2], src_strides[-1] = src_strides[-1], src_strides[-2]
            k, n = dims[-2], dims[-1]
            # f16/bf16 weights keep their precision, K padded to pairs (kernels/gemm_bf16.h)
            narrow = stored.dtype in (DType.F16, DType.BF16)
            mat = (round_up(k, 2) if narrow else k) * round_up(n, PACK_NR_MAX)
            packed_floats[spec.node] = mat
            storage = math.prod(dims[:-2]) * mat * stored.dtype.itemsize
            mode = f"pack_{stored.dtype.value}" if narrow else "pack"
            note = " (packed for the GEMM kernel on set)"
        elif spec.node in conv_packed:
            # a conv weight [O, C, *k] read as the GEMM operand [C*k, O] (its transpose), packed on set as
            # K / depth matrices [depth, O] (blocks of K rows, one after the other: ConvPlan.depth)
            k, n = math.prod(dims[1:]), dims[0]
            depth = conv_packed[spec.node] or k
            dims, src_strides = [k // depth, depth, n], [depth, 1, k]
            mat = depth * round_up(n, PACK_NR_MAX)
            packed_floats[spec.node] = mat
            storage, mode, note = k // depth * mat * 4, "pack", " (conv weight packed for the GEMM kernel on set)"
        elif spec.node in winograd:
            # a 3x3 conv weight [O, C, 3, 3] stored as its Winograd F(m x m, 3x3) transform [(m + 2)^2, O, C]
            # (kernels/conv.h; m = 2: mode winograd, m = 4: winograd4)
            m = winograd[spec.node]
            dims, src_strides = dims[:2], [dims[1] * 9, 9]
            storage = (m + 2) ** 2 * dims[0] * dims[1] * 4
            mode, note = ("winograd" if m == 2 else "winograd4"), " (Winograd-transformed conv weight, on set)"
        elif spec.node in lanes:
            # a conv weight [O, C, *k] with the output channels in the lanes: stored as [O / V, C*k, V], each block of
            # V output channels transposed (a window tap's V channels one vector, a block's weights contiguous;
            # kernels/conv_tile.h rlx_conv_lanes_block)
            k, v = math.prod(dims[1:]), lanes[spec.node]
            dims, src_strides = [dims[0] // v, k, v], [v * k, 1, k]
            mode, note = "permute", f" (conv weight blocked to O/{v} x C*kh*kw x {v} on set)"
        elif spec.node in int8:
            # an int8_matmul weight [K, N]: quantized per column into int8 panels on set (int8_gemm.h)
            storage = int8[spec.node].storage_bytes
            mode, note = "int8", " (quantized to int8 per output channel on set)"
        elif spec.node in interleaved:
            # GGUF blocks [N, bytes a row], the same bytes reordered by 16 rows (kernels/quant_interleaved.h)
            mode, note = f"qi_{interleaved[spec.node]}", " (blocks interleaved by 16 rows on set)"
        elif spec.node in resident:
            # its own bytes; bound in place, copied into the slot by the first wide run (rlx_resident_table)
            mode, note = "resident", " (bound in place: copied here by the first run gathering many rows)"
        elif spec.node in widened:
            # read only through one cast to f32: stored as that f32 value (exact), cast once on set
            storage = math.prod(dims or [1]) * 4
            mode, note = f"widen_{stored.dtype.value}", " (widened to f32 on set)"
        slots.append({
            "slot": slot, "offset": offset, "nbytes": nbytes, "name": c_string(spec.name),
            "comment": comment(spec.name, 60), "shape": comment(str(stored), 60),
            "mode": mode, "note": note,
            "rank": 3 if spec.node in conv_packed or spec.node in lanes else 2 if spec.node in winograd
            else max(len(user_dims), 1),
            "elsize": stored.dtype.itemsize,
            "dims": dims or [1], "src_strides": src_strides or [0],
        })
        offset += (storage + 63) // 64 * 64
    return ParamLayout(tuple(slots), tuple(offsets), MappingProxyType(packed_floats), offset)
