"""The native GPT: config validation, tokenizers, shapes, and SDPA == explicit attention."""

from __future__ import annotations

import pytest
import torch
from conftest import make_gpt
from hypothesis import given, settings
from hypothesis import strategies as st

from headlens import GPT, ModelConfig, Tokenizer
from headlens.errors import ConfigError, HeadlensError, ProbeError

# -- config -----------------------------------------------------------------------------------


def test_config_defaults_follow_gpt2():
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=64, n_ctx=32, d_vocab=257)
    assert (cfg.d_head, cfg.d_mlp, cfg.layer_norm_eps) == (16, 256, 1e-5)
    assert ModelConfig.from_json(cfg.to_json()) == cfg


def test_indivisible_heads_name_both_numbers():
    with pytest.raises(ConfigError, match=r"d_model=30 is not divisible by n_heads=4"):
        ModelConfig(n_layers=1, n_heads=4, d_model=30, n_ctx=8, d_vocab=257)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"n_layers": 0}, "n_layers must be a positive int"),
        ({"n_heads": -2}, "n_heads must be a positive int"),
        ({"d_model": 32.0}, "d_model must be a positive int"),
        ({"n_ctx": True}, "n_ctx must be a positive int"),
        ({"d_head": -1}, "d_head must be a positive int"),
        ({"act_fn": "silu"}, "act_fn must be 'gelu_new' or 'relu'"),
        ({"normalization": "RMS"}, "normalization must be 'LN' or 'none'"),
        ({"positional_embedding": "rotary"}, "positional_embedding must be 'learned'"),
    ],
)
def test_config_validation(overrides, match):
    fields = dict(n_layers=1, n_heads=4, d_model=32, n_ctx=8, d_vocab=257) | overrides
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**fields)


def test_config_from_dict_refuses_unknown_and_bad_json():
    with pytest.raises(ConfigError, match=r"unknown ModelConfig field\(s\) \['n_head'\]"):
        ModelConfig.from_dict({"n_layers": 1, "n_head": 4, "d_model": 32, "n_ctx": 8, "d_vocab": 257})
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_json("{n_layers: 1")
    with pytest.raises(ConfigError, match="must be an object"):
        ModelConfig.from_json("[1, 2]")


def test_config_is_frozen():
    cfg = ModelConfig(n_layers=1, n_heads=4, d_model=32, n_ctx=8, d_vocab=257)
    with pytest.raises(AttributeError):
        cfg.n_heads = 8


# -- tokenizer ----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_byte_tokenizer_round_trips_every_string(text):
    tok = Tokenizer.byte_level()
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_token_id, *ids]) == text


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ab()[] \n"))
def test_char_tokenizer_round_trips_its_alphabet(text):
    tok = Tokenizer.char_level("ab()[] \n")
    assert tok.decode(tok.encode(text)) == text
    assert tok.bos_token_id == 8 and tok.d_vocab == 9
    assert Tokenizer.from_spec(tok.to_spec()) == tok


def test_char_tokenizer_errors_name_the_characters():
    with pytest.raises(ProbeError, match="'z'"):
        Tokenizer.char_level("ab").encode("abz")
    with pytest.raises(ProbeError, match="repeated"):
        Tokenizer.char_level("aba")


def test_str_tokens_are_readable():
    model = make_gpt(0)
    assert model.to_str_tokens("a\n") == ["<bos>", "a", "\\x0a"]


# -- model --------------------------------------------------------------------------------------


def test_parameter_names_match_hf_gpt2():
    names = set(make_gpt(0).state_dict())
    for name in (
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.h.0.ln_1.weight",
        "transformer.h.0.attn.c_attn.weight",
        "transformer.h.0.attn.c_proj.bias",
        "transformer.h.1.mlp.c_fc.weight",
        "transformer.h.1.mlp.c_proj.weight",
        "transformer.ln_f.bias",
        "lm_head.weight",
    ):
        assert name in names


@pytest.mark.parametrize(
    "overrides",
    [{}, {"attn_only": True}, {"normalization": "none"}, {"tie_embeddings": True}, {"n_heads": 1}],
)
def test_sdpa_path_equals_explicit_path(overrides):
    model = make_gpt(3, **overrides)
    torch.manual_seed(1)
    tokens = torch.randint(0, 256, (3, 17))
    fast = model(tokens)  # no hook needs the pattern: scaled_dot_product_attention
    seen = []  # an observing pattern hook switches every layer to the explicit softmax path
    explicit = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda x, hook: seen.append(x))])
    assert len(seen) == model.n_layers
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=0)


def test_forward_shapes_and_text_input():
    model = make_gpt(0)
    assert model("hello").shape == (1, 6, 257)
    assert model.to_tokens(["ab", "cd"]).shape == (2, 3)
    assert model.to_tokens("ab", prepend_bos=False).tolist() == [[97, 98]]
    assert model.is_causal and model.special_token_ids == {256} and model.bos_token_id == 256


def test_right_padding_does_not_change_real_positions():
    model = make_gpt(0)
    tokens = model.to_tokens("hello there")
    padded = torch.cat([tokens, torch.full((1, 4), model.bos_token_id)], dim=1)
    mask = torch.cat([torch.ones_like(tokens), torch.zeros(1, 4, dtype=torch.long)], dim=1)
    T = tokens.shape[1]
    torch.testing.assert_close(model(padded, attention_mask=mask)[:, :T], model(tokens), atol=1e-5, rtol=0)


def test_tied_embeddings_share_one_tensor():
    model = make_gpt(0, tie_embeddings=True)
    assert model.lm_head.weight is model.transformer.wte.weight


def test_too_long_input_and_ragged_texts_are_clear_errors():
    model = make_gpt(0, n_ctx=8)
    with pytest.raises(ProbeError, match="n_ctx=8"):
        model.to_tokens("way too long for this")
    with pytest.raises(ProbeError, match="n_ctx=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ProbeError, match="different token lengths"):
        model.to_tokens(["a", "bb"])


def test_tokenizer_must_fit_the_vocab():
    with pytest.raises(HeadlensError, match="d_vocab >= 257"):
        GPT(ModelConfig(n_layers=1, n_heads=1, d_model=8, n_ctx=8, d_vocab=100))
