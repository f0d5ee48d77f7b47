"""CUDA rules for GGUF-quantized weights: `dequant_matmul` and `dequantize`.

Listed in the CUDA table by `rlx.codegen.cuda.rule_table`. The kernels
(`templates/cuda/kernels/quant.cuh`) read the blocks directly: a warp-per-row
GEMV for decode (few rows of activations), and for prefill tiles of the weight
dequantized into the compute type in scratch, multiplied on cuBLASLt (tensor
cores in f16 / bf16 sessions) or the built-in tiled GEMM. `act="q8"` (int8
activations, `templates/cuda/kernels/quant_q8.cuh`): the decode GEMVs take
integer dot products (`__dp4a`) with x quantized as the reference does.

>>> import rlx
>>> from rlx.ir.quant import row_bytes
>>> g = rlx.Graph("q")
>>> x = g.input("x", [1, 64])
>>> w = g.param("w", [8, row_bytes("q4_1", 64)], "u8")
>>> g.set_outputs([g.dequant_matmul(x, w, quant="q4_1")])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cuda")
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlx.codegen.cuda.emit import _CTYPE, _CUDA_TYPE, FORMAT_IDS, CudaEmitter, Launch, _float_c
from rlx.codegen.cuda.rules import NormPrologue, norm_prologue, small_early
from rlx.codegen.registry import Kernel, RuleSet
from rlx.codegen.text import comment
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.norms import norm_inputs
from rlx.ir.quant import INT8_ACT_FORMATS, quant_format
from rlx.opt.lowering_cuda import LT_DTYPES, quant_act_offset, quant_tile
from rlx.opt.lowering_cuda_kernels import small_gemm_kmax, small_gemm_wide_kmax

TEMPLATE = "cuda/quant.cu.j2"
QUANT, QUANT_Q8, GEMM = "cuda/kernels/quant.cuh", "cuda/kernels/quant_q8.cuh", "cuda/kernels/gemm.cuh"
QUANT_MMA, GEMM_MMA = "cuda/kernels/quant_mma.cuh", "cuda/kernels/gemm_mma.cuh"
GEMM_SMALL = "cuda/kernels/gemm_small.cuh"
QUANT_OCC = "cuda/kernels/quant_occ.cuh"
#: Activation modes of `dequant_matmul` CUDA runs ("q16", int16 blocks, runs on the CPU only).
ACTS = ("f32", "q8")
#: Floats each staged 32-value sub-block takes in the fused decode GEMV's shared memory (RLX_QFUSED_PAD).
QFUSED_PAD = 36
#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")


@dataclass(frozen=True, kw_only=True)
class DequantMatMul(Launch):
    """Launch arguments of `block_dequant_matmul`: pointers, sizes, the format and the prefill tiling."""

    t: str
    fmt: str
    qk: int
    qb: int
    x: str
    w: str
    y: str
    m: str
    n: int
    k: int
    row_bytes: int
    tile: int
    #: Byte offset (from the scratch region) of a split product's [M, tile] buffer.
    ctmp_off: int
    lt: bool
    cuda_type: str
    #: The activations: "f32", or "q8" (int8 per block of 32, kernels/quant_q8.cuh).
    act: str = "f32"
    #: Byte offset (from the scratch region) of act="q8"'s quantized activations (records, or x' = q * d).
    act_off: int = 0
    #: Steps of mma_rows[0]..mma_rows[1] rows run rlx_qmma (the node's `QuantMma` decision; (0, 0): none).
    mma_rows: tuple[int, int] = (0, 0)
    #: The weight's dequantized copy (`DequantCopy`: a device pointer expression) that steps of `copy_rows` rows or
    #: more multiply whole (instead of rlx_qmma or dequantizing tiles into scratch); "": none.
    copy: str = ""
    copy_rows: int = 0
    #: With a copy: the residual the copy's GEMM adds (its C operand; `y` is then the add's output); "": none.
    addend: str = ""
    #: With a copy: steps of copy_rows..small_rows rows multiply it on rlx_gemm_small (`CopySmallGemm`); 0: none.
    small_rows: int = 0
    #: ... computing the norm that produces X in its prologue (None: X read as it is), and which operands it reads
    #: before the PDL wait (RLX_GSM_EARLY_* bits)
    small_norm: NormPrologue | None = None
    small_early: int = 0
    #: ... writing `small_y` (a SwiGLU region's output) from this copy and `small_b2` (its up projection's copy)
    #: instead of `y` ("": y, no pair)
    small_y: str = ""
    small_b2: str = ""
    #: The largest K the small kernel takes on the target's arch (its shared-memory limit raised for it)
    small_kmax: int = 0
    #: A product whose steps of copy_rows..small_rows rows another's small GEMM `small_by` computes: an up projection
    #: (its gate's, with the SwiGLU) or a sibling of the same X (CopySmallGemm.siblings) (-1: none)
    small_by: int = -1
    #: ... the siblings this launch computes: (their copy, their output, their N) each
    small_siblings: tuple[tuple[str, str, int], ...] = ()
    #: ... on rlx_gemm_small_wide (CopySmallGemm.wide: persistent blocks over the column tiles, the copy read once)
    small_wide: bool = False

    @property
    def mma(self) -> bool:
        return self.mma_rows[1] > 0

    @property
    def small_kernel(self) -> str:
        """The rlx_gemm_small instance that multiplies the copy ([K, N], as dequantized at set_param)."""
        p = self.small_norm
        norm = f"{p.kind}, {p.res_on}, {p.cpt}" if p is not None else "0, false, 1"
        if self.small_wide:
            return f"rlx_gemm_small_wide<{self.t}, {norm}>"
        add, pair = ("true" if flag else "false" for flag in (self.addend, self.small_b2))
        mem = f", {len(self.small_siblings)}" if self.small_siblings else ""
        return f"rlx_gemm_small<{self.t}, RLX_ACT_NONE, false, {norm}, {add}, {pair}{mem}>"

    @property
    def small_args(self) -> str:
        """rlx_gemm_small's arguments after M, N, K: the norm's (nullptrs without one), `early`, the addend."""
        t, p = self.t, self.small_norm
        norm = (f"{p.x}, {p.res}, {p.gamma}, {p.beta}, {p.out}, (float){p.eps}" if p is not None
                else ", ".join([f"({t} *)nullptr"] * 5) + ", 0.0f")
        if self.small_wide:
            return f"{norm}, {self.small_early}"
        addend = f"(const {t} *){self.addend}" if self.addend else f"({t} *)nullptr"
        b2 = f"(const {t} *){self.small_b2}" if self.small_b2 else f"({t} *)nullptr"
        return f"{norm}, {self.small_early}, {addend}, {b2}, {self.small_members}"

    @property
    def small_members(self) -> str:
        """The siblings' RlxGsmMembers (none: empty): copies, outputs, widths, and the column tiles before each."""
        sib = self.small_siblings
        if not sib:
            return "RlxGsmMembers{}"
        pad = [*sib, ("nullptr", "nullptr", 0)][:2]
        tiles = f"(int)((N + RLX_GSM_BN - 1) / RLX_GSM_BN), (int)(({sib[0][2]} + RLX_GSM_BN - 1) / RLX_GSM_BN)"
        return (f"RlxGsmMembers{{{{(const void *){pad[0][0]}, (const void *){pad[1][0]}}}, "
                f"{{(void *){pad[0][1]}, (void *){pad[1][1]}}}, {{{pad[0][2]}, {pad[1][2]}}}, {tiles}}}")

    @property
    def small_grid(self) -> str:
        """The small launch's grid (a C expression): this product's column tiles, then its siblings', by the row
        tiles; the wide kernel's: a block a multiprocessor (or a column tile, when there are fewer)."""
        if self.small_wide:
            tiles = "(N + RLX_GSW_BN - 1) / RLX_GSW_BN"
            return f"dim3((unsigned)({tiles} < (int64_t)c->num_sms ? {tiles} : (int64_t)c->num_sms))"
        cols = " + ".join(["(unsigned)((N + RLX_GSM_BN - 1) / RLX_GSM_BN)",
                           *(f"(unsigned)(({n} + RLX_GSM_BN - 1) / RLX_GSM_BN)" for _, _, n in self.small_siblings)])
        return f"dim3({cols}, (unsigned)((M + 15) / 16))"

    @property
    def small_smem(self) -> str:
        """The small kernel's dynamic shared memory for this K (a C expression)."""
        if self.small_wide:
            return "rlx_gemm_small_wide_smem(K)"
        return "rlx_gemm_small_pair_smem(K)" if self.small_b2 else "rlx_gemm_small_smem(K)"

    @property
    def small_attrs(self) -> tuple[tuple[str, str], ...]:
        """The small kernel's dynamic shared-memory limit, raised at rlx_create (none without it)."""
        if not self.small_rows or self.small_by >= 0:
            return ()
        return ((self.small_kernel, self.small_smem.replace("(K)", f"({self.small_kmax})")),)



@dataclass(frozen=True, kw_only=True)
class DecodeGemvLaunch(Launch):
    """Launch arguments of `block_decode_gemv` (a `DecodeGemv` group, launched at its first member)."""

    t: str
    fmt: str
    qk: int
    qb: int
    #: The activation the kernel stages: the absorbed norm's input, else the members' input.
    x: str
    gamma: str
    eps: str
    norm: str
    res: str
    epi: int
    m: str
    k: int
    row_bytes: int
    #: Weight rows the warps walk: every member's, or the gate's with SwiGLU (row r of gate and up together).
    rows: int
    ws: tuple[str, ...]
    ys: tuple[str, ...]
    ns: tuple[int, ...]
    max_rows: int
    #: Each member's own path, for steps of more than max_rows rows.
    large: tuple[DequantMatMul, ...]
    #: The fused kernel's ACT template argument: "" (f32 activations) or ", 1" (act="q8").
    act_arg: str = ""
    #: Groups of 8 weight rows a block of rlx_qgemv_xr takes in one-row steps (DecodeGemv.xr_groups); 0: the old walk.
    xr_groups: int = 0
    #: Weight rows a warp's item of rlx_qgemv_occ takes in one-row steps (DecodeGemv.occ_rows); 0: not that walk.
    occ_rows: int = 0
    #: rlx_qgemv_occ's PF argument ("true": the next item prefetched into L2, DecodeGemv.occ_prefetch).
    occ_pf: str = "false"
    #: rlx_qgemv_occ's ACT argument: "" (f32 activations) or ", 1" (int8: act="q8", quantized in registers).
    occ_act: str = ""


@dataclass(frozen=True, kw_only=True)
class Dequantize(Launch):
    """Launch arguments of `block_dequantize`."""

    t: str
    fmt: str
    qk: int
    qb: int
    x: str
    y: str
    rows: str
    k: int
    row_bytes: int


def _accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    if getattr(op, "quant", None) not in FORMAT_IDS:
        return f"in format {getattr(op, 'quant', None)!r}; it takes {sorted(FORMAT_IDS)}"
    act = getattr(op, "act", "f32")
    if act not in ACTS:
        return f"with act={act!r}: CUDA takes activations {ACTS}"
    if act != "f32" and op.quant not in INT8_ACT_FORMATS:  # type: ignore[attr-defined]
        # kernels/quant_q8.cuh's integer dot products take every format of the IR's int8 activations
        return f"with act={act!r} in format {op.quant!r}: CUDA's int8 activations take {INT8_ACT_FORMATS}"  # type: ignore[attr-defined]
    return None


def _dequant_args(e: CudaEmitter, node: Node) -> DequantMatMul:
    op: O.DequantMatMul = node.op  # type: ignore[assignment]
    x_id, w_id = node.inputs
    x, w = e.node(x_id).shape, e.node(w_id).shape
    fmt = quant_format(op.quant)
    dt = e.ddt(node.id)
    k, n = x.dims[-1].value, w.dims[0].value
    tile = quant_tile(n, k, dt.itemsize)
    lt = e.target.gemm == "cublaslt" and dt in LT_DTYPES
    ctmp_off = -(-k * tile * dt.itemsize // 256) * 256  # after the weight tile (lowering_cuda.scratch_need)
    rows = 1
    for d in x.dims[:-1]:
        rows *= d.max
    act_off = -(-quant_act_offset(n, k, rows, dt.itemsize) // 256) * 256
    return DequantMatMul(**e.base(node), uses_lt=lt, t=_CTYPE[dt], fmt=FORMAT_IDS[fmt.name], qk=fmt.block_size,
                         qb=fmt.block_bytes, x=e.ptr(x_id), w=e.ptr(w_id), y=e.ptr(node.id),
                         m=e.numel(x.dims[:-1]), n=n, k=k, row_bytes=w.dims[1].value, tile=tile, ctmp_off=ctmp_off,
                         lt=lt, cuda_type=_CUDA_TYPE.get(dt, ""), act=op.act, act_off=act_off,
                         mma_rows=(mma.min_rows, mma.max_rows) if (mma := e.quant_mma.get(node.id)) else (0, 0),
                         **_copy_args(e, node.id, _CTYPE[dt]))


def _copy_args(e: CudaEmitter, nid: int, ctype: str) -> dict:
    """`copy` / `copy_rows` (and the small GEMM's rows and shared-memory limit) of a reader of a `DequantCopy`
    (none: {})."""
    d = e.dequant_copy.get(nid)
    if d is None:
        return {}
    args = {"copy": f"RLX_P({ctype}, {d.offset})", "copy_rows": d.min_rows[d.readers.index(nid)]}
    pair = e.copy_pair_of.get(nid)
    if pair is not None:  # an up projection or a sibling: another product's launch computes it
        return {**args, "small_rows": pair.max_rows, "small_by": pair.node}
    small = e.copy_small.get(nid)
    if small is not None:
        args["small_rows"] = small.max_rows
        args["small_wide"] = small.wide
        args["small_kmax"] = (small_gemm_wide_kmax if small.wide else small_gemm_kmax)(e.target.arch)
        params = []
        if small.norm:
            norm = e.node(small.norm[0])
            args["small_norm"] = norm_prologue(e, norm)
            params = list(norm_inputs(norm).params)
        args["small_early"] = small_early(e, True, params)  # the copy is written at set_param only
        if small.pair:  # (the norm's output: read by the two products only, so not stored)
            if "small_norm" in args:
                args["small_norm"] = dataclasses.replace(args["small_norm"], out=f"({ctype} *)nullptr")
            args["small_y"] = e.ptr(small.swiglu[0])
            args["small_b2"] = f"RLX_P({ctype}, {e.dequant_copy[small.pair[0]].offset})"
        args["small_siblings"] = tuple((f"RLX_P({ctype}, {e.dequant_copy[s].offset})", e.ptr(s), e.dequant_copy[s].n)
                                       for s in small.siblings)
    return args


def _headers(act: str, mma: bool, small: bool = False, occ: bool = False) -> tuple[str, ...]:
    return (QUANT, *((QUANT_Q8,) if act == "q8" else ()), *((QUANT_OCC,) if occ else ()), GEMM,
            *((GEMM_MMA, QUANT_MMA) if mma else ()), *((GEMM_SMALL,) if small else ()))


def _decode_gemv(e: CudaEmitter, node: Node) -> Kernel:
    """The first member of a `DecodeGemv`: the fused launch for decode steps, every member's path otherwise."""
    d = e.decode_gemv[node.id]
    members = [e.node(m) for m in d.members]
    large = tuple(_dequant_args(e, m) for m in members)
    first = large[0]
    x = node.inputs[0]
    gamma, eps = "nullptr", "0.0"
    if d.norm:
        norm = e.node(d.norm[0])
        x, gamma, eps = norm.inputs[0], e.ptr(norm.inputs[1]), _float_c(norm.op.eps)
    res, epi, ys = "nullptr", 0, tuple(a.y for a in large)
    if d.residual:
        add = e.node(d.residual[0])
        other = add.inputs[1] if add.inputs[0] == node.id else add.inputs[0]
        res, epi, ys = e.ptr(other), 1, (e.ptr(add.id),)
        if add.id in e.copy_adds:  # larger steps: the GEMM on the copy writes the sum (DequantCopy.adds)
            large = (dataclasses.replace(first, y=e.ptr(add.id), addend=e.ptr(other)),)
            first = large[0]
    elif d.swiglu:
        epi, ys = 2, (e.ptr(d.swiglu[0]), "nullptr")  # gate and up rows together make one output
    ns = tuple(a.n for a in large)
    norm_c = "true" if d.norm else "false"
    # staged rows past the default 48 KiB of dynamic shared memory (K > 8192): raise the kernel's limit
    act_arg = ", 1" if first.act == "q8" else ""
    attrs = tuple((f"rlx_qgemv_fused<{first.t}, {first.fmt}, {first.qk}, {first.qb}, {mr}, {norm_c}, {epi}{act_arg}>",
                   str(smem)) for mr in range(1, d.max_rows + 1)
                  if (smem := mr * (first.k // 32) * QFUSED_PAD * 4) > 48 * 1024)
    attrs += tuple(a for member in large for a in member.small_attrs)
    xr = d.xr_groups if d.walk == "xreg" else 0
    nsub = first.k // 32
    if xr and (smem := (nsub * QFUSED_PAD + (nsub + 31) // 32 * xr * 8) * 4) > 48 * 1024:
        attrs += ((f"rlx_qgemv_xr<{first.t}, {first.fmt}, {first.qk}, {first.qb}, {norm_c}, {epi}, {xr}>", str(smem)),)
    what = ", ".join(f"%{m}" for m in d.members) + "".join(
        f" + %{n}" for n in (*d.norm, *d.residual, *d.swiglu))
    args = DecodeGemvLaunch(
        comment=comment(f"{what}: one fused quantized GEMV in steps of <= {d.max_rows} rows"
                        + (" (int8 activations)" if act_arg else ""), 160),
        what=first.what, uses_lt=any(a.lt for a in large), smem_attrs=attrs, t=first.t, fmt=first.fmt,
        qk=first.qk, qb=first.qb,
        x=e.ptr(x), gamma=gamma, eps=eps, norm=norm_c, res=res, epi=epi, m=first.m,
        k=first.k, row_bytes=first.row_bytes, rows=ns[0] if epi == 2 else sum(ns), ws=tuple(a.w for a in large),
        ys=ys, ns=ns, max_rows=d.max_rows, large=large, act_arg=act_arg, xr_groups=xr,
        occ_rows=d.occ_rows if d.walk == "occ" else 0, occ_pf="true" if d.occ_prefetch else "false",
        occ_act=act_arg)
    return Kernel(node.id, "block_decode_gemv", TEMPLATE, args,
                  headers=_headers(first.act, any(a.mma for a in large), any(a.small_rows for a in large),
                                   args.occ_rows > 0),
                  header=args.comment,
                  label=node.label)


@RULES.register("dequant_matmul", accepts=_accepts)
def dequant_matmul(e: CudaEmitter, node: Node) -> Kernel:
    d = e.decode_gemv.get(node.id)
    if d is not None and d.members[0] == node.id:
        return _decode_gemv(e, node)
    args = _dequant_args(e, node)
    args = dataclasses.replace(args, smem_attrs=args.small_attrs)
    return Kernel(node.id, "block_dequant_matmul", TEMPLATE, args,
                  headers=_headers(args.act, args.mma, bool(args.small_rows)),
                  header=args.comment, label=node.label)


@RULES.register("dequantize", accepts=_accepts)
def dequantize(e: CudaEmitter, node: Node) -> Kernel:
    op: O.Dequantize = node.op  # type: ignore[assignment]
    x = e.node(node.inputs[0]).shape
    fmt = quant_format(op.quant)
    args = Dequantize(**e.base(node), t=e.ctype(node.id), fmt=FORMAT_IDS[fmt.name], qk=fmt.block_size,
                      qb=fmt.block_bytes, x=e.ptr(node.inputs[0]), y=e.ptr(node.id),
                      rows=e.numel(x.dims[:-1]), k=node.shape.dims[-1].value,
                      row_bytes=x.dims[-1].value)
    return Kernel(node.id, "block_dequantize", TEMPLATE, args, headers=(QUANT,), header=args.comment,
                  label=node.label)
