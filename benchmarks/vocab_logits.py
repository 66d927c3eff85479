"""Memory on a large vocabulary: an ablation sweep on a 262k-token vocabulary, peak memory against a classify.

A tiny random Gemma 3 (``tests/hf_families.py``: 2 layers, d_model 64, its small tokenizer) is built with
``vocab_size=262144`` (Gemma's vocabulary): its weights are ~140 MB, so what the loss metrics hold dominates.
Each measurement runs in its own child process and reports that child's own peak RSS (``VmHWM``, see
``benchmarks/circuits_smollm2.py``): a classify of the model (default probes), then
``headlens.sweep(method="mean", metrics=["repeated_loss"])`` over every head, the same as
``headlens ablate --method mean --metric repeated_loss``. Goal: the sweep's peak <= 1.5x the classify's.

Measured on a shared 2-core machine (peaks are the children's own; times are indicative only): before the
logits work (logits reduced in chunks, never held whole), ablate 8.78 GB against classify 0.71 GB (12.3x; 266 s); after it, 0.94 GB against 0.71 GB (1.32x;
103 s), sum of |delta| unchanged (0.078325).

    python benchmarks/vocab_logits.py [--vocab 262144]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(kind: str, path: str) -> None:
    import torch

    import headlens
    from benchmarks.circuits_smollm2 import peak_rss_gb

    torch.set_num_threads(1)
    model = headlens.load(f"hf:{path}")
    t0 = time.perf_counter()
    out = {}
    if kind == "classify":
        headlens.classify(model)
    else:
        df = headlens.sweep(model, method="mean", metrics=["repeated_loss"])
        out["delta_sum"] = float(df["delta"].abs().sum())
    out.update(wall=time.perf_counter() - t0, rss_gb=peak_rss_gb())
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "PATH"))
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    sys.path.insert(0, str(ROOT))
    from tests.hf_families import build

    with tempfile.TemporaryDirectory() as tmp:
        path = build("gemma3", Path(tmp) / "gemma3", vocab_size=args.vocab)
        runs = {}
        for kind in ("classify", "ablate"):
            res = subprocess.run([sys.executable, __file__, "--child", kind, str(path)], capture_output=True,
                                 text=True, check=True, cwd=ROOT, env={**_env(), "PYTHONPATH": str(ROOT)})
            runs[kind] = json.loads(res.stdout.strip().splitlines()[-1])
    c, a = runs["classify"], runs["ablate"]
    print(f"tiny random Gemma 3, vocabulary {args.vocab}: classify peak {c['rss_gb']:.2f} GB ({c['wall']:.1f} s); "
          f"ablate --method mean --metric repeated_loss peak {a['rss_gb']:.2f} GB ({a['wall']:.1f} s); "
          f"ratio {a['rss_gb'] / c['rss_gb']:.2f} (goal <= 1.5); sum |delta| {a['delta_sum']:.6f}")


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


if __name__ == "__main__":
    main()
