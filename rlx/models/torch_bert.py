"""A plain-PyTorch BERT encoder from the same weights: the peer of tests and benchmarks.

Written from the BERT architecture with `torch.nn.functional` only (the
`transformers` package is not a dependency), so it doubles as an independent
check of `rlx.models.bert`. Importing this module does not import torch;
`TorchBert` needs it installed.

>>> from rlx.models.bert import BertConfig, random_weights
>>> cfg = BertConfig(vocab_size=30, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
>>> try:
...     m = TorchBert(cfg, random_weights(cfg))
... except ImportError:
...     m = None
>>> m is None or tuple(m.embed([[1, 2, 3]], [[1, 1, 1]]).shape) == (1, 16)
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from rlx.models.bert import BertConfig


def _torch():
    import torch

    return torch


class TorchBert:
    """BERT forward in eager PyTorch (float32, CPU) with sentence-transformers mean pooling."""

    def __init__(self, config: BertConfig, weights: Mapping[str, np.ndarray]) -> None:
        torch = _torch()
        self.cfg = config
        # copies: torch wants writable arrays, and `bert.load_weights` gives read-only views of the mapped file
        self.w = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in weights.items()}

    def module(self, pooled: bool = True, attention: str = "matmul"):
        """An `nn.Module` running `forward` (for torch.compile / torch.onnx.export); `attention` as in `forward`."""
        torch = _torch()
        outer = self

        class _Module(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                # Registered as buffers so exporters see them as initializers, not graph inputs.
                for i, v in enumerate(outer.w.values()):
                    self.register_buffer(f"w{i}", v)
                self.names = list(outer.w)

            def forward(self, input_ids, attention_mask):
                w = {n: getattr(self, f"w{i}") for i, n in enumerate(self.names)}
                return outer.forward(input_ids, attention_mask, pooled=pooled, weights=w, attention=attention)

        return _Module().eval()

    def forward(self, input_ids, attention_mask, pooled: bool = True, weights=None, attention: str = "matmul"):
        """Hidden states `[B, S, H]`, or L2-normalized mean-pooled embeddings `[B, H]` if `pooled`.

        `attention`: "matmul" (matmul, softmax, matmul: HF BertModel's ops), "sdpa"
        (`F.scaled_dot_product_attention` with the padding mask as an additive bias: PyTorch picks its
        fused kernel) or "sdpa_unmasked" (no mask at all, so the flash backend qualifies: the same
        function only when `attention_mask` is all ones, which the caller must ensure).
        """
        if attention not in ("matmul", "sdpa", "sdpa_unmasked"):
            raise ValueError(f"attention must be 'matmul', 'sdpa' or 'sdpa_unmasked', got {attention!r}")
        torch = _torch()
        F = torch.nn.functional
        w = weights if weights is not None else self.w
        cfg = self.cfg
        b, s = input_ids.shape
        h, nh, hd = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        eps = cfg.layer_norm_eps
        act = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}.get(cfg.hidden_act)
        if act is None:
            def act(t):
                return F.gelu(t, approximate="tanh")

        def ln(x, p):
            return F.layer_norm(x, (h,), w[p + ".weight"], w[p + ".bias"], eps)

        def lin(x, p):
            return F.linear(x, w[p + ".weight"], w[p + ".bias"])

        positions = torch.arange(s, device=input_ids.device)
        x = (F.embedding(input_ids, w["embeddings.word_embeddings.weight"])
             + F.embedding(positions, w["embeddings.position_embeddings.weight"])[None]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = ln(x, "embeddings.LayerNorm")
        maskf = attention_mask.to(x.dtype)
        # The additive mask and the head split follow HF BertModel's op order, so graph optimizers that
        # pattern-match exported BERT attention (ONNX Runtime's) recognize this model too.
        bias = (1.0 - maskf[:, None, None, :]) * torch.finfo(x.dtype).min
        for i in range(cfg.num_layers):
            p = f"encoder.layer.{i}."

            def heads(t):
                return t.view(b, s, nh, hd).permute(0, 2, 1, 3)

            q = heads(lin(x, p + "attention.self.query"))
            k = heads(lin(x, p + "attention.self.key"))
            v = heads(lin(x, p + "attention.self.value"))
            if attention == "matmul":
                scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd) + bias
                ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
            else:
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias if attention == "sdpa" else None)
            ctx = ctx.permute(0, 2, 1, 3).contiguous().view(b, s, h)
            x = ln(lin(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            y = lin(act(lin(x, p + "intermediate.dense")), p + "output.dense")
            x = ln(y + x, p + "output.LayerNorm")
        if not pooled:
            return x
        summed = (x * maskf[:, :, None]).sum(dim=1)
        mean = summed / maskf.sum(dim=1, keepdim=True).clamp(min=1e-9)
        return F.normalize(mean, p=2.0, dim=1)

    def embed(self, input_ids, attention_mask):
        """Embeddings of a padded token batch given as arrays or lists (returns a torch tensor)."""
        torch = _torch()
        with torch.inference_mode():
            return self.forward(torch.as_tensor(np.asarray(input_ids, np.int64)),
                                torch.as_tensor(np.asarray(attention_mask, np.int64)))
