"""Speculative decoding: a drafter proposes k tokens, the target verifies them in one step of k+1 rows.

A step feeds the target the last produced token followed by the k proposed ones (`CausalLM.step`,
one row of k+1 positions) and reads the logits of every position. Greedy decoding keeps the proposed
tokens while each equals the target's argmax at the position before it, then takes the target's own
token at the first disagreement (or after the last proposal): every step yields at least one token,
and the tokens are those of plain greedy decoding as long as the target's rows of a k+1-row step equal
its one-row steps (the decode kernels' per-row arithmetic does not depend on the number of rows).

Sampling keeps the target's distribution with the standard accept/reject rule: a proposed token d
drawn from the drafter's distribution q is kept with probability min(1, p(d) / q(d)), p being the
target's distribution after temperature, top-k and top-p (`target_distribution`); at the first
rejection the token is drawn from the residual max(0, p - q), renormalized; when all k are kept, one
more token is drawn from p at the last row. Prompt lookup proposes deterministically (q is one-hot).

Rejected tokens leave the KV cache by `KvCache.truncate`: the cache then holds exactly the tokens
kept, as if the rejected ones had never been fed (a step appends, truncate forgets the tail).

Drafters:

* `PromptLookup` (no model): the longest earlier match of the text's tail in the prompt and the text
  so far proposes the tokens that followed it, no more than the match is long (good on tasks that
  echo their input: editing code, quoting, summarizing with citations).
* `DraftModel`: a smaller `CausalLM` sharing the target's tokenizer, with its own KV cache.

`AdaptiveK` sizes each step's proposal: all proposals kept grows k, fewer than half shrinks it, so a
drafter that keeps missing costs little more than plain decoding.

>>> import numpy as np
>>> from rlx.models.causal_lm import CausalLM, random_tensors
>>> from rlx.models.decoder_config import DecoderConfig
>>> from rlx.models.llama import random_specs
>>> cfg = DecoderConfig(arch="llama", vocab_size=32, hidden_size=32, num_layers=1, num_heads=4,
...                     num_kv_heads=2, head_dim=8, ffn_size=48, rms_eps=1e-5, rope_base=10000.0,
...                     rope_variant="interleaved", n_rot=8, context_length=64, tie_embeddings=True,
...                     bos_id=-1, eos_id=-1)
>>> lm = CausalLM(cfg, random_tensors(random_specs(cfg), seed=0), device="reference", max_context=48)
>>> prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
>>> plain = lm.generate(prompt, max_new_tokens=8).token_ids
>>> fast = lm.generate(prompt, max_new_tokens=8, speculative="prompt_lookup")
>>> fast.token_ids == plain, fast.timings["speculative_steps"] <= 8
(True, True)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rlx.errors import RlxError
from rlx.ir.ops_sample import kept_weights
from rlx.models.sampling import Sampler

#: A `rlx.models.causal_lm.CausalLM` (not imported: causal_lm imports this module).
CausalLM = Any

#: The names `speculative=` takes besides a drafter object or a draft `CausalLM`.
DRAFTER_NAMES = ("prompt_lookup",)


class Drafter(Protocol):
    """What proposes tokens: `propose(context, k, sampler)` returns up to k token ids and, for sampled
    proposals, their distributions `[len, vocab]` (None: chosen deterministically, q one-hot)."""

    def propose(self, context: Sequence[int], k: int, sampler: Sampler) -> tuple[list[int], np.ndarray | None]:
        ...


@dataclass
class PromptLookup:
    """Proposes the tokens that followed an earlier occurrence of the context's last tokens.

    Every earlier position holding the context's last token is a candidate; each is extended backwards
    while it keeps matching the context's tail (up to `max_ngram` tokens). The longest match wins, the
    most recent among equally long ones, and needs `min_ngram` tokens at least. It proposes no more
    tokens than the match is long: a short match is weak evidence (where an edited copy departs from its
    source, the last two tokens often recur elsewhere), a long one proposes up to k. No model and no
    state: the context (prompt plus tokens so far) is all it reads.

    >>> PromptLookup().propose([1, 2, 3, 9, 9, 1, 2], 3, Sampler())  # "1 2": two tokens at most
    ([3, 9], None)
    >>> PromptLookup().propose([5, 1, 2, 3, 4, 6, 3, 4, 7, 1, 2, 3, 4], 3, Sampler())  # "1 2 3 4" beats "3 4"
    ([6, 3, 4], None)
    >>> PromptLookup().propose([1, 2, 3], 3, Sampler())
    ([], None)
    """

    #: Matches longer than this are not told apart (the most recent of them wins).
    max_ngram: int = 16
    #: Single-token matches propose mostly noise in free text: two tokens at least.
    min_ngram: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise RlxError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")

    def propose(self, context: Sequence[int], k: int, sampler: Sampler) -> tuple[list[int], np.ndarray | None]:
        ctx = np.asarray(context, dtype=np.int64)
        last = ctx.size - 1
        # the ends of the matches of length `length` (positions before the context's own last one)
        ends = np.flatnonzero(ctx[:last] == ctx[last]) if last > 0 else ctx[:0]
        length = 1
        while ends.size and length < self.max_ngram:
            room = ends[ends >= length]  # a token before the match, to extend it by
            longer = room[ctx[room - length] == ctx[last - length]]
            if not longer.size:
                break
            ends, length = longer, length + 1
        if not ends.size or length < self.min_ngram:
            return [], None
        start = int(ends[-1]) + 1
        return [int(t) for t in ctx[start:start + min(k, length)]], None


class DraftModel:
    """A smaller `CausalLM` (same tokenizer) drafting with its own KV cache.

    Greedy targets get the draft's argmax tokens; sampling targets get tokens sampled from the draft's
    distribution under the same settings, with those distributions (the accept/reject rule needs q).
    """

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm
        self.cache = lm.new_cache()
        self.fed: list[int] = []  # the tokens the draft's cache holds, in order

    def check_compatible(self, target: CausalLM) -> None:
        if self.lm.config.vocab_size != target.config.vocab_size:
            raise RlxError(f"the draft model's vocabulary ({self.lm.config.vocab_size} tokens) differs from the "
                           f"target's ({target.config.vocab_size}): a draft model must share the tokenizer")

    def propose(self, context: Sequence[int], k: int, sampler: Sampler) -> tuple[list[int], np.ndarray | None]:
        k = min(k, self.lm.max_context - len(context))
        if k < 1:
            return [], None
        keep = _common_prefix(self.fed, context)
        if keep == len(context):  # at least the last token is fed again, for its logits
            keep -= 1
        self.cache.truncate(keep)
        new = np.asarray(context[keep:], dtype=np.int64)
        logits = None
        for start in range(0, new.size, self.lm.prefill_chunk):
            chunk = new[start:start + self.lm.prefill_chunk]
            logits = self.lm.step(chunk[None, :], self.cache, [chunk.size - 1])
        self.fed = list(context)
        tokens: list[int] = []
        dists: list[np.ndarray] = []
        for i in range(k):
            assert logits is not None
            if sampler.greedy:
                tokens.append(int(np.argmax(logits[0])))
            else:
                q = target_distribution(logits[0], sampler)
                dists.append(q)
                tokens.append(_draw(q, sampler))
            if i == k - 1:
                break
            logits = self.lm.step(np.array([[tokens[-1]]]), self.cache, [0])
            self.fed.append(tokens[-1])
        return tokens, (np.stack(dists) if dists else None)


@dataclass
class AdaptiveK:
    """The proposal length: `k` grows by one (to `k_max`) after a step that kept every proposal, and
    shrinks by one (to `k_min`) after a step that kept fewer than half. A step at `k_min` that kept
    nothing rests the drafter for a few steps (1, then 2, 4, ... up to `max_rest` while it keeps
    failing): plain one-row steps, so text the drafter cannot predict costs no verification rows.

    >>> a = AdaptiveK(k=4, k_max=6); a.update(4, 4); a.k
    5
    >>> a.update(5, 1); a.k
    4
    >>> b = AdaptiveK(k=1); b.update(1, 0); [b.proposal() for _ in range(3)]
    [0, 1, 1]
    """

    k: int = 4
    k_min: int = 1
    #: 7: a step verifying 7 proposals has 8 rows, which the CPU's f32 decode GEMVs multiply with each
    #: unpacked weight block at once (their 8-row tile); a 9th row unpacks every block again (SmolLM2-135M
    #: on AVX2: 8 rows cost ~2.4 one-row steps, 9 rows ~3).
    k_max: int = 7
    max_rest: int = 32
    _rest: int = field(default=0, repr=False)
    _backoff: int = field(default=1, repr=False)

    def proposal(self) -> int:
        """How many tokens to propose this step (0 while resting)."""
        if self._rest > 0:
            self._rest -= 1
            return 0
        return self.k

    def update(self, proposed: int, kept: int) -> None:
        if proposed == 0:
            return
        if kept == proposed:
            self.k = min(self.k + 1, self.k_max)
            self._backoff = 1
        elif 2 * kept < proposed:
            if kept == 0 and self.k == self.k_min:
                self._rest, self._backoff = self._backoff, min(2 * self._backoff, self.max_rest)
            self.k = max(self.k - 1, self.k_min)


@dataclass
class SpecStats:
    """What `Generation.timings` reports of a speculative generation."""

    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    produced: int = 0
    ks: list[int] = field(default_factory=list)

    def step(self, proposed: int, kept: int, k: AdaptiveK) -> None:
        """One verify step: `proposed` draft tokens, `kept` of them accepted; `k` learns from it."""
        self.steps += 1
        self.proposed += proposed
        self.accepted += kept
        k.update(proposed, kept)

    def timings(self) -> dict[str, float]:
        return {"speculative_steps": float(self.steps), "draft_tokens": float(self.proposed),
                "accepted_tokens": float(self.accepted),
                "acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
                "tokens_per_step": self.produced / self.steps if self.steps else 0.0}


def make_drafter(speculative: Any, target: CausalLM) -> Drafter:
    """The drafter `speculative=` names: "prompt_lookup", a draft `CausalLM`, or a drafter object."""
    if isinstance(speculative, str):
        if speculative == "prompt_lookup":
            return PromptLookup()
        raise RlxError(f"unknown speculative drafter {speculative!r}; expected one of {DRAFTER_NAMES}, "
                       "a draft CausalLM or an object with a propose(context, k, sampler) method")
    if all(callable(getattr(speculative, m, None)) for m in ("step", "new_cache")):  # a draft CausalLM
        draft = DraftModel(speculative)
        draft.check_compatible(target)
        return draft
    if callable(getattr(speculative, "propose", None)):
        return speculative
    raise RlxError("speculative= takes 'prompt_lookup', a draft CausalLM or a drafter, "
                   f"got {type(speculative).__name__}")


def target_distribution(logits: np.ndarray, sampler: Sampler) -> np.ndarray:
    """The probabilities (f64 `[vocab]`) a sampler draws a row's token from: softmax(logits / temperature)
    over its top-k, cut to the smallest prefix reaching top-p, renormalized (`sample_rows`' kept set)."""
    row = np.asarray(logits, dtype=np.float32)
    probs = np.zeros(row.size, dtype=np.float64)
    order, w, c = kept_weights(row, sampler.temperature, sampler.top_k, sampler.top_p)
    probs[order] = w / c[-1]
    return probs


def _draw(probs: np.ndarray, sampler: Sampler) -> int:
    c = np.cumsum(probs)
    return int(min(np.searchsorted(c, sampler.uniforms(1)[0] * c[-1], side="right"), probs.size - 1))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def accept(target_logits: np.ndarray, proposed: Sequence[int], q: np.ndarray | None,
           sampler: Sampler) -> tuple[int, int]:
    """(how many proposals are kept, the token after them) for `target_logits` `[k+1, vocab]`.

    Greedy: proposals are kept while each is the argmax of the row before it; the next token is the
    argmax of the first row not matched. Sampling: the accept/reject rule of the module docstring.
    """
    if sampler.greedy:
        return accept_greedy(np.argmax(target_logits, axis=-1), proposed)
    for i, token in enumerate(proposed):
        p = target_distribution(target_logits[i], sampler)
        q_token = 1.0 if q is None else float(q[i][token])
        if sampler.uniforms(1)[0] * q_token < p[token]:  # kept with probability min(1, p / q)
            continue
        residual = np.maximum(p - (_one_hot(token, p.size) if q is None else q[i]), 0.0)
        total = residual.sum()
        return i, (_draw(residual / total, sampler) if total > 0 else _draw(p, sampler))
    return len(proposed), _draw(target_distribution(target_logits[len(proposed)], sampler), sampler)


def accept_greedy(best: Sequence[int] | np.ndarray, proposed: Sequence[int]) -> tuple[int, int]:
    """Greedy `accept` from the target's argmax ids `best` (`[k+1]`, one per verified row): the proposals
    kept while each equals the argmax of the row before it, and the argmax of the first row not matched.

    >>> accept_greedy([7, 8, 2, 5], [7, 8, 9])
    (2, 2)
    """
    kept = 0
    while kept < len(proposed) and int(best[kept]) == proposed[kept]:
        kept += 1
    return kept, int(best[kept])


def _one_hot(token: int, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=np.float64)
    out[token] = 1.0
    return out


def speculative_tokens(lm: CausalLM, prompt: list[int], max_new: int, sampler: Sampler,
                       stop_ids: frozenset[int], reasons: list[str], drafter: Drafter,
                       k: AdaptiveK, stats: SpecStats) -> Iterator[int]:
    """The new tokens of one sequence, several per target step; `reasons[0]` says why it ended
    ("stop", "length" or "context"), as `CausalLM._steps` does."""
    reasons[:] = ["length"]
    if max_new == 0:
        return
    cache = lm._own_cache()
    logits = None
    for start in range(0, len(prompt), lm.prefill_chunk):
        chunk = np.asarray(prompt[start:start + lm.prefill_chunk], dtype=np.int64)
        logits = lm.step(chunk[None, :], cache, [chunk.size - 1])
    assert logits is not None
    token = int(sampler.pick(logits)[0])
    context = list(prompt)
    produced = 0
    while True:
        if token in stop_ids:
            reasons[:] = ["stop"]
            return
        yield token
        produced += 1
        stats.produced = produced
        if produced == max_new:
            return
        context.append(token)
        room = min(max_new - produced - 1, cache.capacity - int(cache.lengths[0]) - 1)
        if room < 0:
            reasons[:] = ["context"]
            return
        want = min(k.proposal(), room, lm.prefill_chunk - 1)
        proposed, q = drafter.propose(context, want, sampler) if want > 0 else ([], None)
        proposed = proposed[:want]
        before = int(cache.lengths[0])
        fed = np.asarray([token, *proposed], dtype=np.int64)[None, :]
        rows = np.arange(fed.shape[1])
        if sampler.greedy:  # each row's argmax, taken where the logits are (as plain greedy steps take it)
            kept, token = accept_greedy(lm.step_greedy(fed, cache, rows), proposed)
        elif proposed:
            kept, token = accept(lm.step(fed, cache, rows), proposed, q, sampler)
        else:  # nothing to verify: a plain decode step
            kept, token = 0, int(sampler.pick(lm.step(fed, cache, rows))[0])
        cache.truncate(before + 1 + kept)
        stats.step(len(proposed), kept, k)
        for t in proposed[:kept]:
            if t in stop_ids:
                reasons[:] = ["stop"]
                return
            yield t
            produced += 1
            stats.produced = produced
            context.append(t)
            if produced == max_new:
                return


__all__ = ["DRAFTER_NAMES", "AdaptiveK", "DraftModel", "Drafter", "PromptLookup", "SpecStats", "accept",
           "accept_greedy", "make_drafter", "speculative_tokens", "target_distribution"]
