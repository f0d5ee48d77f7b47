"""The parity table of the Hugging Face families: RLX's `CausalLM.from_pretrained` against transformers.

    python benchmarks/hf_parity.py [--families llama,mixtral,...] [--new-tokens 24]

For each family, the tiny random checkpoint the suite uses (tests/models/hf_checkpoints.py and
recurrent_checkpoints.py: matrices N(0, 0.2) for peaked logits, saved with `save_pretrained`) is loaded by
RLX on the CPU in f32 and run beside transformers' own model: the largest |difference| of the logits over a
1-token and a 40-token prompt relative to the largest |logit|, the lowest cosine of the two, whether
`--new-tokens` greedy tokens through RLX's KV cache equal transformers' `generate(do_sample=False)`, and the
cosine of a `quantize="q8_0"` load against f32 on the same checkpoint from transformers' own initialization
(`from_config`: N(0, 0.02); tests/models/test_q8_0_families.py). The tests assert the same figures; this
prints them in one table. Nothing here is timed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "models"))

#: family -> (model_type, config overrides, seed): the fixtures of tests/models
EXTRA = {
    "mamba2": ("mamba2", {}, 0),
    "qwen3_next": ("qwen3_next", {}, 0),
    "qwen3_next_moe": ("qwen3_next", {"mlp_only_layers": [], "num_experts": 4, "num_experts_per_tok": 2,
                                      "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
                                      "norm_topk_prob": True, "decoder_sparse_step": 1}, 1),
}


def peaked_model(family: str):
    import hf_checkpoints
    import recurrent_checkpoints

    if family in hf_checkpoints.FAMILY_CONFIGS:
        return hf_checkpoints.random_model(family, seed=2 if family == "mixtral" else 0)
    model_type, overrides, seed = EXTRA[family]
    return recurrent_checkpoints.random_model(model_type, seed=seed, **overrides)


def row(family: str, new_tokens: int) -> str:
    from hf_checkpoints import cosine, hf_greedy, hf_logits, prompt, save_checkpoint
    from test_q8_0_families import default_init_model

    from rlx.models.causal_lm import CausalLM

    model = peaked_model(family)
    with tempfile.TemporaryDirectory() as d:
        lm = CausalLM.from_pretrained(save_checkpoint(model, Path(d)), context_length=72, prefill_chunk=48)
    errs, coss = [], []
    for length in (1, 40):
        ids = prompt(length, seed=length)
        ours, theirs = lm.logits(ids), hf_logits(model, ids)
        errs.append(float(np.abs(ours - theirs).max()) / float(np.abs(theirs).max()))
        coss.append(cosine(ours, theirs))
    ids = prompt(12, seed=3)
    expected = hf_greedy(model, ids, new_tokens)
    same = lm.generate(ids, max_new_tokens=new_tokens).token_ids == expected
    q8_family = "qwen3_next_moe" if family == "qwen3_next" else family
    plain = default_init_model(q8_family)
    with tempfile.TemporaryDirectory() as d:
        q8 = CausalLM.from_pretrained(save_checkpoint(plain, Path(d)), quantize="q8_0", context_length=48,
                                      prefill_chunk=48)
    ids = prompt(40, seed=11)
    q8_cos = cosine(q8.logits(ids), hf_logits(plain, ids))
    return (f"| {family} | {max(errs):.2e} | {min(coss):.8f} | {'same' if same else 'DIFFERENT'} "
            f"({len(expected)} tokens) | {q8_cos:.5f} |")


def main() -> None:
    import hf_checkpoints

    families = [*sorted(hf_checkpoints.FAMILY_CONFIGS), *EXTRA]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(families))
    p.add_argument("--new-tokens", type=int, default=24)
    args = p.parse_args()
    print("| family | max abs / max|logit| | min cos | greedy tokens vs transformers | q8_0 cos vs f32 |")
    print("|---|---|---|---|---|")
    for family in args.families.split(","):
        print(row(family, args.new_tokens), flush=True)


if __name__ == "__main__":
    main()
