"""Bring your own model: ``headlens.load(obj, tokenizer=...)`` on objects already in memory.

For every family of the architecture matrix (``hf_families.FAMILIES``) the same directory is loaded twice:
through ``hf:<dir>`` and as a ``transformers`` object loaded by the user with their own attention
implementation (sdpa). The scores tables must agree (1e-6), the bridge must run on the user's own tensors
(no copy), and afterwards the object must be as it was: same logits, same module classes, same attention
implementation, dtype, device and training flag, no hook left on any module. Stand-ins cover what cannot be
installed here: an nnsight ``LanguageModel`` (its ``._model`` and ``.tokenizer``) and packed weights
(a module class named like bitsandbytes' ``Linear4bit``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_families import FAMILIES, build

import headlens
from headlens.errors import ConfigError, DetectorError, HeadlensError

DETECTORS = ["previous_token", "induction", "first_token"]
KW = dict(detectors=DETECTORS, n_prompts=2, seq_len=16)
FUSED = {"gpt2", "gpt_neox", "phi3", "falcon"}  # one qkv matrix: the bridge keeps q, k, v apart (copies, also for hf:)
COLS = ["score", "ci_low", "ci_high", "baseline", "n_positions"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return tmp_path_factory.mktemp("external")


def _user_model(path: Path, family: str) -> Any:
    """The directory as a user loads it: the family's class, transformers' default attention (sdpa)."""
    import transformers

    return getattr(transformers, FAMILIES[family].model).from_pretrained(path).eval()


def _state(hf: Any) -> dict[str, Any]:
    """Everything about the object a call could change, besides its weights' values."""
    return {
        "classes": [type(m).__name__ for m in hf.modules()],
        "attn": hf.config._attn_implementation,
        "dtype": {p.dtype for p in hf.parameters()}, "device": {p.device for p in hf.parameters()},
        "training": [m.training for m in hf.modules()],
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in hf.modules()),
    }


@pytest.mark.parametrize("family", list(FAMILIES))
def test_object_scores_as_its_directory_and_is_left_as_it_was(root: Path, family: str) -> None:
    from transformers import AutoTokenizer

    path = build(family, root / family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = headlens.classify(headlens.load(f"hf:{path}"), **KW)
        hf, tokenizer = _user_model(path, family), AutoTokenizer.from_pretrained(path)
        x = torch.randint(5, 250, (2, 12))
        with torch.no_grad():
            logits = hf(x).logits
        before = _state(hf)
        model = headlens.load(hf, tokenizer=tokenizer, name=path.name)
        got = headlens.classify(model, **KW)
        with headlens.ablate(model, [(0, 1)]):
            model(x)  # a hook on the bridge, removed on exit
    assert got[COLS].to_numpy() == pytest.approx(want[COLS].to_numpy(), abs=1e-6, nan_ok=True)
    ours = {p.data_ptr() for p in hf.parameters()}
    copies = {n for n, p in model.bridge.named_parameters() if p.data_ptr() not in ours}
    # the bridge runs on the user's tensors; it splits a fused qkv (and Phi-3's gate_up) into its own, as for hf:
    assert not copies if family not in FUSED else all(n.split(".")[-3] in "qkv in" for n in copies)
    assert _state(hf) == before
    with torch.no_grad():
        assert torch.equal(hf(x).logits, logits)
    assert got.attrs["source"]["model_class"] == FAMILIES[family].model


class _LanguageModel:
    """What headlens reads of an nnsight ``LanguageModel``: the wrapped model and its tokenizer."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self._model, self.tokenizer = model, tokenizer


def test_nnsight_and_bridge_objects_score_as_the_directory(root: Path) -> None:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    path = build("llama", root / "llama_wrappers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = headlens.classify(headlens.load(f"hf:{path}"), **KW)
        nn_model = _LanguageModel(_user_model(path, "llama"), AutoTokenizer.from_pretrained(path))
        from_nnsight = headlens.classify(headlens.load(nn_model), **KW)
        bridge = TransformerBridge.boot_transformers(str(path), tokenizer=AutoTokenizer.from_pretrained(path))
        from_bridge = headlens.classify(headlens.load(bridge), **KW)
    for got in (from_nnsight, from_bridge):
        assert got[COLS].to_numpy() == pytest.approx(want[COLS].to_numpy(), abs=1e-6, nan_ok=True)
    assert not any(hp.fwd_hooks for hp in bridge.hook_dict.values() if hasattr(hp, "fwd_hooks")
                   and any(not getattr(h, "is_permanent", False) for h in hp.fwd_hooks))


class Linear4bit(torch.nn.Linear):
    """Named like bitsandbytes' packed 4-bit layer; computes as a plain Linear (activations stay real)."""


def _packed_llama(folder: Path) -> tuple[Path, Any]:
    """A tiny llama object with one layer renamed as bitsandbytes' packed one."""
    path = build("llama", folder)
    hf = _user_model(path, "llama")
    hf.model.layers[0].mlp.down_proj.__class__ = Linear4bit
    return path, hf


def _quiet_load(hf: Any, name: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return headlens.load(hf, name=name)


def test_packed_weights_run_activations_and_refuse_weight_readers(root: Path) -> None:
    from headlens.circuits.composition import head_weights
    from headlens.readout.ov import raw_weights
    from headlens.readout.parts import model_parts

    path, hf = _packed_llama(root / "llama_packed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = headlens.load(hf, name="packed")
        table = headlens.classify(model, **KW)  # patterns: real
        edges = headlens.circuit(hf, receivers="L1H0", senders="L0H0", inputs="q", method="zero", n_prompts=4,
                                 n_control=1, n_boot=50)  # circuits take the object too; no composition
    assert len(edges) == 1 and edges["effect"].notna().all() and edges["composition"].isna().all()
    assert model.packed_weights.endswith("(Linear4bit)")
    assert table.attrs["source"]["quantization"] == model.packed_weights
    back = headlens.read_scores(headlens.write_scores(table, root / "packed.json"))  # provenance travels
    assert back.attrs["source"] == {"object": "transformers.LlamaForCausalLM", "model_class": "LlamaForCausalLM",
                                    "name_or_path": str(path), "quantization": model.packed_weights}
    calls = ((lambda: raw_weights(model), DetectorError), (lambda: head_weights(model, 1), HeadlensError),
             (lambda: model_parts(model), HeadlensError))
    for call, err in calls:
        with pytest.raises(err) as info:
            call()
        line = str(info.value).strip("'\"")
        assert "\n" not in line and "packed" in line and "Linear4bit" in line
    with pytest.raises(ConfigError, match="bfloat16"):
        headlens.load(hf, dtype="bfloat16")


def test_float_weights_are_not_packed_whatever_the_config_says(root: Path) -> None:
    """transformers dequantizes a GGUF file to float and leaves ``config.quantization_config`` set: the
    tensors decide, so the weight readers and the name movers' DLA gate run."""
    from headlens.readout.parts import model_parts
    from headlens.scoring.classification import select_detectors

    path = build("llama", root / "llama_gguf_like")
    hf = _user_model(path, "llama")
    hf.config.quantization_config = {"quant_method": "gguf"}
    model = _quiet_load(hf, "dequantized")
    assert model.packed_weights is None and "quantization" not in model.source
    model_parts(model)  # DLA reads the weights
    _, skipped, _ = select_detectors(model, None)
    assert not [name for name, why in skipped.items() if "packed" in why]


def test_packed_weights_choose_weight_readers_and_gates_before_the_scan(root: Path) -> None:
    """A really packed model: the default run skips every detector that reads weights, the name movers'
    DLA gate included, each in one line, before the scan; naming one is refused before any work."""
    from headlens.detectors import all_detectors
    from headlens.scoring.classification import select_detectors

    model = _quiet_load(_packed_llama(root / "llama_packed_gates")[1], "packed")
    _, skipped, _ = select_detectors(model, None)

    readers = {d.name for d in all_detectors().values() if d.default and (d.kind == "weights" or d.gate)}
    assert readers and readers <= set(skipped)
    assert all("packed" in skipped[n] and "\n" not in skipped[n] for n in readers)
    ticks: list[int] = []
    for name in ("name_mover", "ov_copying"):
        with pytest.raises(HeadlensError, match="packed"):
            headlens.classify(model, detectors=[name], n_prompts=2, seq_len=16,
                              progress=lambda done, total, stage: ticks.append(done))
    assert ticks == []  # refused before the scan
