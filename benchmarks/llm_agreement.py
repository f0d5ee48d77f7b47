"""How closely RLX's SmolLM2 logits follow llama.cpp's, teacher-forced on llama.cpp's own greedy text.

    python benchmarks/llm_agreement.py [--model PATH] [--tokens 64] [--quant-act q16|q8|f32]

For each prompt, llama.cpp (llama-cpp-python) generates greedily; both engines then score prompt +
continuation in one pass, and the table gives the share of positions whose top-1 token agrees, the
cosine of the logit vectors (mean and min), and how many tokens RLX's own greedy continuation shares
with llama.cpp's before the first difference (llama.cpp quantizes activations to 8 bits inside its
matmuls, so exact arithmetic parts from it at near-ties: greedy strings diverge, per-position logits
do not). Measurements only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ("The three primary colors are", "def fibonacci(n):", "In 1969, the first humans", "Water boils at")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--quant-act", default=None, help="RLX's quant_act (default: the device's, see CausalLM)")
    args = p.parse_args(argv)
    import llama_cpp

    from rlx.models.causal_lm import CausalLM
    from rlx.models.gguf import find_smollm2_gguf

    path = args.model or find_smollm2_gguf()
    context = 64 + args.tokens + 16
    lm = CausalLM.from_gguf(path, max_context=context, prefill_chunk=64, quant_act=args.quant_act)
    print(f"RLX quant_act={lm.quant_act}")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=context, logits_all=True, n_threads=2, verbose=False)
    print(f"{'prompt':<32} {'top-1':>6} {'cos mean':>9} {'cos min':>8} {'greedy prefix':>14}")
    for prompt in PROMPTS:
        ids = lm.tokenizer.encode(prompt)
        llm.reset()
        theirs_text = [int(t) for t in itertools.islice(llm.generate(ids, temp=0.0, top_k=1), args.tokens)]
        seq = ids + theirs_text
        llm.reset()
        llm.eval(seq)
        theirs = np.array(llm.scores[:len(seq)], np.float64)
        ours = lm.logits(seq).astype(np.float64)
        span = slice(len(ids) - 1, len(seq) - 1)
        cos = np.sum(ours[span] * theirs[span], -1) / (np.linalg.norm(ours[span], axis=-1)
                                                       * np.linalg.norm(theirs[span], axis=-1))
        mine = lm.generate(ids, args.tokens).token_ids
        prefix = next((i for i, (a, b) in enumerate(zip(mine, theirs_text)) if a != b), len(theirs_text))
        top1 = np.mean(ours[span].argmax(-1) == theirs[span].argmax(-1))
        print(f"{prompt:<32} {top1:6.3f} {cos.mean():9.4f} {cos.min():8.4f} {prefix:>8}/{len(theirs_text)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
