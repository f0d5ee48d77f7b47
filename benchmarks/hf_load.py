"""Peak memory of loading a 1B-shaped Hugging Face checkpoint (LLaMA shape, bf16 safetensors, 4 shards).

    python benchmarks/hf_load.py [--dir /tmp/rlx-hf-1b] [--dtype bf16|f16] [--compile] [--keep]

Writes the checkpoint (hidden 2048, 16 layers, 32 heads / 8 KV heads, FFN 8192, vocabulary 128256,
untied: about 1.5B parameters, 3 GiB in bf16; the tensors are random rows tiled, which is all memory
use depends on) unless `--dir` already holds one, then loads it in fresh processes and prints each
one's peak RSS (`ru_maxrss`) and, at the end, its resident anonymous and file-backed memory (mapped
checkpoint pages are file-backed: the kernel drops them under pressure): `load_pretrained` alone
(config, headers, every tensor mapped and checked against the config), and with `--compile` a whole
`CausalLM.from_pretrained` on the CPU
(graph built, compiled, weights handed to the compiled model in their stored bf16, transposed once).
Memory only: nothing here is timed or asserted. The checkpoint is deleted at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 8192, "vocab_size": 128256}
SHARDS = 4


def tensor_shapes() -> dict[str, tuple[int, ...]]:
    h, f, v = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["vocab_size"]
    kv = SHAPE["num_key_value_heads"] * h // SHAPE["num_attention_heads"]
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(SHAPE["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                p + "mlp.down_proj.weight": (h, f)}
    return out


def write_checkpoint(directory: Path, dtype: str) -> None:
    """The safetensors shards written tensor by tensor (never the whole model in memory)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    np_dtype, st_dtype = (np.uint16, "BF16") if dtype == "bf16" else (np.float16, "F16")
    shapes = tensor_shapes()
    names = list(shapes)
    groups = [names[i::SHARDS] for i in range(SHARDS)]
    weight_map = {}
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{SHARDS:05d}.safetensors"
        header, offset = {}, 0
        for name in group:
            nbytes = int(np.prod(shapes[name])) * 2
            header[name] = {"dtype": st_dtype, "shape": list(shapes[name]), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(directory / file, "wb") as fh:
            fh.write(len(raw).to_bytes(8, "little"))
            fh.write(raw)
            for name in group:
                shape = shapes[name]
                block = (rng.standard_normal((min(64, shape[0]), shape[-1])) * 0.02).astype(np.float32)
                bits = (block.view(np.uint32) >> 16).astype(np.uint16) if dtype == "bf16" else block.astype(np_dtype)
                for start in range(0, shape[0], bits.shape[0]):
                    fh.write(bits[: min(bits.shape[0], shape[0] - start)].tobytes())
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    config = {"model_type": "llama", **SHAPE, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
              "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "hidden_act": "silu",
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    (directory / "config.json").write_text(json.dumps(config))


CHILD = """
import resource, sys, time
t = time.perf_counter()
if sys.argv[2] == "compile":
    from rlx.models.causal_lm import CausalLM
    lm = CausalLM.from_pretrained(sys.argv[1], context_length=256, prefill_chunk=64)
    what = "CausalLM.from_pretrained (compiled)"
else:
    from rlx.models.hf_load import load_pretrained
    loaded = load_pretrained(sys.argv[1])
    what = "load_pretrained (mapped, checked)"
status = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith("Rss"))
now = ", ".join(f"{k} {int(v.split()[0]) / 2**20:.2f} GiB" for k, v in status.items())
print(f"{what}: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB, "
      f"{time.perf_counter() - t:.1f} s; at the end: {now}")
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/rlx-hf-1b"))
    p.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    p.add_argument("--compile", action="store_true", help="also measure a whole CausalLM.from_pretrained")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint")
    args = p.parse_args()
    if not (args.dir / "config.json").is_file():
        write_checkpoint(args.dir, args.dtype)
    size = sum(f.stat().st_size for f in args.dir.glob("*.safetensors"))
    print(f"checkpoint: {args.dir}, {size / 2**30:.2f} GiB of {args.dtype} safetensors in {SHARDS} shards")
    for mode in ("load",) + (("compile",) if args.compile else ()):
        subprocess.run([sys.executable, "-c", CHILD, str(args.dir), mode], check=True)
    if not args.keep:
        shutil.rmtree(args.dir)


if __name__ == "__main__":
    main()
