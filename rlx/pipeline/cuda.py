"""The CUDA backend's stages: decide (GEMM groups, device layout, ... for the resolved target), render (one
.cu file), build (nvcc, through the AOT cache), load (`CudaGraph`), and the estimate of the device layout.

The target (`rlx.codegen.cuda.CudaTarget`) is resolved against the toolchain once, on first use (`target`):
the arch, the GEMM provider cuBLASLt or the built-in one, CUTLASS on or off. Codegen loads only then:
`request` (the compile index's components) and `find` / `load` (a warm hit) never load it.
`build_cuda(lir, ...)` and `compile_cuda(lir, ...)` run decide → render → build (→ load) of one LIR with
explicit target options (the GPU tests and benchmarks compare variants this way).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx.config import Config
from rlx.errors import RlxError
from rlx.ir.dtype import DType
from rlx.ir.lir import LirModule
from rlx.pipeline.decide import decide
from rlx.pipeline.values import Built, Rendered
from rlx.runtime.cuda_device import CudaGraph
from rlx.runtime.loader import load_library
from rlx.runtime.memory import MemoryEstimate
from rlx.toolchain.cache import AotCache
from rlx.toolchain.cpu import KEY_PENDING
from rlx.toolchain.cuda import (
    CudaBuild,
    NvccToolchain,
    cuda_source_components,
    cuda_toolchain_components,
    cutlass_note,
    detect_nvcc_toolchain,
    resolve_target,
)
from rlx.toolchain.cuda import (
    build_cuda as build_cuda_source,
)


def cuda_manifest(lir: LirModule, toolchain: NvccToolchain, target: Any, key: str) -> dict:
    """LirModule.manifest() plus what the builder knows: ABI, target, arch, precision, GEMM, key."""
    from rlx.codegen.cuda import ABI_VERSION, CODEGEN_VERSION

    m = lir.manifest()
    m.update({"abi_version": ABI_VERSION, "target": "cuda", "arch": target.arch, "key": key,
              "precision": target.precision.value, "gemm": target.gemm, "cuda_version": toolchain.cuda_version,
              "codegen_version": CODEGEN_VERSION, "cutlass_gemm": cutlass_note(toolchain, target)})
    return m


def decide_cuda(lir: LirModule, target: Any) -> LirModule:
    """`lir` with the CUDA decisions for `target` (a `CudaTarget`), scan bodies included: the LIR the AOT
    cache key hashes and codegen renders."""
    # The kernel choices' options too (`rlx.opt.lowering_cuda_kernels`): the resolved target's arch and
    # whether its toolchain has CUTLASS are facts passed in like the rest; codegen checks the LIR recorded them.
    options = {"precision": target.precision, "gemm": target.gemm, "pool_tail": target.pool_tail,
               "pool_norm": target.pool_norm, "arch": target.arch, "cutlass_gemm": target.cutlass_gemm,
               "gather_region": target.gather_region, "small_gemm": target.small_gemm,
               "lt_gelu_epilogue": target.lt_gelu_epilogue, "fused_act_gemm": target.fused_act_gemm,
               "decode_sms": target.decode_sms, "kv_decode": target.kv_decode,
               "p2p_all_reduce": target.p2p_all_reduce, "gemv_walk": target.gemv_walk, "xr_groups": target.xr_groups,
               "dequant_copies": target.dequant_copies, "dense_gemv": target.dense_gemv,
               "dense_tile": target.dense_tile, "dense_split": target.dense_split}
    # a scan body writes no graph output (no pooling tail of its own); its per-step pointers are the loop's
    return decide(lir, "cuda", {**options, "pool_tail": False, "scan_body": True}, **options)


def render_cuda(lir: LirModule, target: Any, manifest: dict) -> str:
    """The .cu of `lir` for `target`: decided here (`decide_cuda`, idempotent on a decided LIR), then rendered
    by codegen (`rlx.codegen.cuda.render_cuda`, which renders a decided LIR only)."""
    from rlx.codegen.cuda import render_cuda as render

    return render(decide_cuda(lir, target), target, manifest)


def cuda_context(lir: LirModule, target: Any, manifest: dict) -> dict:
    """The CUDA template context of `lir` for `target`, decided here first (as `render_cuda`)."""
    from rlx.codegen.cuda import cuda_context as context

    return context(decide_cuda(lir, target), target, manifest)


class CudaStages:
    """The CUDA backend's decide, render, build, load and estimate for one configuration and target.

    `precision`, `gemm` and `target_options` are `CudaTarget` fields; `arch` ("sm_90") picks the arch
    instead of the visible GPU's. `profile` defaults to the configuration's.
    """

    backend = "cuda"
    hold_norm_inputs = True

    def __init__(self, config: Config, *, precision: DType | str = DType.F32, arch: str | None = None,
                 gemm: str = "cublaslt", toolchain: NvccToolchain | None = None, **target_options: Any) -> None:
        if config.check_nans:
            raise RlxError("check_nans (RLX_CHECK_NANS) covers the CPU backend; run the graph on Device.CPU "
                           "with check_nans=True to find the op that makes a NaN")
        self.config = config
        self.precision = DType.parse(precision)
        self.arch = arch
        self.gemm = gemm
        # RLX_CUDA_P2P=0 leaves every all-reduce to NCCL (named only when off: default builds keep their keys)
        self.target_options = {"profile": config.profile, **({} if config.cuda_p2p else {"p2p_all_reduce": False}),
                               **({"gemv_walk": config.cuda_gemv_walk} if config.cuda_gemv_walk != "auto" else {}),
                               **({"xr_groups": config.cuda_xr_groups} if config.cuda_xr_groups else {}),
                               **({"dequant_copies": config.cuda_dequant_copies}
                                  if config.cuda_dequant_copies >= 0 else {}),
                               **({} if config.cuda_small_gemm else {"small_gemm": False}),
                               **({} if config.cuda_dense_gemv else {"dense_gemv": False}),
                               **({"dense_tile": config.cuda_dense_tile} if config.cuda_dense_tile else {}),
                               **({"dense_split": config.cuda_dense_split} if config.cuda_dense_split else {}),
                               **target_options}
        self._toolchain = toolchain
        self._target: Any = None

    @property
    def toolchain(self) -> NvccToolchain:
        if self._toolchain is None:
            self._toolchain = detect_nvcc_toolchain(self.config, self.arch)
        return self._toolchain

    @property
    def target(self) -> Any:
        """The `CudaTarget`, resolved against the toolchain (imports codegen on first use)."""
        if self._target is None:
            from rlx.codegen.cuda import CudaTarget

            wanted = CudaTarget(precision=self.precision, gemm=self.gemm, **self.target_options)
            self._target = resolve_target(self.toolchain, wanted, self.config)
        return self._target

    def request(self) -> dict[str, str]:
        """What the build is asked for beyond the toolchain (the compile index's components): the precision
        and the target's defaults (GEMM provider resolved against the toolchain in the components)."""
        tc = self.toolchain
        extra = "".join(f" {k}={v}" for k, v in sorted(self.target_options.items()) if k != "profile")
        return {**cuda_toolchain_components(tc, self.gemm),
                "request": f"precision={self.precision.value} arch={tc.arch} cuda={tc.cuda_version}"
                           + (" profile=1" if self.target_options.get("profile") else "")
                           + (f" gemm={self.gemm}" if self.gemm != "cublaslt" else "") + extra}

    def decide(self, lir: LirModule) -> LirModule:
        return decide_cuda(lir, self.target)

    def render(self, lir: LirModule) -> Rendered:
        """The .cu of a decided LIR, with its key pending, and its key components."""
        from rlx.codegen.cuda import render_cuda

        toolchain, target = self.toolchain, self.target

        def with_key(key: str) -> str:
            return render_cuda(lir, target, cuda_manifest(lir, toolchain, target, key))

        text = with_key(KEY_PENDING)
        return Rendered("cuda", lir, text, with_key, cuda_source_components(lir.hash(), text, toolchain, target))

    def build(self, rendered: Rendered) -> Built:
        built = build_cuda_source(rendered.with_key, rendered.components, self.config, self.toolchain,
                                  self.target.gemm)
        return Built(built.library, built.source, built.key, built.hit, rendered.digest, built.seconds)

    def find(self, key: str) -> Built | None:
        entry = AotCache(self.config).lookup(key)
        if entry is None:
            return None
        return Built(Path(entry.library), Path(entry.source), entry.key, True, str(entry.components.get("source")))

    def load(self, built: Built) -> CudaGraph:
        return CudaGraph(load_library(built.library), source=built.source, key=built.key, cache_hit=built.hit,
                         build_seconds=built.seconds)

    def estimate(self, lir: LirModule, num_threads: int | None = None) -> MemoryEstimate:
        """The device allocation of a decided LIR (its `cuda_device_layout`): params (QKV group outputs and
        constants included), arena, scratch (cuBLASLt's workspace included), and the rest of the one
        allocation (inputs' and outputs' device copies, the error flag, counters) as the context;
        `total` is the allocation. State, inputs and outputs are the caller's host tensors."""
        layout = next(d for d in lir.decisions if d.kind == "cuda_device_layout")
        size: dict[str, int] = {}
        for region in layout.regions:
            size[region.name] = size.get(region.name, 0) + region.nbytes
        params = size.get("params", 0) + size.get("qkv", 0) + size.get("constants", 0)
        scratch = size.get("scratch", 0) + size.get("workspace", 0)
        arena = size.get("arena", 0)
        return _estimate(lir, arena=arena, params=params, scratch=scratch,
                         context=layout.total - arena - params - scratch)


def _estimate(lir: LirModule, *, arena: int, params: int, scratch: int, context: int) -> MemoryEstimate:
    """An estimate whose caller-owned parts (state inputs, inputs, outputs at their bounds) come from `lir`."""
    graph = lir.graph
    state_inputs = {s.node for s in lir.inputs if s.state}
    return MemoryEstimate(
        arena=arena, params=params, scratch=scratch, context=context,
        state=sum(graph.node(n).shape.max_nbytes for n in state_inputs),
        inputs=sum(graph.node(s.node).shape.max_nbytes for s in lir.inputs if s.node not in state_inputs),
        outputs=sum(graph.node(s.node).shape.max_nbytes for s in lir.outputs), threads=1)


@dataclass(frozen=True)
class CudaBuilt(CudaBuild):
    """What `build_cuda` gives: the toolchain's build record, plus the resolved target and the decided LIR."""

    target: Any
    lir: LirModule


def build_cuda(lir: LirModule, config: Config | None = None, target: Any = None, arch: str | None = None,
               toolchain: NvccToolchain | None = None) -> CudaBuilt:
    """Decide, render and build (or find in the AOT cache) the CUDA library of `lir` for `target`
    (a `CudaTarget`; default: CudaTarget())."""
    config = config or Config.from_env()
    if target is None:
        from rlx.codegen.cuda import CudaTarget

        target = CudaTarget()
    stages = CudaStages(config, arch=arch, toolchain=toolchain)
    stages._target = resolve_target(stages.toolchain, target, config)
    rendered = stages.render(stages.decide(lir))
    built = stages.build(rendered)
    return CudaBuilt(library=built.library, source=built.source, key=built.key, hit=built.hit,
                     components=rendered.components, toolchain=stages.toolchain, seconds=built.seconds,
                     target=stages.target, lir=rendered.lir)


def compile_cuda(lir: LirModule, config: Config, *, precision: DType | str = DType.F32, arch: str | None = None,
                 gemm: str = "cublaslt", **target_options: Any) -> CudaGraph:
    """Build (through the AOT cache) and load the CUDA library of an LIR module.

    `target_options` are further `CudaTarget` fields (e.g. `attn_bk=64`)."""
    stages = CudaStages(config, precision=precision, arch=arch, gemm=gemm, **target_options)
    return stages.load(stages.build(stages.render(stages.decide(lir))))


__all__ = ["CudaBuilt", "CudaStages", "build_cuda", "compile_cuda", "cuda_context", "cuda_manifest", "decide_cuda",
           "render_cuda"]
