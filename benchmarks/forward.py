"""Forward-pass and start-up cost of headlens next to Hugging Face GPT-2, on the same weights.

    python benchmarks/forward.py                      # d_head=64 as GPT-2 small, 4 x 4 heads: seconds on CPU
    python benchmarks/forward.py --layers 12 --d-model 768 --heads 12 --batch 1 --seq 512

One process, one random model exported with ``headlens.models.export.export_hf`` so every contender
runs exactly the same weights on the same tokens. Runs are interleaved (round-robin) and the
median is reported, so a noisy shared CPU hurts every contender alike. Prints ratios against
the targets: unhooked headlens <= 1.1x HF sdpa; headlens with a pattern hook <= 1.1x HF eager;
``import headlens`` <= 1.3x ``import torch``. No assertions: timings are reported, not tested.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def median_times(contenders: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median wall time (s) of each callable, measured round-robin."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def import_times(repeats: int) -> dict[str, float]:
    """Median wall time of a fresh interpreter importing torch, and importing headlens with its model.

    ``import headlens`` alone imports no torch (names resolve on first use), so the headlens side
    also touches ``headlens.GPT``: the cost a user pays before building a model.
    """
    cmds = {"import torch": "import torch", "import headlens": "import headlens; headlens.GPT"}
    contenders = {
        name: (lambda code=code: subprocess.run([sys.executable, "-c", code], check=True))
        for name, code in cmds.items()
    }
    return median_times(contenders, repeats, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--import-repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import GPT2LMHeadModel

    from headlens import GPT, ModelConfig
    from headlens.models.export import export_hf

    cfg = ModelConfig(n_layers=args.layers, n_heads=args.heads, d_model=args.d_model, n_ctx=max(args.seq, 128), d_vocab=257)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    tokens = torch.randint(0, 256, (args.batch, args.seq))
    with tempfile.TemporaryDirectory() as tmp:
        export_hf(model, tmp)
        hf = {impl: GPT2LMHeadModel.from_pretrained(tmp, attn_implementation=impl).eval() for impl in ("sdpa", "eager")}

    patterns = lambda name: name.endswith("attn.hook_pattern")  # noqa: E731

    def observe(pattern: torch.Tensor, hook: object) -> None:
        pattern.max()  # touch it, as a detector would

    def hooked() -> torch.Tensor:
        return model.run_with_hooks(tokens, fwd_hooks=[(patterns, observe)])

    contenders = {
        "headlens": lambda: model(tokens),
        "headlens + pattern hook": hooked,
        "HF GPT-2 sdpa": lambda: hf["sdpa"](tokens).logits,
        "HF GPT-2 eager": lambda: hf["eager"](tokens).logits,
    }
    with torch.inference_mode():
        diff = float((contenders["headlens"]() - contenders["HF GPT-2 sdpa"]()).abs().max())
        t = median_times(contenders, args.repeats)
    imp = import_times(args.import_repeats)

    print(f"model: {args.layers} layers x {args.heads} heads, d_model={args.d_model}; tokens {args.batch} x {args.seq}; "
          f"{args.threads} threads; median of {args.repeats} (max |logit diff| vs HF: {diff:.1e})")
    for name, secs in t.items():
        print(f"  {name:<26} {secs * 1e3:8.1f} ms")
    for name, secs in imp.items():
        print(f"  {name:<26} {secs * 1e3:8.1f} ms  (fresh interpreter, median of {args.import_repeats})")
    rows = [
        ("headlens / HF sdpa", t["headlens"] / t["HF GPT-2 sdpa"], 1.1),
        ("headlens+pattern / HF eager", t["headlens + pattern hook"] / t["HF GPT-2 eager"], 1.1),
        ("import headlens / torch", imp["import headlens"] / imp["import torch"], 1.3),
    ]
    print("ratios (target):")
    for name, ratio, target in rows:
        print(f"  {name:<28} {ratio:5.2f}x  (<= {target}x) {'ok' if ratio <= target else 'OVER'}")


if __name__ == "__main__":
    main()
