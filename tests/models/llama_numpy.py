"""An independent numpy LLaMA forward pass (no RLX graph), the oracle for the decoder tests.

Weights in GGUF layout (`[out, in]` matrices, already dequantized to f32); RoPE as
llama.cpp applies it: "interleaved" (NORM: adjacent pairs) or "neox" (halves).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def _rms_norm(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def _rope(x: np.ndarray, heads: int, head_dim: int, n_rot: int, base: float, variant: str) -> np.ndarray:
    seq = x.shape[0]
    x = x.reshape(seq, heads, head_dim).copy()
    freqs = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    angle = np.arange(seq, dtype=np.float64)[:, None] * freqs[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    if variant == "interleaved":
        a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        x[..., 0:n_rot:2], x[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
    else:
        half = n_rot // 2
        a, b = x[..., :half].copy(), x[..., half:n_rot].copy()
        x[..., :half], x[..., half:n_rot] = a * cos - b * sin, a * sin + b * cos
    return x.reshape(seq, heads * head_dim)


def llama_logits(config, weights: Mapping[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Logits `[len(ids), vocab]` of a causal LLaMA over `ids`, in float64."""
    c = config
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    x = w["token_embd.weight"][np.asarray(ids)]
    seq, hd = len(ids), c.head_dim
    group = c.num_heads // c.num_kv_heads
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    for layer in range(c.num_layers):
        p = f"blk.{layer}."
        h = _rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps)
        q = h @ w[p + "attn_q.weight"].T + w.get(p + "attn_q.bias", 0.0)
        k = h @ w[p + "attn_k.weight"].T + w.get(p + "attn_k.bias", 0.0)
        v = h @ w[p + "attn_v.weight"].T + w.get(p + "attn_v.bias", 0.0)
        q = _rope(q, c.num_heads, hd, c.n_rot, c.rope_base, c.rope_variant)
        k = _rope(k, c.num_kv_heads, hd, c.n_rot, c.rope_base, c.rope_variant)
        out = np.empty_like(q)
        for head in range(c.num_heads):
            kv = head // group
            qh, kh, vh = (t[:, s * hd:(s + 1) * hd] for t, s in ((q, head), (k, kv), (v, kv)))
            scores = np.where(causal, qh @ kh.T / np.sqrt(hd), -np.inf)
            probs = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[:, head * hd:(head + 1) * hd] = (probs / probs.sum(axis=1, keepdims=True)) @ vh
        x = x + out @ w[p + "attn_output.weight"].T
        h = _rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps)
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    h = _rms_norm(x, w["output_norm.weight"], c.rms_eps)
    return h @ w.get("output.weight", w["token_embd.weight"]).T
