"""``tl_compatible`` reproduces TransformerLens' ``head_detector.detect_head`` within 1e-5.

Three references: TL's own mask builders and similarity function applied to headlens'
cached patterns (native model), and TL's ``detect_head`` itself run on the TransformerBridge
of (a) a native model exported to a Hugging Face GPT-2 directory and (b) MiniLM.
"""

from __future__ import annotations

import torch

import headlens
from headlens.detectors.tl_compat import TL_NAMES
from tests.conftest import make_gpt

TEXTS = [
    "def f(x): return f(x) + f(x)",
    "the cat sat on the mat and the cat sat",
    "import os, sys; import os",
    "abcabcabc xyz xyz",
    "[[1, 2], [3, 4]]",
    "for i in range(10): print(i, i)",
]


def _ours(model, texts=TEXTS):
    df = headlens.classify(model, prompts=texts, tl_compatible=True, n_boot=50)
    assert set(df.detector) == set(TL_NAMES)
    return {d: torch.tensor(g.sort_values(["layer", "head"]).score.to_numpy()).reshape(model.n_layers, -1)
            for d, g in df.groupby("detector")}


def test_matches_tl_math_on_cached_native_patterns():
    from transformer_lens import head_detector as hd

    model = make_gpt(seed=5)
    ours = _ours(model)
    for det, tl_name in TL_NAMES.items():
        per_prompt = []
        for text in TEXTS:
            tokens = model.to_tokens(text)
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
            mask = getattr(hd, f"get_{tl_name}_detection_pattern")(tokens.cpu())
            per_prompt.append(torch.tensor([[hd.compute_head_attention_similarity_score(
                cache.pattern(layer)[0, head], mask, exclude_bos=False, exclude_current_token=False,
                error_measure="mul") for head in range(model.n_heads)] for layer in range(model.n_layers)]))
        torch.testing.assert_close(ours[det], torch.stack(per_prompt).mean(0).double(), atol=1e-5, rtol=0)


def _detect_head_on(bridge_model, texts=TEXTS):
    from transformer_lens.head_detector import detect_head

    return {det: detect_head(bridge_model.bridge, texts, tl_name).double() for det, tl_name in TL_NAMES.items()}


def test_matches_detect_head_on_an_exported_native_model(tmp_path):
    from headlens.models.export import export_hf

    native = make_gpt(seed=6, n_ctx=64)
    export_hf(native, tmp_path / "hf")
    bridged = headlens.load(f"hf:{tmp_path / 'hf'}")
    assert torch.equal(bridged.to_tokens(TEXTS[0]), native.to_tokens(TEXTS[0]))
    from headlens.detectors.ov_copying import eigen_scores

    torch.testing.assert_close(eigen_scores(bridged), eigen_scores(native), atol=1e-5, rtol=0)  # via TL
    ref = _detect_head_on(bridged)
    for source in (native, bridged):  # the same numbers from headlens' own model and from the bridge
        ours = _ours(source)
        for det in TL_NAMES:
            torch.testing.assert_close(ours[det], ref[det], atol=1e-5, rtol=0)


def test_matches_detect_head_on_minilm(minilm):
    texts = TEXTS[:4]  # detect_head runs one full cached forward per prompt and head type
    ref = _detect_head_on(minilm, texts)
    ours = _ours(minilm, texts)
    for det in TL_NAMES:
        torch.testing.assert_close(ours[det], ref[det], atol=1e-5, rtol=0)


def test_minilm_headlens_scores_are_plausible(minilm):
    """The same bridged model in headlens' own scoring: L0H2 is MiniLM's previous-token head."""
    df = headlens.classify(minilm, detectors="previous_token,next_token,first_token", n_prompts=12, seq_len=32,
                           n_boot=100)
    labelled = df[df.label]
    prev = labelled[labelled.detector == "previous_token"]
    assert list(zip(prev.layer, prev["head"], strict=True)) == [(0, 2)]
    assert (labelled.detector == "first_token").sum() >= 10  # [CLS] is a common sink in BERT-style models
    assert minilm.active_hooks() == []
