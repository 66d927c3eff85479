"""Your own GGUF-loaded model: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` dequantizes to float and
leaves ``config.quantization_config`` set. headlens reads packing from the tensors, so the object is plain and
the default classify (weight detectors and the name movers' DLA gate included) gives the table ``smollm2``
gives: the same file, dequantized by the same transformers."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

import headlens


@pytest.mark.slow  # two default classifies of a 30-layer model: minutes each on 2 cores
def test_gguf_loaded_object_classifies_as_smollm2(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from headlens.models.hf.gguf import smollm2_path

    path = smollm2_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        assert hf.config.quantization_config is not None  # what once made headlens call it packed
        model = headlens.load(hf, tokenizer=tokenizer)
        ours, reference = headlens.classify(model), headlens.classify(smollm2)
    assert model.packed_weights is None and not ours.attrs["skipped"].keys() - reference.attrs["skipped"].keys()
    pd.testing.assert_frame_equal(ours.drop(columns="model"), reference.drop(columns="model"))
    assert ours.label.sum() == reference.label.sum() > 0
