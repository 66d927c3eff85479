"""What every prompt of a Hugging Face causal LM starts with (headlens.models.hf.prefix): the rule on the
tokenizer shapes of several families, and on a directory (hf:) as well as a GGUF (tests/models/test_gguf.py)."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest

from headlens.models.hf.prefix import adds_bos, choose


def tokenizer(bos: str | None, eos: str | None, vocab: dict[str, int]) -> SimpleNamespace:
    return SimpleNamespace(bos_token=bos, bos_token_id=vocab.get(bos), eos_token=eos, eos_token_id=vocab.get(eos),
                           get_vocab=lambda: vocab)


GPT2 = tokenizer("<|endoftext|>", "<|endoftext|>", {"<|endoftext|>": 50256})
LLAMA3 = tokenizer("<|begin_of_text|>", "<|end_of_text|>", {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001})
QWEN2_INSTRUCT = tokenizer(None, "<|im_end|>", {"<|endoftext|>": 151643, "<|im_end|>": 151645})
SMOLLM2_INSTRUCT = tokenizer("<|im_start|>", "<|im_end|>", {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2})
BARE = tokenizer(None, "</s>", {"</s>": 2})


@pytest.mark.parametrize(("tok", "adds", "token", "rule", "says"), [
    (LLAMA3, True, "<|begin_of_text|>", "adds_bos", False),  # the tokenizer adds it: as served
    (GPT2, False, "<|endoftext|>", "document_separator", False),  # the separator is its declared BOS: nothing to say
    (SMOLLM2_INSTRUCT, False, "<|endoftext|>", "document_separator", True),  # not the chat-turn marker
    (QWEN2_INSTRUCT, False, "<|endoftext|>", "document_separator", True),  # declares no BOS at all
    (BARE, False, "</s>", "eos", True),
    (tokenizer(None, None, {}), False, "", "none", True),
    (SMOLLM2_INSTRUCT, None, "<|im_start|>", "declared_bos", False),  # the tokenizer does not say: TL's choice
])
def test_the_rule_on_each_tokenizer_shape(tok, adds, token, rule, says):
    prefix = choose(tok, adds)
    assert (prefix.token, prefix.rule) == (token, rule)
    assert (prefix.note("m") is not None) == says
    assert prefix.provenance()["why"]


def test_a_separator_beyond_the_models_vocabulary_is_not_one_it_knows():
    added = tokenizer("<|bos|>", "<|eos|>", {"<|bos|>": 0, "<|eos|>": 1, "<|endoftext|>": 300})
    assert choose(added, False, d_vocab=300).token == "<|bos|>"
    assert choose(added, False, d_vocab=301).token == "<|endoftext|>"


@pytest.mark.parametrize(("files", "expected"), [
    ({"tokenizer_config.json": {"add_bos_token": True}}, True),
    ({"tokenizer_config.json": {"add_bos_token": False},
      "tokenizer.json": {"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {}}]}}}, False),
    ({"tokenizer.json": {"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {}},
                                                                                   {"Sequence": {}}]}}}, True),
    ({"tokenizer.json": {"post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {}}]}}}, False),
    ({"tokenizer.json": {"post_processor": {"type": "ByteLevel"}}}, False),
    ({"tokenizer.json": {"post_processor": {"type": "Sequence", "processors": [
        {"type": "ByteLevel"}, {"type": "TemplateProcessing", "single": [{"SpecialToken": {}}]}]}}}, True),
    ({"tokenizer.json": {"post_processor": None}}, False),
    ({}, None),  # a slow tokenizer only: cannot tell
])
def test_whether_a_directorys_tokenizer_adds_a_bos(tmp_path, files, expected):
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    assert adds_bos(tmp_path) is expected


def test_an_hf_directory_follows_the_rule_too(tmp_path):
    """A Llama directory whose tokenizer adds no BOS and has <|endoftext|>: prompts start with it, said once."""
    import headlens
    from tests.gguf_files import endoftext_tokenizer
    from tests.hf_families import build

    folder = build("llama", tmp_path / "llama", tokenizer=False)
    tok = endoftext_tokenizer()
    tok.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = headlens.load(f"hf:{folder}")
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    assert model.to_tokens("x = 1")[0].tolist() == [eot, *tok("x = 1", add_special_tokens=False)["input_ids"]]
    assert [str(w.message) for w in caught if "adds no BOS" in str(w.message)] == [model.substitutions[-1]]
