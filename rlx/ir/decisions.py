"""Backend lowering decisions recorded in the LIR.

Passes in `rlx/opt/lowering.py` decide, per backend, how params are stored,
which transposes fold into GEMMs, which GEMMs run together; each decision is
a frozen record here. They are part of the LIR: hashed into its canonical
form, printed by `LirModule.inspect()` (`rlxc inspect --stage lir`), and the
only place a backend's codegen reads such choices from — codegen decides
nothing on its own.

>>> PackedParam(node=3, transposed=False).describe()
'%3 param stored packed for the GEMM kernel (K x N panels)'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Decision:
    """Base of every decision: a `kind` tag, JSON for the hash, one readable line."""

    kind: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def nodes(self) -> tuple[int, ...]:
        """Node ids this decision mentions (renumbered by the canonical form)."""
        return ()


@dataclass(frozen=True)
class AbsorbedTranspose(Decision):
    """A transpose of the last two axes read only by GEMMs: they read `source` with a transpose flag."""

    kind: ClassVar[str] = "absorbed_transpose"
    node: int
    source: int

    def describe(self) -> str:
        return f"%{self.node} transpose folded into the GEMMs that read it (they read %{self.source} transposed)"

    def nodes(self) -> tuple[int, ...]:
        return (self.node, self.source)


@dataclass(frozen=True)
class PackedParam(Decision):
    """A param read only as the right GEMM operand, stored in the packed-panel layout at `set_param`.

    `transposed`: the GEMMs read the param's transpose (through an absorbed transpose).
    """

    kind: ClassVar[str] = "packed_param"
    node: int
    transposed: bool

    def describe(self) -> str:
        orient = "N x K, transposed" if self.transposed else "K x N"
        return f"%{self.node} param stored packed for the GEMM kernel ({orient} panels)"

    def nodes(self) -> tuple[int, ...]:
        return (self.node,)


@dataclass(frozen=True)
class WidenedParam(Decision):
    """An f16/bf16 param whose only reader is one cast to f32 (a bias or norm gain of a narrow-stored
    graph): `set_param` stores it widened (exact), and the cast reads that copy instead of running
    on every call."""

    kind: ClassVar[str] = "widened_param"
    node: int
    cast: int

    def describe(self) -> str:
        return (f"%{self.node} param widened to f32 once at set_param "
                f"(%{self.cast}, its cast, reads it: no per-call cast)")

    def nodes(self) -> tuple[int, ...]:
        return (self.node, self.cast)


@dataclass(frozen=True)
class ResidentTable(Decision):
    """A param read only by gathers of many rows a run (an embedding table: MiniLM's 30522 x 384 f32, up to 1024
    rows a batch of 8 x 128). Bound in place from a read-only array (`set_param`), it is read there until the first
    run whose gathers read `min_rows` rows or more, which copies it into the context's own slot (2 MiB pages,
    `MADV_HUGEPAGE`) before its kernels; that run and every later one read the copy. A table mapped from a weights
    file lies on the page cache's 4 KiB pages, and gathered rows are pages apart: each one a TLB miss whose page
    walk (two-dimensional in a virtual machine) finds its entries evicted by the call's GEMMs (MiniLM 8 x 128 on a
    2-core KVM guest: the word-embedding gather 1-5 ms a call in place on a busy host, 0.2-0.5 quiet, 0.13 from the
    copy). A warm start
    embedding a sentence or two keeps the table in place (no 47 MB copy: ~20 ms of page faults and memcpy).

    >>> print(ResidentTable(node=4, gathers=(5,), rows=1024, min_rows=64).describe())
    %4 param copied into the context's 2 MiB pages by the first run gathering >= 64 rows (%5 gathers up to 1024 a run)
    """

    kind: ClassVar[str] = "resident_table"
    node: int
    gathers: tuple[int, ...]
    rows: int  # the most rows the gathers read in one run
    min_rows: int  # a run gathering this many rows or more copies the table first

    def describe(self) -> str:
        readers = ", ".join(f"%{g}" for g in self.gathers)
        return (f"%{self.node} param copied into the context's 2 MiB pages by the first run gathering >= "
                f"{self.min_rows} rows ({readers} gather{'s' if len(self.gathers) == 1 else ''} up to "
                f"{self.rows} a run)")

    def nodes(self) -> tuple[int, ...]:
        return (self.node, *self.gathers)


@dataclass(frozen=True)
class AttentionPlan(Decision):
    """How the CPU computes one `attention` node. ``blocks``: a task (batch row, kv head) packs K^T and V into its
    scratch, and each block of query rows takes its scores, softmax and weighted sum of V as three passes over a
    64-row score tile. ``rows`` (AVX-512, heads of a multiple of 32, no mask or a padding mask): the task packs K^T
    only, and `rlx_attn_rows` (kernels/packed_core.c) takes each group of 12 query rows through its scores (scaled
    by scale log2(e), masked and their maxima taken at the tile's store), powers of 2 (`rlx_exp2_16_nonpos`, two rows
    at a time, each row's sum in 16 float lanes) and weighted sum of V (read in place, scaled by 1 / sum at its
    store) while the group's scores stay in L1; the products of ``blocks`` in the same order, its softmax (exp by
    `rlx_expf`, sums in double) to within a few float ulps of each weight.

    >>> AttentionPlan(node=7, form="rows").describe()
    '%7 attention: rows (scores, 2^x softmax (float sums), P V per 12-row group in L1; K^T packed, V in place)'
    """

    kind: ClassVar[str] = "attention_plan"
    node: int
    form: str

    def describe(self) -> str:
        how = ("scores, 2^x softmax (float sums), P V per 12-row group in L1; K^T packed, V in place"
               if self.form == "rows" else "scores, softmax and weighted sum per 64-row block; K^T and V packed")
        return f"%{self.node} attention: {self.form} ({how})"

    def nodes(self) -> tuple[int, ...]:
        return (self.node,)


@dataclass(frozen=True)
class GemmSiblings(Decision):
    """Consecutive GEMMs of one input and packed weights of one shape (a layer's query, key and value projections)
    run as one parallel region: the tiles of every member in one pool, split and stolen as the tiles of one product
    of len(members) x N columns (the members' panels side by side, each row block's tiles of every member
    together), each tile computed as alone (the same values). The first member renders the region; the others run
    no code of their own.

    >>> print(GemmSiblings(members=(17, 20, 23)).describe())  # doctest: +NORMALIZE_WHITESPACE
    %17, %20, %23 GEMMs of one input as one parallel region
    (one pool of their tiles; %20, %23 run no code of their own)
    """

    kind: ClassVar[str] = "gemm_siblings"
    members: tuple[int, ...]

    def describe(self) -> str:
        names = ", ".join(f"%{m}" for m in self.members)
        rest = ", ".join(f"%{m}" for m in self.members[1:])
        return (f"{names} GEMMs of one input as one parallel region "
                f"(one pool of their tiles; {rest} run no code of their own)")

    def nodes(self) -> tuple[int, ...]:
        return self.members


@dataclass(frozen=True)
class HugePageArena(Decision):
    """The CPU context's arena (every intermediate value, `arena_bytes` of them) is advised 2 MiB pages
    (`MADV_HUGEPAGE`, after dropping what earlier runs faulted in as 4 KiB pages: nothing in it outlives a run) by
    the first run whose share of it reaches `run_bytes`: the arena times the product of the run's dynamic dims over
    their bounds'. Such a run walks more 4 KiB pages than the TLB holds beside the weights' (the GEMMs' row blocks
    and C tiles, rows up to KiBs apart); a smaller run stays on 4 KiB pages, since a huge page is zeroed whole the
    first time it is touched (a 1 x 16 MiniLM run on a 32 x 256 graph's arena: 4 -> 38 ms for its first run when
    the arena was advised at the context's start).

    >>> HugePageArena(arena_bytes=9441280, run_bytes=8 << 20).describe()
    'arena of 9.0 MiB in 2 MiB pages (MADV_HUGEPAGE) from the first run using 8.0 MiB of it'
    """

    kind: ClassVar[str] = "huge_page_arena"
    arena_bytes: int
    run_bytes: int

    def describe(self) -> str:
        return (f"arena of {self.arena_bytes / 2**20:.1f} MiB in 2 MiB pages (MADV_HUGEPAGE) "
                f"from the first run using {self.run_bytes / 2**20:.1f} MiB of it")


def decisions_to_json(decisions: tuple[Decision, ...], ref: Any) -> list[dict[str, Any]]:
    """Canonical JSON of `decisions` with node ids mapped through `ref` (for the LIR hash)."""
    out = []
    for d in decisions:
        doc = d.to_json()
        for key, value in list(doc.items()):
            if key in _NODE_FIELDS.get(d.kind, ()):
                doc[key] = [ref(v) for v in value] if isinstance(value, (list, tuple)) else ref(value)
        out.append(doc)
    return out


#: Which fields of each decision kind hold node ids (renumbered in the canonical form).
_NODE_FIELDS: dict[str, tuple[str, ...]] = {}
#: The record class of each decision kind (what `rlx.ir.serialize_lir` rebuilds a decision as).
DECISION_KINDS: dict[str, type[Decision]] = {}


def register_decision(cls: type[Decision], node_fields: tuple[str, ...] = ()) -> type[Decision]:
    """Declare a decision record: its class (by `cls.kind`) and which of its fields hold node ids.

    Every decision kind is registered where it is defined; a kind registered twice with another class is a bug.
    """
    if not cls.kind:
        raise ValueError(f"{cls.__name__} has no decision kind")
    known = DECISION_KINDS.get(cls.kind)
    if known is not None and known is not cls:
        raise ValueError(f"decision kind {cls.kind!r} is taken by {known.__name__}")
    DECISION_KINDS[cls.kind] = cls
    _NODE_FIELDS[cls.kind] = node_fields
    return cls


register_decision(AbsorbedTranspose, ("node", "source"))
register_decision(PackedParam, ("node",))
register_decision(WidenedParam, ("node", "cast"))
register_decision(ResidentTable, ("node", "gathers"))
register_decision(AttentionPlan, ("node",))
register_decision(GemmSiblings, ("members",))
register_decision(HugePageArena)
