"""Decisions of the CUDA lowering (`rlx/opt/lowering_cuda.py`), recorded in the LIR.

The CUDA codegen reads these and nothing else about where bytes live on the
device or which GEMMs run together: the whole program lives in one
`cudaMalloc` whose byte layout is a `DeviceLayout`, and Q/K/V projections of
one activation may run as a single `GemmGroup`; quantized projections of a
decode step, with the norm before them and the add or SwiGLU after them, as a
single `DecodeGemv` launch, the rotary embedding of decode queries and keys
inside the attention kernel (`DecodeRope`), a decode step's keys split over
several blocks per query (`DecodeSplitKv`), a sentence-embedding pooling tail as one kernel (`PoolTail`),
and small all-reduces of a clique one-shot through the peers' memory (`AllReduceP2P`).

>>> g = GemmGroup(members=(3, 5), widths=(64, 64), k=32, weight_offset=0, bias_offset=-1, out_offset=8192)
>>> g.describe()[:72]
'%3 %5 run as one GEMM against a combined [32, 128] weight at byte 0; the'
>>> g.row_stride, g.column(5)
(128, 64)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlx.ir.decisions import Decision, register_decision


@dataclass(frozen=True)
class GemmGroup(Decision):
    """GEMMs reading one activation with their own [K, N_i] weights, run as one GEMM of [K, sum(N_i)].

    Each member's weight (and bias) param is stored as a column slice of the
    combined one (`weight_offset`, `bias_offset` are byte offsets of the
    combined tensors; -1: no bias); member i's output is the column slice
    starting `sum(widths[:i])` columns into the [M, sum(widths)] buffer at
    `out_offset`.
    """

    kind: ClassVar[str] = "cuda_gemm_group"
    members: tuple[int, ...]
    widths: tuple[int, ...]
    k: int
    weight_offset: int
    bias_offset: int
    out_offset: int

    @property
    def row_stride(self) -> int:
        return sum(self.widths)

    def column(self, member: int) -> int:
        """First column of `member`'s slice."""
        i = self.members.index(member)
        return sum(self.widths[:i])

    def describe(self) -> str:
        names = " ".join(f"%{m}" for m in self.members)
        return (f"{names} run as one GEMM against a combined [{self.k}, {self.row_stride}] weight at byte "
                f"{self.weight_offset}; their outputs are column slices (row stride {self.row_stride}) of one "
                f"buffer at byte {self.out_offset}")

    def nodes(self) -> tuple[int, ...]:
        return self.members


@dataclass(frozen=True)
class DecodeGemv(Decision):
    """Quantized GEMVs run as one launch when a step has at most `max_rows` rows of activations (decode).

    `members` are `dequant_matmul` nodes reading one activation (Q/K/V, or gate/up), scheduled one after
    another; in a decode step one kernel computes all their outputs, in a larger step each runs its own
    path. The kernel may also absorb, in decode steps only (their kernels then run in larger steps only):
    `norm` (0 or 1 node): the `rms_norm` that produced the activation — the kernel normalizes its input
    itself; `residual` (0 or 1 node): an add of the one member's output and another value — the kernel
    writes the sum into the add's output; `swiglu` (0 or 1 node): the region `silu(gate) * up` of two
    members — the kernel writes it directly.

    Walk "dense": `members` are float projections of an f16 / bf16 build instead (`matmul`s of one activation
    against 2-D params, or one `fused_swiglu`, whose gate and up weights the kernel reads together), whose
    one-row steps run rlx_dgemv (kernels/dense_gemv.cuh) over the weights as stored ([K, N] in the compute type);
    every member, and the absorbed nodes, run their own kernels in larger steps.
    """

    kind: ClassVar[str] = "cuda_decode_gemv"
    members: tuple[int, ...]
    max_rows: int
    norm: tuple[int, ...] = ()
    residual: tuple[int, ...] = ()
    swiglu: tuple[int, ...] = ()
    #: The one-row walk: "rows" (rlx_qgemv_fused, a warp walks RLX_QF_ROWS weight rows over all of K) or "xreg"
    #: (rlx_qgemv_xr: x held in registers per slab of 32 units, `xr_groups` groups of 8 weight rows a block) or
    #: "occ" (rlx_qgemv_occ: K split over a block's warps, each holding its slab's x in registers, `occ_rows`
    #: weight rows a warp's item, at most 64 registers for 2; `occ_prefetch`: the warp's next item into L2 too) or
    #: "dense" (rlx_dgemv: float members, the weights read as stored; `max_rows` 1).
    walk: str = "rows"
    xr_groups: int = 0
    occ_rows: int = 0
    occ_prefetch: bool = False
    #: "dense": the output columns a block's tile takes (8 .. 512, powers of 2); 0: chosen per launch, the widest whose
    #: tiles (times the K splits) fill the wave of resident blocks.
    dense_tile: int = 0
    #: "dense": the blocks K is split over (S; each sums whole steps of its K range into f32 partials in the scratch
    #: region, rlx_dgemv_reduce adds them in split order and applies the epilogue); 0: chosen per launch (at most
    #: `DENSE_GEMV_SPLIT_AUTO`), 1: no split (one kernel), n: forced.
    dense_split: int = 0
    #: The members' activations: "f32" or "q8" (int8 per block of 32, `quantize_act`: the "occ" walk quantizes each
    #: lane's x in registers and takes integer dot products, rlx_qgemv_occ's ACT = 1; the "rows" walk stages
    #: records, kernels/quant_q8.cuh).
    act: str = "f32"

    def describe(self) -> str:
        names = " ".join(f"%{m}" for m in self.members)
        walk = ""
        if self.walk == "xreg":
            walk = f", one-row steps x in registers ({self.xr_groups} x 8 weight rows a block)"
        elif self.walk == "occ":
            walk = (f", one-row steps K split over the warps ({self.occ_rows} weight rows an item"
                    + (", the next prefetched" if self.occ_prefetch else "")
                    + (", int8 activations quantized in registers)" if self.act == "q8" else ")"))
        elif self.walk == "dense":
            tile = f"tiles of {self.dense_tile} columns" if self.dense_tile else "column tiles sized per launch"
            split = ("K split over blocks (as many as chosen per launch) and over a block's threads"
                     if self.dense_split == 0 else "K split over a block's threads only" if self.dense_split == 1
                     else f"K split over {self.dense_split} blocks (partials added in split order) and over a block's "
                     "threads")
            walk = f", a dense 16-bit GEMV over the weights as stored ([K, N]: {tile}, {split})"
        extra = [f"normalizing its input (%{self.norm[0]})"] if self.norm else []
        extra += [f"adding the residual (%{self.residual[0]})"] if self.residual else []
        extra += [f"with the SwiGLU epilogue (%{self.swiglu[0]})"] if self.swiglu else []
        what = "float" if self.walk == "dense" else "quantized"
        if self.act == "q8" and self.walk != "occ":
            walk += ", int8 activations"
        return (f"{names} run as one {what} GEMV when a step has <= {self.max_rows} rows"
                + (", " + ", ".join(extra) if extra else "") + walk)

    def nodes(self) -> tuple[int, ...]:
        return self.members + self.norm + self.residual + self.swiglu


@dataclass(frozen=True)
class DecodeRope(Decision):
    """The rotary embeddings of a `cached_attention`'s queries and new keys applied inside its kernel when each row
    of a step holds at most `max_rows` tokens (decode, any number of rows): it reads the raw projections and the
    rope tables (over a paged cache the append kernel rotates the keys it stores, which other rows of the step
    read), and the two `rope` nodes run their own kernels in longer steps (prefill) only."""

    kind: ClassVar[str] = "cuda_decode_rope"
    attention: int
    ropes: tuple[int, int]
    max_rows: int

    def describe(self) -> str:
        return (f"%{self.ropes[0]} %{self.ropes[1]} (rope of the queries and keys) applied inside %{self.attention} "
                f"when a step's rows hold <= {self.max_rows} tokens each")

    def nodes(self) -> tuple[int, ...]:
        return (self.attention, *self.ropes)


@dataclass(frozen=True)
class SampleFromArgmax(Decision):
    """A `sample_top_k` whose logits an earlier `argmax` (last axis) also reads: at temperature 0 or top_k 1 —
    where the sample is that argmax, by the same order (ties to the lower index, NaN first) — its kernel copies the
    argmax's ids instead of scanning the logits again (a decoder's greedy step runs both, and reads the argmax).

    >>> SampleFromArgmax(9, 8).describe()
    '%9 (sample_top_k) at temperature 0 or top_k 1 copies the ids of %8 (argmax of the same logits)'
    """

    kind: ClassVar[str] = "cuda_sample_from_argmax"
    sample: int
    argmax: int

    def describe(self) -> str:
        return (f"%{self.sample} (sample_top_k) at temperature 0 or top_k 1 copies the ids of %{self.argmax} "
                f"(argmax of the same logits)")

    def nodes(self) -> tuple[int, ...]:
        return (self.sample,)


@dataclass(frozen=True)
class QuantMma(Decision):
    """A quantized projection (`dequant_matmul`, f16 / bf16) whose steps of `min_rows`..`max_rows` rows multiply
    its blocks on the tensor cores: dequantized in registers straight into mma fragments, the weights read once
    (`rlx_qmma`, templates/cuda/kernels/quant_mma.cuh). Fewer rows take the GEMVs (the fused `DecodeGemv` where
    one holds the node first), more rows dequantize the weight into scratch for a GEMM."""

    kind: ClassVar[str] = "cuda_quant_mma"
    node: int
    min_rows: int
    max_rows: int

    def describe(self) -> str:
        return (f"%{self.node} multiplies its blocks on the tensor cores (rlx_qmma) in steps of {self.min_rows} to "
                f"{self.max_rows} rows")

    def nodes(self) -> tuple[int, ...]:
        return (self.node,)


@dataclass(frozen=True)
class DequantCopy(Decision):
    """A quantized weight param (`weight`, param slot `slot`) that also keeps a copy dequantized into the compute
    type ([N, K], `nbytes` at byte `offset` of the params region), written by `rlx_set_param` when the blocks
    arrive. The `readers` (`dequant_matmul` nodes whose steps can outgrow their GEMVs and `rlx_qmma`) multiply
    that copy on the GEMM in every step of at least `min_rows[i]` rows (past the fused decode GEMV; ahead of
    `rlx_qmma`, which the copy's GEMM beat on SmolLM2's weights from 8 rows on), where a large step would
    otherwise dequantize the weight again into scratch: one GEMM launch instead of a dequantize kernel and a GEMM
    per tile of the weight. Chosen in schedule order while the copies fit the target's byte budget
    (`CudaTarget.dequant_copies`, RLX_CUDA_DEQUANT_COPIES)."""

    kind: ClassVar[str] = "cuda_dequant_copy"
    weight: int
    slot: int
    readers: tuple[int, ...]
    quant: str
    n: int
    k: int
    offset: int
    nbytes: int
    min_rows: tuple[int, ...]
    #: Residual adds (each of a reader's `DecodeGemv`) that the copy's GEMM writes itself, the add's other input as
    #: its C operand (cuBLASLt, beta = 1): their own kernels then never run (the fused GEMV does the smaller steps).
    adds: tuple[int, ...] = ()

    def describe(self) -> str:
        names = ", ".join(f"%{r} in steps of >= {m} rows" for r, m in zip(self.readers, self.min_rows))
        adds = f", adding the residual of {' '.join(f'%{a}' for a in self.adds)} in the GEMM" if self.adds else ""
        return (f"%{self.weight} ({self.quant} [{self.n}, {self.k}], param {self.slot}) keeps a dequantized copy of "
                f"{self.nbytes} bytes at byte {self.offset}, written at set_param; GEMMs on it: {names}{adds}")

    def nodes(self) -> tuple[int, ...]:
        return (self.weight, *self.readers, *self.adds)


@dataclass(frozen=True)
class AllReduceP2P(Decision):
    """An `all_reduce` (sum) of a CUDA clique whose calls of at most `max_bytes` bytes run one-shot through the
    peers' memory (`rlx_all_reduce_p2p`, kernels/collectives.cuh): each rank stores its values into every rank's
    exchange buffer (CUDA IPC mappings over NVLink / PCIe made when the context joins the clique), raises a flag
    there and sums the `world` slots in rank order once every flag is up: one small kernel instead of NCCL's ring
    protocol, and launched with programmatic dependent launch, so the next projection fetches its weights while
    the ranks meet. Larger calls, and cliques whose GPUs cannot map each other's memory (every rank agrees when
    it joins), call NCCL. `residual` (0 or 1 node): the add of the sum and another value that is the sum's one
    reader (a row-parallel projection's residual): a one-shot call writes the add's output itself, and the add's
    own kernel runs only when NCCL summed. `gemv` (0 or 1 node): the row-parallel projection whose one-row dense
    GEMV (a `DecodeGemv` of walk "dense", one member that may split K, its output read by the sum only) makes the
    sum in one-row steps: its split reduce, rlx_dgemv_reduce_ar (kernels/dense_gemv_ar.cuh), adds a column's splits,
    exchanges the row with the other ranks block by block and adds the ranks: the bits of the split GEMV's reduce
    then the one-shot sum, without the all-reduce's own kernel.

    >>> AllReduceP2P(12, 2, 131072).describe()[:62]
    "%12 sums over 2 ranks through the peers' memory (one-shot, ran"
    >>> AllReduceP2P(12, 2, 131072, gemv=(10,)).describe()[-43:]
    'made by the reduce of the dense GEMV of %10'
    """

    kind: ClassVar[str] = "cuda_all_reduce_p2p"
    node: int
    world: int
    max_bytes: int
    residual: tuple[int, ...] = ()
    gemv: tuple[int, ...] = ()

    def describe(self) -> str:
        add = (f", adding it to the other input of %{self.residual[0]} (whose own kernel then does not run)"
               if self.residual else "")
        made = f"; in one-row steps made by the reduce of the dense GEMV of %{self.gemv[0]}" if self.gemv else ""
        return (f"%{self.node} sums over {self.world} ranks through the peers' memory (one-shot, rank order) when a "
                f"call has <= {self.max_bytes} bytes{add}; NCCL otherwise{made}")

    def nodes(self) -> tuple[int, ...]:
        return (self.node, *self.residual, *self.gemv)


@dataclass(frozen=True)
class DecodeSplitKv(Decision):
    """Flash-decoding for a `cached_attention`: in steps of at most `max_rows` rows (decode), a query's keys are
    split over up to `max_splits` blocks of at least `split_keys` keys each (decided per launch from the query's
    past), since one block per (row, head) leaves most of the GPU idle once the past is long. The blocks' partial
    maxima, sums and outputs go to the scratch region; the last block of a query merges them, counted in the
    `counters` region of the `DeviceLayout`.

    `grouped`: steps whose rows hold at most `row_tokens` tokens each (decode, any number of rows; contiguous or
    paged caches) run rlx_kv_decode (kernels/kv_decode.cuh): one block per (query, KV head) computes all `group`
    query heads of its KV head (each cached K/V row read once for them), reading rows in 16-byte loads (`lanes`
    lanes per row); `max_splits` then comes from the keys a query can see (the capacity, or the window) and from
    `sms`, the SM count the split blocks are to fill, `blocks_per_sm` blocks each (the kernel's register bound: 4
    where a lane's `group` x head-dim slice is small, else 2); steps of more than `max_rows` rows do not split
    (they fill the GPU with rows). Otherwise (a head dim the loads cannot tile, more than 8 query heads per KV
    head) rlx_kv_attend runs them, a block per (query, head). `reason`, when set, says why they stay on
    rlx_kv_attend; such a decision is recorded even with `max_splits` 1. `stores_rows` (grouped, over a paged cache
    with the distinct-rows hint): in steps whose hint says the rows are distinct sequences, rlx_kv_decode stores
    each row's new keys and values itself, as over a contiguous cache, and no append launch runs before it.

    >>> DecodeSplitKv(7, 64, 64, 4, grouped=True, row_tokens=4, group=3, lanes=8, sms=132).describe()[:74]
    '%7 steps of <= 4 tokens a row: rlx_kv_decode, a block per (query, KV head)'
    """

    kind: ClassVar[str] = "cuda_decode_split_kv"
    attention: int
    max_splits: int
    split_keys: int
    max_rows: int
    grouped: bool = False
    group: int = 1
    lanes: int = 0
    sms: int = 0
    reason: str = ""
    blocks_per_sm: int = 2
    row_tokens: int = 0
    stores_rows: bool = False

    def describe(self) -> str:
        stores = ("; steps of distinct sequences (the distinct-rows hint) store each row's keys in its block, no "
                  "append launch" if self.stores_rows else "")
        if self.reason:
            split = (f"a query's keys split over up to {self.max_splits} blocks of >= {self.split_keys} keys"
                     if self.max_splits > 1 else "keys not split")
            return (f"%{self.attention} decode steps (<= {self.max_rows} rows) on rlx_kv_attend, {split}: "
                    f"{self.reason}")
        if self.grouped:
            return (f"%{self.attention} steps of <= {self.row_tokens} tokens a row: rlx_kv_decode, a block per (query, "
                    f"KV head) for its {self.group} query heads, K/V rows in 16-byte loads ({self.lanes} lanes a row); "
                    f"in steps of <= {self.max_rows} rows a query's keys split over up to {self.max_splits} blocks of "
                    f">= {self.split_keys} keys (sized for {self.sms} SMs x {self.blocks_per_sm} blocks; partials in "
                    f"scratch, merged by the last block){stores}")
        return (f"%{self.attention} splits a query's keys over up to {self.max_splits} blocks of >= {self.split_keys} "
                f"keys when a step has <= {self.max_rows} rows (partials in scratch, merged by the last block)")

    def nodes(self) -> tuple[int, ...]:
        return (self.attention,)


@dataclass(frozen=True)
class PoolTail(Decision):
    """A sentence-embedding tail run as one kernel: the masked mean over the sequence of `hidden` ([B, S, H])
    weighted by `mask` ([B, S]), `sum(mask * h) / max(sum(mask), eps_count)`, then (when `normalized`) divided by
    `max(||.||_2, eps_norm)`. `absorbed` are the tail's nodes (reshapes, the [B,1,S] x [B,S,H] product, the
    reductions and divisions), scheduled back to back: they render no code, and `out` (the last of them) is
    written by the kernel. `abi_output` >= 0: `out` is that graph output and the kernel writes it in its ABI
    dtype straight into the output's staging copy (no conversion pass after it); -1: into `out`'s buffer.
    `norm` (0 or 1 node): the layer / RMS norm that produces `hidden`, read by the tail alone: in steps whose
    sentences have at most `norm_max_seq` tokens the kernel normalizes the norm's inputs itself and the norm's own
    kernel does not run (one dependent launch fewer at the end of a short step)."""

    kind: ClassVar[str] = "cuda_pool_tail"
    hidden: int
    mask: int
    out: int
    absorbed: tuple[int, ...]
    normalized: bool
    eps_count: float
    eps_norm: float
    abi_output: int = -1
    norm: tuple[int, ...] = ()
    norm_max_seq: int = 0

    def describe(self) -> str:
        what = "masked mean + L2 normalization" if self.normalized else "masked mean"
        into = f", output {self.abi_output} written in its ABI dtype" if self.abi_output >= 0 else ""
        norm = (f"; normalizes %{self.norm[0]}'s inputs itself when seq <= {self.norm_max_seq} (%{self.norm[0]}'s "
                "kernel runs only for longer sentences)" if self.norm else "")
        return (f"%{self.out} = {what} of %{self.hidden} over the sequence (mask %{self.mask}) in one kernel; "
                f"absorbs {' '.join(f'%{n}' for n in self.absorbed)}{into}{norm}")

    def nodes(self) -> tuple[int, ...]:
        return (self.hidden, self.mask, self.out, *self.absorbed, *self.norm)


@dataclass(frozen=True)
class ParamPlacement:
    """Where param slot i lives: byte `offset`, stored with `row_stride` (0: dense) and `staged` at set_param
    (uploaded to the arena, then permuted / converted / scattered on the device)."""

    offset: int
    row_stride: int = 0
    staged: bool = False


@dataclass(frozen=True)
class Staged:
    """An input or output: `dev` holds it in the device dtype, `staging` in the ABI dtype (equal: no conversion)."""

    dev: int
    staging: int


@dataclass(frozen=True)
class Region:
    name: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class DeviceLayout(Decision):
    """The byte layout of the one device allocation, in allocation order.

    params (then the QKV group outputs, so `rlx_clone` copies `params_end` bytes of params only), constants,
    inputs and outputs (with their ABI-dtype staging copies), the arena (also set_param's staging area),
    scratch (SwiGLU's up projection, split-KV attention partials), the cuBLASLt workspace, the error flag, the
    split attention's counters.
    `precision` and `gemm` are the options it was planned for (codegen refuses another target).
    """

    kind: ClassVar[str] = "cuda_device_layout"
    precision: str
    gemm: str
    total: int
    params_end: int
    regions: tuple[Region, ...]
    params: tuple[ParamPlacement, ...]
    constants: tuple[int, ...]
    inputs: tuple[Staged, ...]
    outputs: tuple[Staged, ...]
    arena: int
    scratch: int
    workspace: int
    workspace_bytes: int
    flag: int
    #: Per-query block counters of split attention (`DecodeSplitKv`): zeroed once at rlx_create, and every
    #: kernel that counts in them leaves them zero.
    counters: int = 0
    counters_bytes: int = 0

    @property
    def uses_lt(self) -> bool:
        """True when some GEMM runs on cuBLASLt (only then is there a workspace)."""
        return self.workspace_bytes > 0

    def describe(self) -> str:
        spans = ", ".join(f"{r.name} {r.offset}+{r.nbytes}" for r in self.regions)
        return (f"device memory ({self.precision}, gemm {self.gemm}): one allocation of {self.total} bytes: "
                f"{spans}")


@dataclass(frozen=True)
class ScanConstants(Decision):
    """Where the constants of `node`'s body number `body` live on the device (byte offsets, in the body's
    constant order). The bodies of a node are `rlx.ir.ops_control.step_bodies`' (a scan's one; a cond's true
    then false branch; a while_loop's cond then body).

    A body is rendered inside its node's loop or branch (`rlx.codegen.cuda.scan`, `rlx.codegen.cuda.control`);
    its constants are uploaded with the graph's own at `rlx_create`, in the constants region.
    """

    kind: ClassVar[str] = "cuda_scan_constants"
    node: int
    offsets: tuple[int, ...]
    body: int = 0

    def describe(self) -> str:
        which = f" {self.body}" if self.body else ""
        return f"%{self.node} body{which} constants at bytes {list(self.offsets)}"

    def nodes(self) -> tuple[int, ...]:
        return (self.node,)


@dataclass(frozen=True)
class ControlFlow(Decision):
    """How `node`, a cond or a while_loop (`op`), runs on CUDA (`rlx.codegen.cuda.control`).

    `how` is "branch" (a cond: only the branch its device predicate picks runs) or "loop" (a while_loop: the
    body runs while its device predicate holds): under CUDA Graph capture as conditional graph nodes (an IF node
    per branch, a WHILE node) whose handles a one-thread kernel sets from the predicate, so the captured graph
    replays with the branching inside it; an eager run (the first run of each dims, or every run when capture
    is off) reads the predicate back into pinned memory and branches on the host. `reason` is empty then.

    For a node the rule could not take, `how` names the fallback of `rlx.opt.control` ("select": both branches
    ran and a `where` chose; "masked scan": max_trips masked steps) and `reason` says why; `node` is then the
    fallback's node (the masked scan), or -1 where none is left to point at (a select fused away).
    """

    kind: ClassVar[str] = "cuda_control_flow"
    node: int
    op: str
    how: str
    reason: str = ""

    def describe(self) -> str:
        where = f"%{self.node} " if self.node >= 0 else ""
        if not self.reason:
            what = "only the taken branch runs" if self.how == "branch" else "the body runs while the predicate holds"
            return (f"{where}{self.op} runs on the device predicate ({what}): conditional graph nodes under "
                    f"CUDA Graph capture, a host read of the predicate when eager")
        return f"{where}{self.op} lowered to a {self.how}: {self.reason}"

    def nodes(self) -> tuple[int, ...]:
        return (self.node,) if self.node >= 0 else ()


register_decision(GemmGroup, ("members",))
register_decision(ScanConstants, ("node",))
register_decision(ControlFlow, ("node",))
register_decision(DecodeGemv, ("members", "norm", "residual", "swiglu"))
register_decision(DecodeRope, ("attention", "ropes"))
register_decision(SampleFromArgmax, ("sample", "argmax"))
register_decision(QuantMma, ("node",))
register_decision(DequantCopy, ("weight", "readers", "adds"))
register_decision(DecodeSplitKv, ("attention",))
register_decision(AllReduceP2P, ("node", "residual", "gemv"))
register_decision(PoolTail, ("hidden", "mask", "out", "absorbed", "norm"))
register_decision(DeviceLayout, ())
