"""Trace a small MLP with `rlx.trace` and save what `rlxc` needs: the graph, its weights, an input.

    python examples/mlp.py [OUTDIR]

writes, in OUTDIR (default: the current directory):

    mlp.json           the traced graph (`graph.save`): rlxc compile / run / inspect read it
    mlp.safetensors    random weights for its params (w1, b1, w2, b2)
    x.npy              one input batch, float32 [5, 4]
    expected.npy       what the numpy reference interpreter computes for x: the outputs to expect

The README walks through the rest: compile it into an artifact, run it, and call it from C
(examples/consumer.c).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

import rlx

IN, HIDDEN, OUT = 4, 16, 3
MAX_BATCH = 64  # one build serves every batch size from 1 to this bound


def mlp(t: rlx.Tracer) -> dict[str, rlx.TracedTensor]:
    """x[batch, IN] -> y[batch, OUT]: two dense layers with a GELU between them."""
    x = t.input("x", [rlx.Dim.dynamic("batch", max=MAX_BATCH), IN])
    # Params are declared in this order, which is also their index order in the C ABI (rlx_set_param).
    w1, b1 = t.param("w1", [IN, HIDDEN]), t.param("b1", [HIDDEN])
    w2, b2 = t.param("w2", [HIDDEN, OUT]), t.param("b2", [OUT])
    hidden = (x @ w1 + b1).gelu()
    return {"y": hidden @ w2 + b2}


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(".")
    out.mkdir(parents=True, exist_ok=True)
    graph = rlx.trace("mlp", mlp)
    graph.save(out / "mlp.json")

    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((IN, HIDDEN)).astype(np.float32) / np.sqrt(IN),
        "b1": np.full(HIDDEN, 0.1, np.float32),
        "w2": rng.standard_normal((HIDDEN, OUT)).astype(np.float32) / np.sqrt(HIDDEN),
        "b2": np.zeros(OUT, np.float32),
    }
    save_file(weights, str(out / "mlp.safetensors"))
    x = np.linspace(-1, 1, 5 * IN, dtype=np.float32).reshape(5, IN)
    np.save(out / "x.npy", x)
    # The numpy reference interpreter is the oracle every backend is tested against.
    np.save(out / "expected.npy", rlx.reference.run(graph, {"x": x}, weights)[0])
    print(f"wrote {out / 'mlp.json'}, {out / 'mlp.safetensors'}, {out / 'x.npy'} and {out / 'expected.npy'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
