"""Decode-shaped sparse MoE block on the CPU: time follows top_k (the experts read), not num_experts.

    python benchmarks/moe_decode.py [--threads N] [--rounds R] [--hidden 512] [--inter 256] [--quant q8_0]

One token through `rlx.models.moe.moe_block` (router, top-k SwiGLU experts through `moe_matmul`, the
weighted sum), compiled for the CPU for each top_k in 1, 2, 4, 8 and num_experts 16 and 64 (random
weights; f32 experts unless `--quant`). Each call takes the next of 64 random inputs, so the router picks
other experts from call to call and their weights come from memory, as in decoding. A 1-row graph is decided
GEMV-only (`MoeExpertPlan`): each call reads the chosen experts' matrices and no others, so the time
grows with top_k and stays flat from 16 to 64 experts (4x the weights). Medians over round-robin rounds
(benchmarks/timing.py); also the megabytes of expert weights a call reads and the model holds.

    python benchmarks/moe_decode.py --peer [--model DIR] [--threads N] [--blocks 5] [--pause 1.0] [--hidden 512]
                                    [--inter 256] [--experts 16] [--top-k 2] [--layers 4] [--prompt-tokens 16]
                                    [--new-tokens 32] [--no-scaling]

`--peer`: a whole Qwen3-MoE-shaped decoder instead (random weights from transformers' `from_config`, every
layer sparse, renormalized top-k, saved with `save_pretrained` to a temporary directory; or the checkpoint
directory `--model`, e.g. `benchmarks/llm.py --model DIR` comes here): RLX's `CausalLM.from_pretrained` on that
checkpoint against transformers' eager forward of the same model, in this process, with the same thread count.
A block is one engine's prefill of `--prompt-tokens` and `--new-tokens` greedy decode steps through its KV
cache; the engines' blocks alternate with `--pause` seconds between them (so one's thread pool is idle while
the other runs), `--blocks` times. Printed: the median decode ms/token and tokens/s of each, the ratio, and
whether the greedy tokens agree. (One process holds one OpenMP runtime, set up by RLX's RLX_OMP_WAIT policy;
torch's intra-op pool shares it.)
Then (unless `--no-scaling`, and for a random checkpoint only) RLX's whole-decoder decode of the same shape
with 4x the experts, and with 2x and 4x the experts per token, blocks alternating as above: decode time
follows `num_experts_per_tok`, not `num_experts`.

Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import time

import numpy as np
import timing  # benchmarks/timing.py (a script's own folder is on sys.path)

TOP_KS = (1, 2, 4, 8)
EXPERTS = (16, 64)
INPUTS = 64


def _block(experts: int, top_k: int, hidden: int, inter: int, quant: str | None, threads: int):
    import rlx
    from rlx.models.moe import MoeConfig, moe_block, param_shapes, quantize_experts

    cfg = MoeConfig(hidden_size=hidden, num_experts=experts, top_k=top_k, intermediate_size=inter, normalize=True,
                    quant=quant)
    g = rlx.Graph(f"moe_e{experts}_k{top_k}")
    g.set_outputs([moe_block(g, g.input("x", [1, hidden]), cfg, "mlp")])
    cg = rlx.Session(rlx.Device.CPU).compile(g, num_threads=threads)
    rng = np.random.default_rng(experts * 100 + top_k)
    expert_bytes = 0
    # the f32 matrices (param_shapes of the unquantized config), quantized where the block stores blocks
    for name, (shape, _) in param_shapes(dataclasses.replace(cfg, quant=None), "mlp").items():
        value = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if quant is not None and ".experts." in name:
            value = quantize_experts(value, quant)
        if ".experts." in name:
            expert_bytes += value.nbytes
        cg.set_param(name, value)
    xs = [rng.standard_normal((1, hidden)).astype(np.float32) for _ in range(INPUTS)]
    feed = itertools.cycle(xs)
    return (lambda: cg.run({"x": next(feed)})), expert_bytes


def _checkpoint(args: argparse.Namespace, directory: str):
    """A random Qwen3-MoE-shaped transformers model (f32, eval, eager attention), saved to `directory`; with
    `args.model` that checkpoint instead (read by transformers with eager attention)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if args.model is not None:
        return AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32,
                                                    attn_implementation="eager").eval()

    heads = max(1, args.hidden // 64)
    cfg = AutoConfig.for_model("qwen3_moe", hidden_size=args.hidden, num_hidden_layers=args.layers,
                               num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
                               intermediate_size=4 * args.hidden, moe_intermediate_size=args.inter,
                               num_experts=args.experts, num_experts_per_tok=args.top_k, norm_topk_prob=True,
                               vocab_size=args.vocab, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                               attn_implementation="eager")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    model.save_pretrained(directory)
    return model


class _RlxDecode:
    def __init__(self, directory: str, args: argparse.Namespace) -> None:
        from rlx.models.causal_lm import CausalLM

        self.lm = CausalLM.from_pretrained(directory, context_length=args.prompt_tokens + args.new_tokens + 8,
                                           prefill_chunk=args.prompt_tokens, threads=args.threads)

    def block(self, ids: list[int], new: int) -> tuple[float, list[int]]:
        """(decode seconds per token, the greedy tokens) after a prefill of `ids`."""
        cache = self.lm.new_cache()
        token = int(self.lm.step_greedy(np.array([ids]), cache, [len(ids) - 1])[0])
        out = [token]
        t0 = time.perf_counter()
        for _ in range(new):
            token = int(self.lm.step_greedy(np.array([[token]]), cache, [0])[0])
            out.append(token)
        return (time.perf_counter() - t0) / new, out


class _TransformersDecode:
    def __init__(self, model) -> None:
        self.model = model

    def block(self, ids: list[int], new: int) -> tuple[float, list[int]]:
        import torch

        with torch.inference_mode():
            out = self.model(torch.tensor([ids]), use_cache=True)
            token = int(out.logits[0, -1].argmax())
            tokens, cache = [token], out.cache  # transformers 5's KV cache (`past_key_values` before)
            t0 = time.perf_counter()
            for _ in range(new):
                out = self.model(torch.tensor([[token]]), cache=cache, use_cache=True)
                token, cache = int(out.logits[0, -1].argmax()), out.cache
                tokens.append(token)
            return (time.perf_counter() - t0) / new, tokens


def peer_main(args: argparse.Namespace) -> None:
    """RLX against transformers' eager decode on one random Qwen3-MoE checkpoint (see the module docstring)."""
    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as directory:
        model = _checkpoint(args, directory)
        args.vocab = model.config.vocab_size
        ids = [int(t) for t in np.random.default_rng(1).integers(3, args.vocab, args.prompt_tokens)]
        peers = {"transformers": _TransformersDecode(model), "rlx": _RlxDecode(str(args.model or directory), args)}
    for peer in peers.values():  # warm-up: weights paged in, thread pools started
        peer.block(ids, 4)
    samples: dict[str, list[float]] = {name: [] for name in peers}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.blocks):
        for name, peer in peers.items():
            time.sleep(args.pause)
            seconds, tokens[name] = peer.block(ids, args.new_tokens)
            samples[name].append(seconds)
    med = {name: statistics.median(v) for name, v in samples.items()}
    c = model.config
    what = f"checkpoint {args.model}" if args.model else "Qwen3-MoE-shaped decoder, random weights"
    print(f"{what} (f32): {c.model_type}, hidden {c.hidden_size}, {c.num_hidden_layers} layers, "
          f"{getattr(c, 'num_experts', None) or getattr(c, 'num_local_experts', '-')} experts "
          f"top-{getattr(c, 'num_experts_per_tok', '-')}, vocab {c.vocab_size}; "
          f"prompt {args.prompt_tokens}, {args.new_tokens} greedy decode steps, threads {args.threads}, "
          f"medians of {args.blocks} blocks ({args.pause} s pauses)")
    print(f"{'engine':>14} {'decode ms/token':>16} {'tokens/s':>10} {'all blocks ms/token':>30}")
    for name, t in med.items():
        every = " ".join(f"{s * 1e3:.2f}" for s in samples[name])
        print(f"{name:>14} {t * 1e3:>16.3f} {1 / t:>10.1f} {every:>30}")
    print(f"rlx speed / transformers eager: {med['transformers'] / med['rlx']:.2f}x; greedy tokens "
          f"{'agree' if tokens['rlx'] == tokens['transformers'] else 'differ'} "
          f"({sum(a == b for a, b in zip(tokens['rlx'], tokens['transformers']))}/{len(tokens['rlx'])} equal)")
    if args.scaling and args.model is None:
        scaling_main(args, ids)


def scaling_main(args: argparse.Namespace, ids: list[int]) -> None:
    """RLX's decode of the random decoder's shape with more experts, and with more experts per token."""
    import tempfile

    shapes = [(args.experts, args.top_k), (4 * args.experts, args.top_k)]
    shapes += [(args.experts, k) for k in (2 * args.top_k, 4 * args.top_k) if k <= args.experts]
    decoders = {}
    for experts, top_k in shapes:
        shaped = argparse.Namespace(**{**vars(args), "experts": experts, "top_k": top_k})
        with tempfile.TemporaryDirectory() as directory:
            _checkpoint(shaped, directory)
            decoders[(experts, top_k)] = _RlxDecode(directory, shaped)
    for d in decoders.values():
        d.block(ids, 4)
    samples: dict[tuple[int, int], list[float]] = {shape: [] for shape in decoders}
    for _ in range(args.blocks):
        for shape, d in decoders.items():
            time.sleep(args.pause)
            samples[shape].append(d.block(ids, args.new_tokens)[0])
    base = statistics.median(samples[shapes[0]])
    per_expert = 3 * args.hidden * args.inter * 4 * args.layers  # bytes of one expert's f32 matrices, every layer
    print(f"RLX decode by MoE shape (same hidden/layers/vocab; medians of {args.blocks} blocks):")
    print(f"{'experts':>8} {'top_k':>6} {'expert MiB held':>16} {'expert MiB read/token':>22} {'ms/token':>9} "
          f"{'tokens/s':>9} {'vs first':>9}")
    for (experts, top_k), v in samples.items():
        t = statistics.median(v)
        print(f"{experts:>8} {top_k:>6} {experts * per_expert / 2**20:>16.1f} {top_k * per_expert / 2**20:>22.2f} "
              f"{t * 1e3:>9.3f} {1 / t:>9.1f} {t / base:>8.2f}x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--quant", default=None, help="expert block format (q8_0); default f32 experts")
    ap.add_argument("--peer", action="store_true", help="a whole decoder against transformers' eager decode")
    ap.add_argument("--model", default=None, help="--peer: a Hugging Face checkpoint directory (default: random)")
    ap.add_argument("--no-scaling", dest="scaling", action="store_false",
                    help="--peer: skip the decode-by-MoE-shape table")
    ap.add_argument("--experts", type=int, default=16, help="--peer: routed experts per layer")
    ap.add_argument("--top-k", type=int, default=2, help="--peer: experts per token")
    ap.add_argument("--layers", type=int, default=4, help="--peer: decoder layers")
    ap.add_argument("--vocab", type=int, default=2000, help="--peer: vocabulary size")
    ap.add_argument("--prompt-tokens", type=int, default=16, help="--peer: prompt length")
    ap.add_argument("--new-tokens", type=int, default=32, help="--peer: greedy decode steps per block")
    ap.add_argument("--blocks", type=int, default=5, help="--peer: blocks per engine")
    ap.add_argument("--pause", type=float, default=1.0, help="--peer: seconds before each block")
    args = ap.parse_args(argv)
    if args.peer:
        peer_main(args)
        return
    if args.quant not in (None, "q8_0"):
        raise SystemExit("--quant takes q8_0 (or nothing for f32 experts)")
    peers, held = {}, {}
    for experts, top_k in itertools.product(EXPERTS, TOP_KS):
        peers[(experts, top_k)], held[experts] = _block(experts, top_k, args.hidden, args.inter, args.quant,
                                                        args.threads)
    times = timing.round_robin({f"{e}/{k}": fn for (e, k), fn in peers.items()}, args.rounds)
    kind = args.quant or "f32"
    print(f"MoE block, 1 token: hidden {args.hidden}, expert FFN {args.inter}, {kind} experts, "
          f"threads {args.threads}, medians of {args.rounds} rounds")
    print(f"experts held: {held[16] / 2**20:.1f} MiB (16 experts), {held[64] / 2**20:.1f} MiB (64 experts)")
    print(f"{'top_k':>5} {'read/call MiB':>13} {'16 experts us':>14} {'64 experts us':>14} {'64/16':>6}")
    for top_k in TOP_KS:
        read = held[16] / 16 * top_k / 2**20
        t16, t64 = times[f"16/{top_k}"] * 1e6, times[f"64/{top_k}"] * 1e6
        print(f"{top_k:>5} {read:>13.2f} {t16:>14.1f} {t64:>14.1f} {t64 / t16:>6.2f}")


if __name__ == "__main__":
    main()
