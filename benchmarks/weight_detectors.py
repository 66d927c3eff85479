"""The weight detectors (ov_copying, ov_suppression, successor) on a real LM: wall and CPU seconds, by part.

    python benchmarks/weight_detectors.py                 # SmolLM2-135M: 270 heads, 49,152 tokens
    python benchmarks/weight_detectors.py --model hf:DIR --threads 2

The issue's bound is 10 s on 2 cores for all of them. Parts, in the order ``classify`` meets them, each
timed cold (the memo that lets ov_copying and ov_suppression share one ranking is cleared first):
the vocabulary scan (``models.vocab``: which tokens are ordinary; ``classify`` needs it anyway for other
probes), the folded readout, the exact ranks of 256 sampled tokens, the successor lists, the eigenvalue
column; then the three through ``headlens.classify`` as a user runs them. No assertions: timings are
reported, not tested.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import headlens


def _timed(name: str, fn: Callable[[], Any]) -> Any:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    print(f"{name:<34} {time.perf_counter() - t0:6.2f} s wall {time.process_time() - c0:6.2f} s CPU", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = headlens.load(args.model)
    from headlens.detectors import ov_copying, successor
    from headlens.models.vocab import vocab
    from headlens.readout.ov import forget, readout
    from headlens.readout.ranks import self_ranks

    print(f"{model.name}: {model.n_layers} x {model.n_heads} heads, d_vocab {model.cfg.d_vocab}, "
          f"{torch.get_num_threads()} threads")
    _timed("vocabulary scan (cached per model)", lambda: vocab(model))
    _timed("readout (norms folded)", lambda: readout(model))
    r = _timed("ranks of 256 tokens (both cuts)", lambda: self_ranks(model))
    print(f"{'':<34} {r.whole_rows} of {r.top.numel() * r.n} (head, token) pairs needed their whole row")
    _timed("successor lists", lambda: successor.counts(model))
    _timed("eigen column (W_U W_E, float32)", lambda: ov_copying.eigen_scores(model))
    forget(model)
    _timed("classify, the three detectors", lambda: headlens.classify(
        model, detectors="ov_copying,ov_suppression,successor"))


if __name__ == "__main__":
    main()
