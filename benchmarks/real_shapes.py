"""headlens classify at real model shapes, next to a plain ``transformers`` forward over the same tokens.

    python benchmarks/real_shapes.py                     # GPT-2 small and a 2-layer Llama-3.2-1B shape
    python benchmarks/real_shapes.py --llama-layers 4 --n-prompts 32 --seq-len 128 --device auto

Models (random weights, float32 on disk, no tokenizer: the probes draw ids from the whole vocabulary):

* ``gpt2-small``: 12 layers x 12 heads, d_model 768, vocab 50257 (GPT-2 small's shape);
* ``llama-3.2-1b``: Llama-3.2-1B's shape (d_model 2048, 32 query heads over 8 key/value heads,
  d_head 64, MLP 8192, vocab 128256, tied embeddings, RoPE theta 500000) with fewer layers.

For each model and dtype, in one fresh process that holds all three contenders, timed round-robin
(median of ``--repeats``, after a warm-up) so that a noisy shared CPU slows every contender alike:
``classify`` = ``headlens.classify`` with every default *pattern* detector (generated probes) through
TransformerBridge; ``bridge fwd`` = the bridge's plain forwards over exactly the token batches the scan
ran (same probes, collation and batch size), no hooks; ``hf eager`` / ``hf sdpa`` = ``AutoModelForCausalLM``
forwards over the same batches. The weight-based ``ov_copying``
detector reads no tokens; it is timed once on its own (its ``W_U W_E`` product grows with the
vocabulary). Memory: the process's resident size once everything is loaded, and each contender's
peak *working* memory on top of it (RSS sampled every 5 ms on the CPU, ``max_memory_allocated`` on a GPU).
No assertions: timings are reported, not tested.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _timed(fn: Any, device: str) -> tuple[float, float]:
    """(seconds, peak working MB above the memory in use when ``fn`` started)."""
    import threading

    import torch

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_mb()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], _rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    if not cuda:
        sampler.start()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    stop.set()
    if cuda:
        return elapsed, (torch.cuda.max_memory_allocated() - base) / 2**20
    sampler.join()
    return elapsed, max(peak[0], _rss_mb()) - base


def _batches(model: Any, dets: Any, n_prompts: int, seq_len: int, batch_size: int) -> list[Any]:
    """The token batches ``classify`` scans (same probes, seeds and collation)."""
    from headlens.models.vocab import vocab
    from headlens.probes.base import collate
    from headlens.scoring.classification import _probes

    v = vocab(model)
    out = []
    for probe, _served in _probes(model, dets, None, n_prompts, seq_len, 0, False):
        for start in range(0, len(probe), batch_size):
            rows = range(start, min(start + batch_size, len(probe)))
            out.append(collate(probe, rows, model.is_causal, v.special, v.ordinary[0]).tokens)
    return out


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Every contender of one model and dtype in this (fresh) process, timed round-robin."""
    import statistics

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    import headlens
    from headlens.detectors.ov_copying import counts as copying
    from headlens.models.placement import resolve_device, resolve_dtype
    from headlens.scoring.classification import select_detectors

    device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    model = headlens.load(f"hf:{args.path}", device=device, dtype=dtype)
    kw = dict(n_prompts=args.n_prompts, seq_len=args.seq_len, batch_size=args.batch_size)
    ran = set(headlens.classify(model, **kw).detector)  # the default detectors that have targets here
    pattern = [d for d in select_detectors(model, None)[0] if d.kind != "weights" and d.name in ran]
    batches = _batches(model, pattern, args.n_prompts, args.seq_len, args.batch_size)
    hf = {impl: AutoModelForCausalLM.from_pretrained(args.path, attn_implementation=impl, dtype=dtype).to(device).eval()
          for impl in ("eager", "sdpa")}

    def forward(impl: str) -> Any:
        def run() -> None:
            with torch.inference_mode():
                for tokens in batches:
                    hf[impl](tokens.to(device))
        return run

    def bridge_forward() -> None:  # the same forwards through TransformerBridge, no hook, no statistics
        with torch.inference_mode():
            for tokens in batches:
                model(tokens.to(device))

    contenders = {
        "classify": lambda: headlens.classify(model, detectors=[d.name for d in pattern], **kw),
        "bridge fwd": bridge_forward, "hf eager": forward("eager"), "hf sdpa": forward("sdpa"),
    }
    result: dict[str, Any] = {"tokens": int(sum(b.numel() for b in batches)), "loaded_mb": _rss_mb(),
                              "copying_s": _timed(lambda: copying(model), device)[0]}
    for fn in contenders.values():
        fn()  # warm-up
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, fn in contenders.items():
            runs[name].append(_timed(fn, device))
    for name, values in runs.items():
        result[name] = {"s": statistics.median(t for t, _ in values), "peak_mb": max(m for _, m in values)}
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
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (median)")
    parser.add_argument("--worker", nargs=2, metavar=("PATH", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.path, args.dtype = args.worker
        print(json.dumps(worker(args)))
        return
    root = Path(args.root or tempfile.mkdtemp(prefix="headlens-real-shapes-"))
    print(f"device {args.device}, {args.threads} threads, {args.n_prompts} prompts x {args.seq_len} tokens per "
          f"probe, batch {args.batch_size}; models in {root}")
    print(f"{'model':<14}{'dtype':<10}{'contender':<10}{'tokens':>7}{'time s':>9}{'tok/s':>8}"
          f"{'vs hf eager':>12}{'vs hf sdpa':>11}{'working MB':>11}")
    for shape in args.shapes.split(","):
        path = build(shape, root, args.llama_layers)
        for dtype in args.dtypes.split(","):
            cmd = [sys.executable, __file__, "--worker", str(path), dtype, "--device", args.device,
                   "--n-prompts", str(args.n_prompts), "--seq-len", str(args.seq_len), "--repeats", str(args.repeats),
                   "--batch-size", str(args.batch_size), "--threads", str(args.threads)]
            env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode:
                print(f"{shape:<14}{dtype:<10}failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            for name in ("classify", "bridge fwd", "hf eager", "hf sdpa"):
                c = r[name]
                print(f"{shape:<14}{dtype:<10}{name:<10}{r['tokens']:>7}{c['s']:>9.2f}{r['tokens'] / c['s']:>8.0f}"
                      f"{c['s'] / r['hf eager']['s']:>11.2f}x{c['s'] / r['hf sdpa']['s']:>10.2f}x{c['peak_mb']:>11.0f}")
            print(f"{'':<24}process with the bridge and both HF models loaded: {r['loaded_mb']:.0f} MB; "
                  f"copying (weights only): {r['copying_s']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
