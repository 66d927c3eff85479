"""The parity figures of the README's Architectures table, measured on the test matrix's models.

    python analyses/architecture_matrix.py

For every family of ``tests/hf_families.py`` (tiny random models built in-process, nothing
downloads): the largest difference between headlens' ``hook_pattern`` and ``transformers``' eager
attentions, and between a ``hook_z`` ablation and an independent output-projection pre-hook
ablation (max over zero, mean and resample of two heads), on 2 prompts of 40 tokens, float32;
then the largest score difference between a bfloat16 and a float32 classify of the same model
(``nan`` where headlens refuses bfloat16 for the family: OLMo-2).
The tests (``tests/models/test_families.py``) assert the first two are <= 1e-5.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import torch

import headlens
from headlens.models.hf.boot import FLOAT32_ONLY

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "models")]  # the matrix's builders and its test module live there


def measure(family: str, root: Path) -> dict[str, float]:
    from hf_families import N_LAYERS, build
    from test_families import HEADS, Built, _reference, _tokens

    b = Built(family, build(family, root / family))
    tokens, reference = _tokens(b.model, 2, seed=1), _tokens(b.model, 3, seed=4)
    _, cache = b.model.run_with_cache(tokens, names_filter=lambda n: n.endswith("attn.hook_pattern"))
    with torch.no_grad():
        eager = b.hf(tokens, output_attentions=True).attentions
    pattern = max(float((cache[f"blocks.{i}.attn.hook_pattern"] - eager[i]).abs().max()) for i in range(N_LAYERS))
    ablation = 0.0
    for method in ("zero", "mean", "resample"):
        with torch.no_grad(), headlens.ablate(b.model, HEADS, method=method, reference=reference, seed=0):
            ours = b.model(tokens)
        ablation = max(ablation, float((ours - _reference(b, tokens, method, reference, ours)).abs().max()))
    kw = dict(n_prompts=16, seq_len=32, n_boot=200)
    if family in FLOAT32_ONLY:  # refused in one line: the bridge cannot run it in bfloat16
        return {"pattern": pattern, "ablation": ablation, "bf16": float("nan")}
    full = headlens.classify(b.model, **kw)
    half = headlens.classify(f"hf:{b.path}", dtype="bfloat16", **kw)
    return {"pattern": pattern, "ablation": ablation, "bf16": float((full.score - half.score).abs().max())}


def main() -> None:
    from hf_families import FAMILIES

    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    root = Path(tempfile.mkdtemp(prefix="headlens-matrix-"))
    print(f"{'family':<12}{'pattern vs eager':>18}{'ablation vs pre-hook':>22}{'bf16 vs fp32 score':>20}")
    for family in FAMILIES:
        r = measure(family, root)
        print(f"{family:<12}{r['pattern']:>18.1e}{r['ablation']:>22.1e}{r['bf16']:>20.4f}", flush=True)


if __name__ == "__main__":
    main()
