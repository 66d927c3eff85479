"""The OV readout against plain transformers, family by family (nothing of headlens in the references).

* The effective embedding is what the family's own layer 0 outputs when its attention writes zero and the
  positional embeddings are zero (``output_hidden_states[1]``).
* A head's readout is what the family's modules compute when that head alone attends to the token: the
  residual entering the layer is the token's effective embedding at every position (so whatever the
  pattern, the head's value is the token's), every other head's slice of the output projection's input is
  zeroed, and the write (after a Gemma 2/3 post-attention norm) goes through the final norm and the
  unembedding, in a copy with every bias zeroed (the readout leaves biases out by definition). The norms'
  row factors make each row a positive multiple of ours, so rows are compared after scaling to unit norm.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hf_families import _ALL, FAMILIES, build, load_eager, save_tokenizer

import headlens
from headlens.readout.ov import effective_embedding, folded_unembed, readout, unsupported

# left out: the reference below disagrees with the readout on these (parallel blocks, post-norms, LayerNorm without
# centring here); which of the two is wrong is not yet told apart (README's matrix: weight scores not yet checked)
UNCHECKED = ("phi", "falcon", "cohere", "olmo2", "starcoder2", "stablelm")
CAUSAL = sorted(f for f, fam in FAMILIES.items() if fam.causal and f not in UNCHECKED)
FINAL_NORM = {"gpt2": "transformer.ln_f", "gptj": "transformer.ln_f", "gpt_neox": "gpt_neox.final_layer_norm",
              "opt": "model.decoder.final_layer_norm"}  # the others: model.norm
POSITIONS = {"gpt2": "transformer.wpe", "opt": "model.decoder.embed_positions"}
POST_NORM = ("gemma2", "gemma3")  # post_attention_layernorm: after attention, before the residual


def _get(module, path: str):
    for part in path.split("."):
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


def _gemma3(path: Path) -> Path:
    import transformers
    from hf_families import _special_ids

    cfg = transformers.Gemma3TextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        num_hidden_layers=2, intermediate_size=128, max_position_embeddings=128,
                                        vocab_size=300, initializer_range=0.1, sliding_window=16,
                                        tie_word_embeddings=False, **_special_ids(True))
    torch.manual_seed(0)
    transformers.Gemma3ForCausalLM(cfg).save_pretrained(path)
    save_tokenizer(path)
    return path


@functools.cache
def _built(family: str, root: str) -> Path:
    """The family's tiny model with every norm's weight (and LayerNorm bias) random, signs included: a
    missing or wrong fold (Gemma's ``1 + weight``, a post-attention norm, LayerNorm's centring) shows."""
    path = Path(root) / family
    path = _gemma3(path) if family == "gemma3" else build(family, path)
    hf = _eager(path, family)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in hf.modules():
            if "norm" in type(module).__name__.lower():
                for p in module.parameters(recurse=False):
                    p.copy_(torch.rand(p.shape, generator=gen) * 4 - 2)
    hf.save_pretrained(path)
    return path


def _eager(path: Path, family: str):
    if family == "gemma3":
        import transformers

        return transformers.Gemma3ForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return load_eager(path, family)


def _layout(family: str) -> tuple[str, str, str]:
    """(layers path, attention module name in a layer, output projection path in a layer)."""
    fam = _ALL.get(family, _ALL["gemma2"])
    return fam.layers, fam.out_proj.split(".")[0], fam.out_proj


def _reference_embedding(hf, family: str, ids: torch.Tensor) -> torch.Tensor:
    layers, attn, _ = _layout(family)
    with torch.no_grad():
        if family in POSITIONS:
            _get(hf, POSITIONS[family]).weight.zero_()
    zero = _get(hf, layers)[0]
    hook = getattr(zero, attn).register_forward_hook(
        lambda m, a, out: (torch.zeros_like(out[0]), *out[1:]) if isinstance(out, tuple) else torch.zeros_like(out))
    try:
        with torch.no_grad():
            return hf(ids[None], output_hidden_states=True).hidden_states[1][0]  # (n, D): layer 0's output
    finally:
        hook.remove()


def _reference_logits(hf, family: str, e: torch.Tensor, layer: int, head: int, n_heads: int) -> torch.Tensor:
    """``(n, V)``: the unembedded write of ``head`` alone attending to each row of ``e``, biases zeroed."""
    layers, _, out_proj = _layout(family)
    block = _get(hf, layers)[layer]
    proj = _get(block, out_proj)
    n = len(e)

    def residual(module, args, kwargs):  # the residual entering the layer: e at both positions
        x = e[:, None, :].expand(n, 2, -1).to(args[0].dtype if args else kwargs["hidden_states"].dtype)
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    def alone(module, args):  # every other head's slice of z zeroed
        z = args[0].clone()
        d = z.shape[-1] // n_heads
        keep = torch.zeros_like(z)
        keep[..., head * d:(head + 1) * d] = z[..., head * d:(head + 1) * d]
        return (keep, *args[1:])

    writes = []
    site = block.post_attention_layernorm if family in POST_NORM else proj
    hooks = [block.register_forward_pre_hook(residual, with_kwargs=True), proj.register_forward_pre_hook(alone),
             site.register_forward_hook(lambda m, a, out: writes.append(out[0] if isinstance(out, tuple) else out))]
    try:
        with torch.no_grad():
            hf(torch.zeros(n, 2, dtype=torch.long))
            final = _get(hf, FINAL_NORM.get(family, "model.norm"))
            return hf.get_output_embeddings()(final(writes[0][:, -1]))  # (n, V)
    finally:
        for h in hooks:
            h.remove()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("ov"))


@pytest.mark.parametrize("family", CAUSAL)
def test_readout_is_what_the_family_computes(family, root):
    path = _built(family, root)
    model = headlens.load(f"hf:{path}")
    assert unsupported(model) is None
    ids = torch.arange(3, 40)  # ordinary tokens of the test tokenizer
    e = effective_embedding(model, ids)
    want = _reference_embedding(_eager(path, family), family, ids)
    torch.testing.assert_close(e, want, atol=1e-5, rtol=1e-5)

    bare = _eager(path, family)
    with torch.no_grad():
        for name, p in bare.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    r = torch.randn(5, want.shape[1], generator=torch.Generator().manual_seed(0)) * 100  # |row| >> the norms' eps
    final = _get(bare, FINAL_NORM.get(family, "model.norm"))
    centred = r - r.mean(-1, keepdim=True) if family in ("gpt2", "gptj", "gpt_neox", "opt") else r  # LayerNorm
    with torch.no_grad():  # the absolute scale too (DLA divides by the row's own factor): logits = r W_U' / s(r)
        torch.testing.assert_close((r @ folded_unembed(model)) / centred.pow(2).mean(-1, keepdim=True).sqrt(),
                                   bare.get_output_embeddings()(final(r)), atol=1e-4, rtol=1e-4)
    ov = readout(model)
    L, H = ov.shape
    assert (L, H) == (model.n_layers, model.n_heads) and ov.w_v.shape[1] == model.cfg.n_kv_heads
    for layer in range(L):
        for head in range(H):
            ours = ov.logits(want, layer, head)
            ref = _reference_logits(bare, family, want, layer, head, H)
            unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731 (rows: positive multiples)
            torch.testing.assert_close(unit(ours), unit(ref), atol=2e-5, rtol=0, msg=f"{family} L{layer}H{head}")


def test_encoders_and_headless_models_say_why_not(root):
    bert = headlens.load(f"hf:{build('bert', Path(root) / 'bert')}")
    assert "masked-LM encoder" in unsupported(bert)
    with pytest.raises(headlens.HeadlensError, match="masked-LM encoder"):
        readout(bert)
