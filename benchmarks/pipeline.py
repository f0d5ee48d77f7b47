"""Throughput of `compiled.pipeline` against a loop of `compiled.run`: MiniLM-L6-shaped embeddings of 8x128 batches.

    python benchmarks/pipeline.py [--device cuda|cpu] [--batches 64] [--depth 2] [--runners N] [--rounds 3]
                                  [--precision f32]

Both peers do the same work per batch, in this one process, from the same random weights (MiniLM-L6's
shape) and the same sentences:

1. host-side preparation: a whitespace tokenizer (a Python dict lookup per word) turns 8 sentences of
   random words into token ids and an attention mask, padded to 128 (what an embedding server does
   before each call);
2. the run (host inputs in, embeddings out: on CUDA the copies to and from the GPU are part of it);
3. reading the outputs: each batch's embeddings are copied into the result matrix.

`loop` does the three one after another; `pipeline` hands the preparation to the pipeline's feeder
thread and the runs to its runner threads (`rlx.runtime.pipelined`; by default one on the CPU, two on CUDA,
each on its own context and stream), so the next batches are prepared while one runs and the caller
copies the last one's outputs. Reported: batches per second of each (median over
`--rounds` rounds of `--batches` batches), the ratio pipeline / loop, and whether both computed the same
embeddings (they must: same program, same inputs). The closing note prints the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rlx
from rlx.models.bert import BertConfig, bert_inputs, build_bert, random_weights

MINILM = BertConfig(vocab_size=30522, hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536,
                    max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu")
BATCH, SEQ = 8, 128


class Tokenizer:
    """A whitespace tokenizer over a fixed vocabulary: the host-side preparation both peers do."""

    def __init__(self, words: list[str]) -> None:
        self.ids = {w: 1000 + i for i, w in enumerate(words)}

    def batch(self, sentences: list[str]) -> dict[str, np.ndarray]:
        ids = np.zeros((len(sentences), SEQ), np.int64)
        mask = np.zeros((len(sentences), SEQ), np.int64)
        for row, text in enumerate(sentences):
            toks = [101, *[self.ids.get(w, 100) for w in text.split()][:SEQ - 2], 102]
            ids[row, :len(toks)] = toks
            mask[row, :len(toks)] = 1
        return bert_inputs(ids, mask)


def corpus(n_batches: int, seed: int = 0) -> tuple[Tokenizer, list[list[str]]]:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(20000)]
    batches = []
    for _ in range(n_batches):
        lengths = rng.integers(20, SEQ - 2, size=BATCH)
        batches.append([" ".join(words[j] for j in rng.integers(0, len(words), size=n)) for n in lengths])
    return Tokenizer(words), batches


def main() -> None:
    from rlx.toolchain.cuda import visible_gpu_arch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if visible_gpu_arch() else "cpu")
    ap.add_argument("--batches", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--runners", type=int, default=None, help="runner threads (default: 1 on the CPU, 2 on CUDA)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precision", choices=("f32", "f16", "bf16"), default="f32")
    args = ap.parse_args()

    graph = build_bert(MINILM, max_batch=BATCH, max_seq=SEQ, name="minilm_pipeline")
    session = rlx.Session(rlx.Device.CUDA if args.device == "cuda" else rlx.Device.CPU, precision=args.precision)
    t0 = time.perf_counter()
    compiled = session.compile(graph)
    for name, value in random_weights(MINILM).items():
        if name in compiled.param_names:
            compiled.set_param(name, value)
    print(f"rlx {rlx.__version__}: MiniLM-L6 shape, {BATCH}x{SEQ} batches on {args.device} ({args.precision}); "
          f"compiled and loaded in {time.perf_counter() - t0:.1f} s")
    tok, batches = corpus(args.batches)
    dim = MINILM.hidden_size

    def loop() -> np.ndarray:
        result = np.empty((len(batches) * BATCH, dim), np.float32)
        for i, sentences in enumerate(batches):
            (emb,) = compiled.run(tok.batch(sentences))
            result[i * BATCH:(i + 1) * BATCH] = emb
        return result

    def piped() -> np.ndarray:
        result = np.empty((len(batches) * BATCH, dim), np.float32)
        stream = compiled.pipeline((tok.batch(s) for s in batches), depth=args.depth, runners=args.runners)
        for i, (emb,) in enumerate(stream):
            result[i * BATCH:(i + 1) * BATCH] = emb
        return result

    reference, check = loop(), piped()  # warm-up, and the check that both compute the same
    same = np.array_equal(reference, check)
    times: dict[str, list[float]] = {"loop": [], "pipeline": []}
    for _ in range(args.rounds):
        for name, fn in (("loop", loop), ("pipeline", piped)):
            time.sleep(0.2)
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    rate = {k: len(batches) / statistics.median(v) for k, v in times.items()}
    print(f"{'peer':<10}{'batches/s':>12}{'sentences/s':>14}{'ms/batch':>11}")
    for name, r in rate.items():
        print(f"{name:<10}{r:>12.1f}{r * BATCH:>14.0f}{1e3 / r:>11.2f}")
    print(f"same embeddings from both: {same}")
    print(f"closing note: pipeline / run loop = {rate['pipeline'] / rate['loop']:.2f}x "
          f"({args.device}, depth {args.depth}, runners {args.runners or 'default'}, {args.batches} batches of "
          f"{BATCH}x{SEQ})")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
