"""A sparse mixture-of-experts feed-forward block (Mixtral, Qwen3-MoE, Qwen3-Next) built from MoE ops.

`moe_block(g, x, config, prefix)` adds to graph `g` the block transformers computes in
`MixtralSparseMoeBlock` / `Qwen3MoeSparseMoeBlock` / `Qwen3NextSparseMoeBlock`, as compiler ops, not a
Python loop over experts:

- router logits ``x @ gate^T`` (`[T, E]`), then `Graph.moe_router`: the `top_k` experts of each token and
  their softmax probabilities, renormalized when `config.normalize` (Mixtral always; Qwen3-MoE and
  Qwen3-Next as `norm_topk_prob` says);
- the chosen experts' SwiGLU: one `moe_matmul` over `gate_up_proj` `[E, 2I, H]` (gate rows first, as
  transformers' `chunk(2)`), ``silu(gate) * up``, one `moe_matmul` over `down_proj` `[E, H, I]`;
- the weighted sum over the chosen experts;
- with `config.shared_intermediate_size` (Qwen3-Next) a dense SwiGLU expert scaled by
  ``sigmoid(x @ shared_expert_gate^T)``, added.

Weights are params named as in transformers (`param_shapes` lists them with their shapes and dtypes),
laid out as transformers holds them in memory (`[out, in]` matrices; the router's and the shared
expert's transposes are folded into their GEMMs by the lowering), so a loader fills them without copies.
With `config.quant` the two expert tensors are u8 GGUF blocks `[E, N, row_bytes]` of the same matrices
(`quantize_experts`).

>>> import rlx
>>> g = rlx.Graph("moe")
>>> x = g.input("x", [1, 3, 16])
>>> cfg = MoeConfig(hidden_size=16, num_experts=4, top_k=2, intermediate_size=8, normalize=True)
>>> y = moe_block(g, x, cfg, "mlp")
>>> str(g.shape(y))
'f32[1,3,16]'
>>> sorted(param_shapes(cfg, "mlp"))
['mlp.experts.down_proj', 'mlp.experts.gate_up_proj', 'mlp.gate.weight']
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from rlx.errors import IRError
from rlx.ir.dtype import BFLOAT16
from rlx.ir.graph import Graph, NodeId
from rlx.ir.quant import QUANT_FORMATS, quantize, row_bytes
from rlx.ir.shape import product

#: Float dtypes the expert weights may be stored in (the router and shared expert stay f32).
EXPERT_DTYPES = ("f32", "f16", "bf16")
_NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": BFLOAT16}
#: One expert's (gate, up, down) matrices in Hugging Face checkpoints, under the block's prefix on disk
#: (Mixtral: `model.layers.N.block_sparse_moe`; Qwen3-MoE and Qwen3-Next: `model.layers.N.mlp`), as
#: transformers' `save_pretrained` writes them (it stacks them into `experts.gate_up_proj` / `experts.down_proj`
#: only in memory).
CHECKPOINT_EXPERTS = {
    "mixtral": ("experts.{e}.w1.weight", "experts.{e}.w3.weight", "experts.{e}.w2.weight"),
    "qwen3_moe": ("experts.{e}.gate_proj.weight", "experts.{e}.up_proj.weight", "experts.{e}.down_proj.weight"),
}


@dataclass(frozen=True)
class MoeConfig:
    """The shape of one sparse MoE block (fields named after transformers' configs where they exist).

    `intermediate_size` is each routed expert's (`moe_intermediate_size` in Qwen3-MoE,
    `intermediate_size` in Mixtral); `shared_intermediate_size` is Qwen3-Next's
    `shared_expert_intermediate_size` (0: no shared expert). `quant` stores the routed experts in a
    GGUF block format; otherwise `expert_dtype` (f32, f16 or bf16).
    """

    hidden_size: int
    num_experts: int
    top_k: int
    intermediate_size: int
    normalize: bool
    shared_intermediate_size: int = 0
    quant: str | None = None
    expert_dtype: str = "f32"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_experts", "top_k", "intermediate_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise IRError(f"MoeConfig {name} must be an int >= 1, got {v!r}")
        if self.top_k > self.num_experts:
            raise IRError(f"MoeConfig top_k={self.top_k} is more than num_experts={self.num_experts}")
        if self.quant is not None and self.quant not in QUANT_FORMATS:
            raise IRError(f"MoeConfig quant {self.quant!r} is not one of {sorted(QUANT_FORMATS)}")
        if self.expert_dtype not in EXPERT_DTYPES:
            raise IRError(f"MoeConfig expert_dtype {self.expert_dtype!r} is not one of {EXPERT_DTYPES}")

    @classmethod
    def mixtral(cls, hf: object, **kw: object) -> MoeConfig:
        """From a transformers `MixtralConfig` (or its `config.json` as an object): renormalized top-k."""
        return cls(hf.hidden_size, hf.num_local_experts, hf.num_experts_per_tok,  # type: ignore[attr-defined]
                   hf.intermediate_size, True, **kw)  # type: ignore[attr-defined,arg-type]

    @classmethod
    def qwen3_moe(cls, hf: object, **kw: object) -> MoeConfig:
        """From a transformers `Qwen3MoeConfig` or `Qwen3NextConfig` (with its shared expert)."""
        shared = getattr(hf, "shared_expert_intermediate_size", 0) or 0
        return cls(hf.hidden_size, hf.num_experts, hf.num_experts_per_tok,  # type: ignore[attr-defined]
                   hf.moe_intermediate_size, bool(hf.norm_topk_prob),  # type: ignore[attr-defined]
                   shared_intermediate_size=shared, **kw)  # type: ignore[arg-type]


def param_shapes(config: MoeConfig, prefix: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """name → (shape, dtype) of every param `moe_block(..., prefix)` declares (transformers' names)."""
    h, e, i = config.hidden_size, config.num_experts, config.intermediate_size
    if config.quant is None:
        gate_up, down, wd = (e, 2 * i, h), (e, h, i), config.expert_dtype
    else:
        gate_up, down, wd = (e, 2 * i, row_bytes(config.quant, h)), (e, h, row_bytes(config.quant, i)), "u8"
    shapes = {f"{prefix}.gate.weight": ((e, h), "f32"), f"{prefix}.experts.gate_up_proj": (gate_up, wd),
              f"{prefix}.experts.down_proj": (down, wd)}
    s = config.shared_intermediate_size
    if s:
        shapes.update({f"{prefix}.shared_expert.gate_proj.weight": ((s, h), "f32"),
                       f"{prefix}.shared_expert.up_proj.weight": ((s, h), "f32"),
                       f"{prefix}.shared_expert.down_proj.weight": ((h, s), "f32"),
                       f"{prefix}.shared_expert_gate.weight": ((1, h), "f32")})
    return shapes


def quantize_experts(weights: np.ndarray, quant: str) -> np.ndarray:
    """f32 expert matrices `[E, N, K]` → u8 GGUF blocks `[E, N, row_bytes]` (the `gguf` package's quantizer)."""
    w = np.asarray(weights, dtype=np.float32)
    if w.ndim != 3:
        raise IRError(f"expert weights must be [experts, N, K], got shape {w.shape}")
    return quantize(w, quant)


def _linear_t(g: Graph, x: NodeId, w: NodeId) -> NodeId:
    """x @ w^T for a param w `[out, in]` (the transpose is folded into the GEMM)."""
    return g.matmul(x, g.transpose(w, [1, 0]))


def moe_block(g: Graph, x: NodeId, config: MoeConfig, prefix: str) -> NodeId:
    """The sparse MoE feed-forward of x `[..., hidden]` (see the module docstring); same shape as x."""
    xs = g.shape(x)
    h, k, i = config.hidden_size, config.top_k, config.intermediate_size
    if xs.dims[-1].value != h or not xs.dims[-1].is_static:
        raise IRError(f"moe_block input {xs} must end in hidden_size {h}")
    params = {name: g.param(name, list(shape), dtype) for name, (shape, dtype) in param_shapes(config, prefix).items()}
    tokens = product(xs.dims[:-1])
    flat = g.reshape(x, [tokens, h])
    logits = _linear_t(g, flat, params[f"{prefix}.gate.weight"])
    ids, weights = g.moe_router(logits, top_k=k, normalize=config.normalize)
    gate_up = g.moe_matmul(flat, ids, params[f"{prefix}.experts.gate_up_proj"], quant=config.quant)
    act = g.mul(g.activation("silu", g.narrow(gate_up, 2, 0, i)), g.narrow(gate_up, 2, i, i))
    down = g.moe_matmul(act, ids, params[f"{prefix}.experts.down_proj"], quant=config.quant)
    out = g.reduce("sum", g.mul(down, g.reshape(weights, [tokens, k, 1])), axes=[1])
    if config.shared_intermediate_size:
        sp = f"{prefix}.shared_expert"
        sg = _linear_t(g, flat, params[f"{sp}.gate_proj.weight"])
        su = _linear_t(g, flat, params[f"{sp}.up_proj.weight"])
        shared = _linear_t(g, g.mul(g.activation("silu", sg), su), params[f"{sp}.down_proj.weight"])
        scale = g.activation("sigmoid", _linear_t(g, flat, params[f"{prefix}.shared_expert_gate.weight"]))
        out = g.add_(out, g.mul(scale, shared))
    return g.reshape(out, xs.dims)


def checkpoint_params(read: Callable[[str], np.ndarray], names: Collection[str], config: MoeConfig, disk_prefix: str,
                      prefix: str, family: str) -> dict[str, np.ndarray]:
    """The params of `moe_block(g, x, config, prefix)` from a checkpoint's tensors under `disk_prefix`.

    `read(name)` returns a checkpoint tensor (e.g. `safe_open(...).get_tensor`) of those in `names`
    (its `keys()`); `family` is "mixtral" or "qwen3_moe" (Qwen3-Next too), naming the per-expert
    matrices (`CHECKPOINT_EXPERTS`). Each expert's gate and up matrices are stacked into
    `experts.gate_up_proj` `[E, 2I, H]` (gate rows first), its down matrices into `experts.down_proj`
    `[E, H, I]`: one copy, in `config.expert_dtype`, or GGUF blocks with `config.quant`. A checkpoint
    already holding the stacked tensors is read as is. The router and the shared expert are returned
    as stored (as f32). A missing tensor, or a shape that disagrees with `config`, raises IRError
    naming the tensor and the expected shape.
    """
    if family not in CHECKPOINT_EXPERTS:
        raise IRError(f"no MoE checkpoint layout for {family!r}; expected one of {sorted(CHECKPOINT_EXPERTS)}")
    h, e, i = config.hidden_size, config.num_experts, config.intermediate_size

    def optional(name: str) -> np.ndarray | None:
        full = f"{disk_prefix}.{name}"
        return np.asarray(read(full)) if full in names else None

    def checked(name: str, value: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
        if value is None:
            raise IRError(f"the checkpoint has no tensor {disk_prefix}.{name} (expected shape {shape})")
        if tuple(value.shape) != shape:
            raise IRError(f"tensor {disk_prefix}.{name} has shape {tuple(value.shape)}, expected {shape} "
                          f"from the config")
        return value.astype(np.float32)

    def stacked(name: str, parts: tuple[str, ...], rows: tuple[int, ...], cols: int) -> np.ndarray:
        whole = optional(name)
        if whole is not None:  # already stacked (transformers' in-memory layout)
            return checked(name, whole, (e, sum(rows), cols))
        out = np.empty((e, sum(rows), cols), np.float32)
        for expert in range(e):
            at = 0
            for part, n in zip(parts, rows):
                name_e = part.format(e=expert)
                out[expert, at:at + n] = checked(name_e, optional(name_e), (n, cols))
                at += n
        return out

    gate, up, down = CHECKPOINT_EXPERTS[family]
    experts = {"experts.gate_up_proj": stacked("experts.gate_up_proj", (gate, up), (i, i), h),
               "experts.down_proj": stacked("experts.down_proj", (down,), (h,), i)}
    out = {}
    for name, value in experts.items():
        if config.quant is not None:
            out[f"{prefix}.{name}"] = quantize_experts(value, config.quant)
        else:
            out[f"{prefix}.{name}"] = value.astype(_NUMPY_DTYPES[config.expert_dtype])
    for name, (shape, _) in param_shapes(config, prefix).items():
        if name not in out:
            out[name] = checked(name[len(prefix) + 1:], optional(name[len(prefix) + 1:]), shape)
    return out
