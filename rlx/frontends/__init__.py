"""Frontends: build RLX graphs from models written for other frameworks.

`rlx.frontends.onnx.from_onnx` imports an ONNX model (needs the optional
`onnx` package: ``pip install 'rlx[onnx]'``). Importing this package does not
import `onnx`; that happens on the first call.
"""

from rlx.frontends.onnx import OnnxImport, from_onnx

__all__ = ["OnnxImport", "from_onnx"]
