"""Reference parity: headlens == transformers GPT-2 == TransformerLens' TransformerBridge.

Random models (attention-only and full, with and without LayerNorm) are exported with
``headlens.models.export.export_hf``, booted by both references, and compared on logits and on every
``blocks.{l}.attn.hook_pattern`` / ``hook_z``: max abs diff <= 1e-5 in float32. Weights use a
larger init than GPT-2's so that attention patterns are far from uniform (a head mix-up would show).
No-LN models are exported in a wider residual stream (d_model + n_heads, orthogonal to the all-ones
vector) with one zero dimension per head (headlens/models/export.py), so their ``hook_z`` gains a zero column.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import make_gpt

from headlens import Tokenizer
from headlens.errors import HeadlensError
from headlens.models.export import export_hf, residual_embedding

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOL = 1e-5
CASES = {
    "full-ln": dict(),
    "attn-only-ln": dict(attn_only=True),
    "full-no-ln": dict(normalization="none"),
    "attn-only-no-ln-tied": dict(attn_only=True, normalization="none", tie_embeddings=True),
}


def _model(name: str):
    return make_gpt(sum(map(ord, name)), init_range=0.15, n_heads=4, d_model=32, **CASES[name])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = {}
    for name in CASES:
        model = _model(name)
        out[name] = (model, export_hf(model, tmp_path_factory.mktemp(name)))
    return out


@pytest.fixture(scope="module")
def tokens():
    torch.manual_seed(0)
    return torch.randint(0, 257, (3, 13))  # T=13 differs from n_heads and d_head on purpose


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).detach().abs().max())


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_transformers_gpt2_logits(exported, tokens, name, attn_implementation):
    from transformers import GPT2LMHeadModel

    model, path = exported[name]
    hf = GPT2LMHeadModel.from_pretrained(path, attn_implementation=attn_implementation).eval()
    with torch.no_grad():
        diff = _max_diff(hf(tokens).logits, model(tokens))
    assert diff <= TOL, f"{name}/{attn_implementation}: max |logit diff| {diff:.2e}"


@pytest.fixture(scope="module")
def bridges(exported):
    from headlens.models.hf.boot import load_bridge

    return {name: load_bridge(path) for name, (_, path) in exported.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_transformer_bridge_logits_patterns_and_z(exported, bridges, tokens, name):
    model, _ = exported[name]
    bridge = bridges[name]
    assert (bridge.n_layers, bridge.n_heads, bridge.is_causal) == (model.n_layers, model.n_heads, True)
    wanted = lambda n: n.endswith(("attn.hook_pattern", "attn.hook_z"))  # noqa: E731
    ref_logits, ref_cache = bridge.run_with_cache(tokens, names_filter=wanted)
    logits, cache = model.run_with_cache(tokens, names_filter=wanted)
    assert set(ref_cache) == set(cache) and len(cache) == 2 * model.n_layers
    if model.cfg.normalization == "none":  # the export's padded head dimension carries exactly 0
        for n in [n for n in ref_cache if n.endswith("hook_z")]:
            assert ref_cache[n][..., -1].abs().max() == 0
            ref_cache[n] = ref_cache[n][..., :-1]  # (B, T, H, d_head)
    diffs = {"logits": _max_diff(ref_logits, logits)} | {n: _max_diff(ref_cache[n], cache[n]) for n in cache}
    assert max(diffs.values()) <= TOL, diffs
    pattern = cache["blocks.1.attn.hook_pattern"]
    assert pattern.max() > 0.5, "patterns near uniform: the comparison would be weak"
    assert bridge.active_hooks() == [] and model.active_hooks() == []


def test_bridge_tokenizes_like_headlens(exported, bridges):
    model, path = exported["full-ln"]
    text = "def f(x):\n\treturn x  # héllo ✓ <bos>"
    assert bridges["full-ln"].to_tokens(text).tolist() == model.to_tokens(text).tolist()
    assert bridges["full-ln"].to_str_tokens(text) == model.to_str_tokens(text)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    assert tok(text, split_special_tokens=True)["input_ids"] == model.tokenizer.encode(text)
    assert tok.decode(model.tokenizer.encode(text)) == text


def test_char_level_export_tokenizer(tmp_path):
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from headlens import GPT, ModelConfig

    alphabet = "ab()[] \n"
    model = GPT(ModelConfig(n_layers=1, n_heads=2, d_model=16, n_ctx=32, d_vocab=10), Tokenizer.char_level(alphabet))
    path = export_hf(model, tmp_path)
    tok = AutoTokenizer.from_pretrained(path)
    text = "(a [b])\nab"
    assert tok(text)["input_ids"] == model.tokenizer.encode(text)
    assert tok.decode(tok(text)["input_ids"]) == text
    hf = GPT2LMHeadModel.from_pretrained(path).eval()
    tokens = model.to_tokens(text)
    with torch.no_grad():
        assert _max_diff(hf(tokens).logits, model(tokens)) <= TOL


def test_residual_embedding_is_an_isometry_orthogonal_to_ones():
    P = residual_embedding(32, 36)  # (D', D)
    torch.testing.assert_close(P.T @ P, torch.eye(32, dtype=torch.float64), atol=1e-12, rtol=0)
    assert float((torch.ones(36, dtype=torch.float64) @ P).abs().max()) < 1e-12


def test_uncentred_no_ln_model_exports_exactly_and_a_lossy_export_refuses(tmp_path, monkeypatch):
    from transformers import GPT2LMHeadModel

    import headlens.models.export as export

    model = make_gpt(5, normalization="none", init_range=0.15)
    with torch.no_grad():
        model.transformer.wte.weight.add_(0.3)  # residual writes far from mean-centred over d_model
    tokens = model.to_tokens("abc(def) abc(")
    hf = GPT2LMHeadModel.from_pretrained(export_hf(model, tmp_path / "ok")).eval()
    with torch.no_grad():
        assert _max_diff(hf(tokens).logits, model(tokens)) <= 1e-4
    real = export.hf_state_dict

    def lossy(m):  # what the export did before: LayerNorm over d_model, no embedding
        state = real(m)
        state["transformer.h.0.attn.c_attn.bias"] = state["transformer.h.0.attn.c_attn.bias"] + 0.5
        return state

    monkeypatch.setattr(export, "hf_state_dict", lossy)
    with pytest.raises(HeadlensError, match="not exact"):
        export_hf(model, tmp_path / "lossy")
    assert not (tmp_path / "lossy").exists()  # refused before anything was written


def test_export_hf_command(tmp_path):
    from typer.testing import CliRunner

    from headlens import save_checkpoint
    from headlens.cli import app

    ckpt = save_checkpoint(make_gpt(0, attn_only=True), tmp_path / "m.safetensors")
    result = CliRunner().invoke(app, ["export-hf", "--model", str(ckpt), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "hf").iterdir()}


@pytest.mark.parametrize("name", ["induction-2l", "dyck", "code"])
def test_every_zoo_model_exports_exactly_through_the_bridge(tmp_path, name):
    """induction-2l has no LayerNorm (the widened export), dyck and code do (1:1)."""
    import headlens
    from headlens.zoo import ZOO

    if not ZOO[name].available:
        pytest.skip(f"zoo model {name} has no weights in this checkout")
    model = headlens.load(name)
    bridge = headlens.load(f"hf:{export_hf(model, tmp_path / name)}")
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.tokenizer.d_vocab - 1, (2, 24), generator=gen)  # (2, 24), no BOS inside
    tokens[:, 0] = model.bos_token_id
    wanted = lambda n: n.endswith("attn.hook_pattern")  # noqa: E731
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=wanted)
        ref_logits, ref_cache = bridge.run_with_cache(tokens, names_filter=wanted)
    assert set(ref_cache) == set(cache) and len(cache) == model.n_layers
    assert _max_diff(ref_logits, logits) <= 1e-4
    assert max(_max_diff(ref_cache[n], cache[n]) for n in cache) <= TOL


def test_the_doctor_passes_an_exported_zoo_model(tmp_path):
    """The widened export (d_model + n_heads, one zero dim per head) is judged on its recipe's data,
    as its .safetensors original is, and keeps its true head count (it once read as 1 head, exit 8)."""
    import headlens
    from headlens.doctor.checkpoint import check_checkpoint

    out = export_hf(headlens.load("induction-2l"), tmp_path / "ind")
    report = check_checkpoint(out)
    assert report.passed and report.inferred_n_heads == report.config_n_heads == 4, report
    assert "induction-2l" in report.evaluation
