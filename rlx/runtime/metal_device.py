"""Running a built Metal program on an Apple GPU, through PyObjC (`pip install rlx[metal]`).

Why PyObjC (`pyobjc-framework-Metal`) rather than an Objective-C shim built with clang: the host side is a
few dozen calls (make a buffer, load a `.metallib`, encode dispatches, wait), all of which PyObjC exposes
directly; it ships as macOS wheels, so installing RLX on a Mac needs no compiler step beyond the
`xcrun metal` that builds the kernels, and there is no second C ABI to keep in step with
`rlx/runtime/abi.py`. The per-run Python overhead (one command buffer, one encoder, a handful of calls per
kernel) is small next to a model's GPU time.

`MetalDeviceRunner` owns one shared-storage `MTLBuffer` (the whole program: Apple silicon's unified memory
lets the host write inputs and params and read outputs in place) and encodes every dispatch of a run in
one command buffer, in order (a serial compute encoder: each kernel sees the previous one's writes).
`load_metal(dir)` gives a `rlx.runtime.metal_host.MetalGraph` over it.

UNTESTED ON APPLE HARDWARE: RLX's CI runs on Linux, where this module cannot import Metal; the generated
kernels are checked there by the emulator in tests/metal/, and tests/runtime/test_metal_device.py runs
this module only on macOS.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rlx.errors import ArtifactError, ExecutionError, RlxError
from rlx.runtime.metal_host import Launch, MetalGraph


def _metal():  # type: ignore[no-untyped-def]
    try:
        import Foundation
        import Metal
    except ImportError as exc:
        raise RlxError("running Metal programs needs PyObjC's Metal bindings on macOS: "
                       "pip install 'rlx[metal]' (pyobjc-framework-Metal)") from exc
    return Metal, Foundation


class MetalDeviceRunner:
    """The program buffer on the system's default Metal device, and the pipelines of its kernels."""

    def __init__(self, metallib: Path, total: int, kernels: Sequence[tuple[str, int]], n_symbols: int) -> None:
        """`kernels`: (name, threads per threadgroup) of every dispatch."""
        Metal, Foundation = _metal()
        self._Metal = Metal
        device = Metal.MTLCreateSystemDefaultDevice()
        if device is None:
            raise RlxError("no Metal device is available")
        library, error = device.newLibraryWithURL_error_(Foundation.NSURL.fileURLWithPath_(str(metallib)), None)
        if library is None:
            raise ArtifactError(f"cannot load {metallib}: {error}")
        self._pipelines = {}
        for name, threads in kernels:
            if name in self._pipelines:
                continue
            fn = library.newFunctionWithName_(name)
            if fn is None:
                raise ArtifactError(f"{metallib} has no kernel {name!r}")
            pipeline, error = device.newComputePipelineStateWithFunction_error_(fn, None)
            if pipeline is None:
                raise ArtifactError(f"cannot build the pipeline of {name!r}: {error}")
            if pipeline.maxTotalThreadsPerThreadgroup() < threads:
                raise ArtifactError(f"kernel {name!r} runs {threads} threads per threadgroup; this GPU allows "
                                    f"{pipeline.maxTotalThreadsPerThreadgroup()} for it")
            self._pipelines[name] = pipeline
        shared = Metal.MTLResourceStorageModeShared
        self._buffer = device.newBufferWithLength_options_(max(total, 16), shared)
        self._sym = device.newBufferWithLength_options_(8 * max(n_symbols, 1), shared)
        if self._buffer is None or self._sym is None:
            raise RlxError(f"cannot allocate a Metal buffer of {total} bytes")
        self.memory = np.frombuffer(self._buffer.contents().as_buffer(max(total, 16)), dtype=np.uint8)
        self._sym_view = np.frombuffer(self._sym.contents().as_buffer(8 * max(n_symbols, 1)), dtype=np.int64)
        if not (self.memory.flags.writeable and self._sym_view.flags.writeable):
            raise RlxError("PyObjC gave a read-only view of the Metal buffer (objc.varlist.as_buffer); "
                           "this PyObjC version cannot run RLX's Metal programs")
        self._queue = device.newCommandQueue()

    def run(self, launches: Sequence[Launch], symbols: np.ndarray) -> None:
        Metal = self._Metal
        self._sym_view[:symbols.size] = symbols
        cb = self._queue.commandBuffer()
        enc = cb.computeCommandEncoder()
        for launch in launches:
            enc.setComputePipelineState_(self._pipelines[launch.name])
            enc.setBuffer_offset_atIndex_(self._buffer, 0, 0)
            enc.setBuffer_offset_atIndex_(self._sym, 0, 1)
            enc.dispatchThreadgroups_threadsPerThreadgroup_(Metal.MTLSizeMake(*launch.grid),
                                                             Metal.MTLSizeMake(*launch.threads))
        enc.endEncoding()
        cb.commit()
        cb.waitUntilCompleted()
        if cb.status() == Metal.MTLCommandBufferStatusError:
            raise ExecutionError(f"the Metal command buffer failed: {cb.error()}")


def load_metal(directory: str | Path) -> MetalGraph:
    """A built Metal program (`model.metallib` + `manifest.json`, see `rlx.toolchain.metal`) ready to run."""
    d = Path(directory)
    manifest = json.loads((d / "manifest.json").read_text())
    metallib = d / "model.metallib"
    if not metallib.is_file():
        raise ArtifactError(f"{d} has no model.metallib (built where there is no Metal toolchain?)")
    runner = MetalDeviceRunner(metallib, int(manifest["layout"]["total"]),
                               [(x["kernel"], int(np.prod(x["threads"]))) for x in manifest["dispatches"]],
                               len(manifest["symbols"]))
    source = (d / "model.metal").read_text() if (d / "model.metal").is_file() else None
    return MetalGraph(manifest, runner, source=source)
