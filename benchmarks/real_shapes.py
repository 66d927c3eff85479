"""headlens classify at real model shapes, next to a plain ``transformers`` forward over the same tokens.

    python benchmarks/real_shapes.py                     # GPT-2 small and a 2-layer Llama-3.2-1B shape
    python benchmarks/real_shapes.py --llama-layers 4 --n-prompts 32 --seq-len 128 --device auto

Models (random weights, float32 on disk, no tokenizer: the probes draw ids from the whole vocabulary):

* ``gpt2-small``: 12 layers x 12 heads, d_model 768, vocab 50257 (GPT-2 small's shape);
* ``llama-3.2-1b``: Llama-3.2-1B's shape (d_model 2048, 32 query heads over 8 key/value heads,
  d_head 64, MLP 8192, vocab 128256, tied embeddings, RoPE theta 500000) with fewer layers.

For each model and dtype, in fresh processes (so each peak memory is its own):
``classify`` = ``headlens.classify`` with every default detector (generated probes) through
TransformerBridge; ``hf eager`` / ``hf sdpa`` = ``AutoModelForCausalLM`` forwards over exactly the
token batches the scan ran (collated the same way, same batch size); ``copying`` (inside classify)
is timed on its own as well because its ``W_U W_E`` product grows with the vocabulary. Prints
times, the classify / hf ratios and peak memory (RSS on the CPU, ``max_memory_allocated`` on a GPU).
No assertions: timings are reported, not tested.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "gpt2-small": dict(config="GPT2Config", model="GPT2LMHeadModel",
                       kwargs=dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)),
    "llama-3.2-1b": dict(config="LlamaConfig", model="LlamaForCausalLM",
                         kwargs=dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                     num_key_value_heads=8, head_dim=64, vocab_size=128256,
                                     max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
                                     bos_token_id=128000, eos_token_id=128001)),
}


def build(shape: str, root: Path, llama_layers: int) -> Path:
    """Write a random-weight model of ``shape`` (float32 safetensors, no tokenizer) under ``root``."""
    import torch
    import transformers

    spec = SHAPES[shape]
    kwargs = dict(spec["kwargs"])
    if shape.startswith("llama"):
        kwargs["num_hidden_layers"] = llama_layers
    path = root / shape
    if not (path / "config.json").is_file():
        torch.manual_seed(0)
        model = getattr(transformers, spec["model"])(getattr(transformers, spec["config"])(**kwargs))
        model.save_pretrained(path)
    return path


def _peak_mb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def _batches(model: Any, n_prompts: int, seq_len: int, batch_size: int) -> list[Any]:
    """The token batches ``classify`` scans (same probes, seeds and collation)."""
    from headlens.classification import _probes, select_detectors
    from headlens.probes import collate
    from headlens.vocab import vocab

    dets, _, _ = select_detectors(model, None)
    v = vocab(model)
    pad = v.ordinary[0]
    out = []
    for probe, _served in _probes(model, dets, None, n_prompts, seq_len, 0, False):
        for start in range(0, len(probe), batch_size):
            rows = range(start, min(start + batch_size, len(probe)))
            out.append(collate(probe, rows, model.is_causal, v.special, pad).tokens)
    return out


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One contender in this (fresh) process: load, warm up once, time one full run."""
    import torch

    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    import headlens
    from headlens.placement import resolve_device, resolve_dtype

    device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    t0 = time.perf_counter()
    model = headlens.load(f"hf:{args.path}", device=device, dtype=dtype)
    result: dict[str, Any] = {"load_s": time.perf_counter() - t0}
    batches = _batches(model, args.n_prompts, args.seq_len, args.batch_size)
    result["tokens"] = int(sum(b.numel() for b in batches))
    if args.contender == "classify":
        def run() -> None:
            headlens.classify(model, n_prompts=args.n_prompts, seq_len=args.seq_len, batch_size=args.batch_size)
        from headlens.detectors.copying import scores as copying
        t0 = time.perf_counter()
        copying(model)
        result["copying_s"] = time.perf_counter() - t0
    else:
        from transformers import AutoModelForCausalLM

        del model
        hf = AutoModelForCausalLM.from_pretrained(args.path, attn_implementation=args.contender.split()[-1],
                                                  dtype=dtype).to(device).eval()

        def run() -> None:
            with torch.inference_mode():
                for tokens in batches:
                    hf(tokens.to(device))
    run()  # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    result["run_s"] = time.perf_counter() - t0
    result["peak_mb"] = _peak_mb(device)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--llama-layers", type=int, default=2, help="layers of the Llama-3.2-1B shape (real: 16)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | mps | auto")
    parser.add_argument("--n-prompts", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--root", default=None, help="folder for the generated models (default: a temp folder)")
    parser.add_argument("--worker", nargs=3, metavar=("PATH", "CONTENDER", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.path, args.contender, args.dtype = args.worker
        print(json.dumps(worker(args)))
        return
    root = Path(args.root or tempfile.mkdtemp(prefix="headlens-real-shapes-"))
    print(f"device {args.device}, {args.threads} threads, {args.n_prompts} prompts x {args.seq_len} tokens per "
          f"probe, batch {args.batch_size}; models in {root}")
    header = (f"{'model':<14}{'dtype':<10}{'contender':<10}{'tokens':>8}{'time s':>9}{'tok/s':>9}"
              f"{'vs hf eager':>12}{'vs hf sdpa':>11}{'peak MB':>10}")
    print(header)
    for shape in args.shapes.split(","):
        path = build(shape, root, args.llama_layers)
        for dtype in args.dtypes.split(","):
            rows = {}
            for contender in ("classify", "hf eager", "hf sdpa"):
                cmd = [sys.executable, __file__, "--worker", str(path), contender, dtype, "--device", args.device,
                       "--n-prompts", str(args.n_prompts), "--seq-len", str(args.seq_len),
                       "--batch-size", str(args.batch_size), "--threads", str(args.threads)]
                env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
                done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if done.returncode:
                    print(f"{shape:<14}{dtype:<10}{contender:<10} failed: {done.stderr.strip().splitlines()[-1:]}")
                    continue
                rows[contender] = json.loads(done.stdout.strip().splitlines()[-1])
            for contender, r in rows.items():
                ratio = {k: (r["run_s"] / rows[k]["run_s"] if k in rows else float("nan")) for k in ("hf eager", "hf sdpa")}
                print(f"{shape:<14}{dtype:<10}{contender:<10}{r['tokens']:>8}{r['run_s']:>9.2f}"
                      f"{r['tokens'] / r['run_s']:>9.0f}{ratio['hf eager']:>11.2f}x{ratio['hf sdpa']:>10.2f}x"
                      f"{r['peak_mb']:>10.0f}")
            if "classify" in rows:
                print(f"{'':<24}(classify includes copying: {rows['classify']['copying_s']:.2f} s; "
                      f"bridge load {rows['classify']['load_s']:.1f} s)")


if __name__ == "__main__":
    main()
