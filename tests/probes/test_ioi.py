"""The IOI probe: names found in the model's own tokenizer, balanced orders, aligned corrupted prompts, named
positions that point at the right tokens, and a one-line refusal when a tokenizer keeps too few names."""

from __future__ import annotations

import pytest
import torch

from headlens.errors import ProbeError
from headlens.probes.ioi import MIN_NAMES, NAMES, TEMPLATES, ioi_probe, resolve, unsupported, usable_names
from tests.ioi_models import load_quietly, save_ioi_llama


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
    """A word-level Llama whose vocabulary holds only 12 of the probe's names."""
    return load_quietly(save_ioi_llama(tmp_path_factory.mktemp("ioi") / "m", names=NAMES[:12]))


def test_names_are_found_in_the_tokenizer(word_model):
    assert sorted(usable_names(word_model)) == sorted(NAMES[:12])  # the others are [UNK] here
    assert len(TEMPLATES) >= 8


def test_positions_point_at_the_names(word_model):
    p = ioi_probe(word_model, 24, seed=3)
    assert len(p) == 24 and set(p.positions) == {"IO", "S1", "S1+1", "S2", "END"}
    rows = torch.arange(len(p))
    for i, prompt in enumerate(p.prompts):
        io, s, _ = p.names[i]
        toks = word_model.to_str_tokens(prompt)
        assert toks[p.positions["IO"][i]] == io and toks[p.positions["S1"][i]] == s
        assert toks[p.positions["S2"][i]] == s and p.positions["S1+1"][i] == p.positions["S1"][i] + 1
        assert p.positions["END"][i] == len(prompt) - 1 and toks[-1] == "to"
        assert (p.positions["IO"][i] < p.positions["S1"][i]) == (p.orders[i] == "ABBA")
        assert word_model.to_tokens(p.texts[i])[0].tolist() == prompt.tolist()  # the text is the prompt
    tokens = torch.nn.utils.rnn.pad_sequence(p.prompts, batch_first=True)
    assert torch.equal(tokens[rows, p.positions["IO"]], p.answers[:, 0])
    assert torch.equal(tokens[rows, p.positions["S2"]], p.answers[:, 1])
    ann = p.annotations["IO"]
    assert all(int(a[-1]) == int(p.positions["IO"][i]) and (a[:-1] == -1).all() for i, a in enumerate(ann))


def test_orders_and_templates_are_balanced(word_model):
    p = ioi_probe(word_model, 48)
    assert p.orders.count("ABBA") == p.orders.count("BABA") == 24
    for t in range(len(TEMPLATES)):  # each template in both orders
        assert {o for o, k in zip(p.orders, p.templates, strict=True) if k == t} == {"ABBA", "BABA"}
    assert all(len(set(n)) == 3 for n in p.names)


def test_corrupted_prompts_are_aligned_and_replace_s2(word_model):
    p = ioi_probe(word_model, 16, seed=1)
    for i, (clean, bad) in enumerate(zip(p.prompts, p.corrupted, strict=True)):
        assert len(clean) == len(bad)
        differ = (clean != bad).nonzero().flatten().tolist()
        assert differ == [int(p.positions["S2"][i])]
        io, s, c = p.names[i]
        assert word_model.to_str_tokens(bad)[differ[0]] == c and c not in (io, s)


def test_seeded(word_model):
    assert ioi_probe(word_model, 8, seed=5).texts == ioi_probe(word_model, 8, seed=5).texts
    assert ioi_probe(word_model, 8, seed=5).texts != ioi_probe(word_model, 8, seed=6).texts


def test_too_few_names_is_one_line(tmp_path):
    few = load_quietly(save_ioi_llama(tmp_path / "few", names=NAMES[: MIN_NAMES - 1]))
    why = unsupported(few)
    assert why and "\n" not in why and f"keeps {MIN_NAMES - 1} of {len(NAMES)} names" in why
    with pytest.raises(ProbeError, match="needs at least"):
        ioi_probe(few, 4)


def test_byte_tokenizer_is_refused(tiny_gpt):
    why = unsupported(tiny_gpt)
    assert "keeps 0 of" in why and "'M', 'a', 'r', 'y'" in why


def test_resolve(word_model):
    assert resolve(word_model, ["a prompt"]) is None and resolve(word_model, None) is None
    assert len(resolve(word_model, "ioi", n_prompts=4)) == 4
    with pytest.raises(ProbeError, match="is one string"):
        resolve(word_model, "When Mary and John went")
