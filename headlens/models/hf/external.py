"""Bring your own model: ``headlens.load(obj, tokenizer=...)`` for a model already in memory.

Accepted: a ``transformers`` ``PreTrainedModel`` of any family TransformerBridge boots (a fine-tune, a
merged PEFT adapter, a bitsandbytes 4-bit model on a GPU), an nnsight ``LanguageModel`` (duck-typed: its
``._model`` and ``.tokenizer``) and a TransformerLens ``TransformerBridge``.

Why it looks like this:

- **A shell, not a copy.** TransformerBridge boots around a model object by *replacing its submodules* with
  its own components and switching it to eager attention. Done to the user's object, that would change it
  for good. So the bridge boots around :func:`shell`: a deep copy of the module tree whose parameters and
  buffers are the user's own tensors (``copy.deepcopy`` with every tensor already in the memo). No weight
  is copied, the user's modules, config, attention implementation, training flag and hooks stay as they
  were, and an in-place edit of the weights (a training step) is seen by both.
- **The object's own dtype and device.** Casting or moving it would copy the weights or change the user's
  object; asking for another dtype or device is refused in one line.
- **Packed weights are named, not guessed at.** bitsandbytes and GPTQ store weights packed in integers; a
  forward pass runs (patterns, scores, ablation, circuits), but what reads weight matrices (the OV readout,
  composition scores, weight detectors) would read garbage. :func:`packed_weights` names the format (read
  from the tensors: float weight matrices are plain, whatever the config says), and
  :func:`require_readable_weights` turns it into one line at each of those places.
- The tokenizer is the user's too: a copy is handed to the bridge (which sets a pad token on it).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from headlens.errors import ConfigError, HeadlensError, ModelReferenceError

# module classes whose weights are packed integers (bitsandbytes, auto-gptq / gptqmodel, AWQ, HQQ)
PACKED_MODULES = ("Linear4bit", "Linear8bitLt", "QuantLinear", "WQLinear", "HQQLinear")


class PackedWeightsError(HeadlensError):
    """A weight-reading analysis asked of a model whose weights are packed (CLI exit 1)."""


def is_foreign(obj: Any) -> bool:
    """Whether ``obj`` is a model object this module can boot (see the module docstring)."""
    return _hf_model(obj) is not None or _is_tl_bridge(obj)


def _is_tl_bridge(obj: Any) -> bool:
    return type(obj).__module__.startswith("transformer_lens") and hasattr(obj, "original_model")


def _hf_model(obj: Any) -> Any:
    """The ``transformers`` model inside ``obj`` (itself, or an nnsight ``LanguageModel``'s ``._model``)."""
    inner = getattr(obj, "_model", None) if not isinstance(obj, torch.nn.Module) else obj
    if isinstance(inner, torch.nn.Module) and hasattr(getattr(inner, "config", None), "model_type"):
        return inner
    return None


def packed_weights(hf_model: Any) -> str | None:
    """The packed weight format of ``hf_model`` in words (``"bitsandbytes (Linear4bit)"``), None when plain.

    Read from the tensors: a model whose weight matrices are all floating point is plain, whatever its
    config says (transformers dequantizes a GGUF file to float and leaves ``config.quantization_config``
    set); ``quantization_config`` only names the format of integer weights.

    >>> packed_weights(torch.nn.Linear(2, 2)) is None
    True
    """
    for module in hf_model.modules():
        if type(module).__name__ in PACKED_MODULES:
            return f"{type(module).__module__.split('.')[0]} ({type(module).__name__})"
    quant = getattr(getattr(hf_model, "config", None), "quantization_config", None)
    if quant is not None and not all(p.is_floating_point() for p in hf_model.parameters() if p.ndim >= 2):
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
        return f"{getattr(method, 'value', method) or 'quantized'} (quantization_config)"
    return None


def require_readable_weights(model: Any, what: str) -> None:
    """Refuse ``what`` (e.g. ``"the OV readout"``) in one line when ``model``'s weights are packed."""
    packed = getattr(model, "packed_weights", None)
    if packed:
        raise PackedWeightsError(
            f"{what} reads weight matrices, and {getattr(model, 'name', 'the model')!r} stores them packed "
            f"({packed}); activations are real (patterns, scores, ablation, circuits run), weights are not: "
            f"load the unquantized model for {what}")


def shell(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module``'s tree that shares every parameter and buffer with it (no weight is copied).

    >>> lin = torch.nn.Linear(2, 2)
    >>> shell(lin).weight is lin.weight, shell(lin) is lin
    (True, False)
    """
    memo: dict[int, Any] = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)


def load_object(obj: Any, tokenizer: Any = None, name: str | None = None, device: str | None = None,
                dtype: Any = None) -> Any:
    """Boot a model object already in memory behind the headlens surface, leaving the object as it was.

    Args:
        obj: a ``transformers`` ``PreTrainedModel``, an nnsight ``LanguageModel`` or a TransformerBridge.
        tokenizer: its tokenizer; default: the nnsight model's or the bridge's, else the one saved next to
            ``obj.config._name_or_path``, else none (generated probes only, as for ``hf:`` directories).
        name: display name (default: the last part of ``_name_or_path``, else the model type).
        device, dtype: checked against the object's own (refused when they differ; ``cpu`` is the default
            of ``headlens.load`` and means "the object's" here).

    >>> model = headlens.load(hf_model, tokenizer=tokenizer)  # doctest: +SKIP
    """
    from headlens.models.hf.boot import wrap

    if _is_tl_bridge(obj):
        model = wrap(obj, name or _default_name(obj.original_model), obj.original_model.config.to_dict(),
                     obj.tokenizer, _prefix(obj.tokenizer, obj.original_model), [])
        model.source = {"object": "transformer_lens.TransformerBridge",
                        "name_or_path": str(obj.original_model.config._name_or_path or "")}
        return model
    hf = _hf_model(obj)
    if hf is None:
        raise ModelReferenceError(f"cannot load a model from {type(obj).__name__}: expected a transformers "
                                  f"PreTrainedModel, an nnsight LanguageModel or a TransformerBridge")
    _check_placement(hf, device, dtype)
    tokenizer = tokenizer if tokenizer is not None else getattr(obj, "tokenizer", None) or _saved_tokenizer(hf)
    bridge = _boot(hf, None if tokenizer is None else copy.deepcopy(tokenizer))
    model = wrap(bridge, name or _default_name(hf), hf.config.to_dict(), tokenizer,
                 _prefix(tokenizer, hf), [])
    model.packed_weights = packed_weights(hf)
    model.source = {"object": f"{type(obj).__module__.split('.')[0]}.{type(obj).__name__}",
                    "model_class": type(hf).__name__, "name_or_path": str(hf.config._name_or_path or ""),
                    **({"quantization": model.packed_weights} if model.packed_weights else {})}
    return model


def _boot(hf: Any, tokenizer: Any) -> Any:
    """TransformerBridge around a :func:`shell` of ``hf`` (its own attention switch, its own eval flag)."""
    from transformer_lens.model_bridge import TransformerBridge

    from headlens.models.hf.boot import _stand_in_tokenizer

    twin = shell(hf)
    if not getattr(twin.config, "architectures", None):  # built from a config: the bridge dispatches on it
        twin.config.architectures = [type(hf).__name__]
    param = next(hf.parameters())
    try:
        bridge = TransformerBridge.boot_transformers(
            getattr(hf.config, "_name_or_path", "") or type(hf).__name__, hf_model=twin,
            tokenizer=tokenizer or _stand_in_tokenizer(), dtype=param.dtype if param.is_floating_point()
            else torch.float16, device=str(param.device))
    except Exception as err:  # the bridge raises many types (ValueError, KeyError...)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelReferenceError(f"TransformerBridge could not boot the {type(hf).__name__} object: {first}") \
            from err
    return bridge.eval()


def _check_placement(hf: Any, device: str | None, dtype: Any) -> None:
    from headlens.models.placement import resolve_device, resolve_dtype

    floats = [p for p in hf.parameters() if p.is_floating_point()]
    have = floats[0] if floats else next(hf.parameters())
    if dtype is not None and resolve_dtype(dtype) != have.dtype:
        raise ConfigError(f"dtype={dtype!r} asked for a model object in {have.dtype}: cast it yourself "
                          f"(headlens never casts or copies an object it is given)")
    if device not in (None, "cpu", "auto") and torch.device(resolve_device(device)).type != have.device.type:
        raise ConfigError(f"device={device!r} asked for a model object on {have.device}: move it yourself "
                          f"(headlens never moves an object it is given)")


def _saved_dir(hf: Any) -> Path | None:
    """The local directory the object was loaded from (``_name_or_path``), when it still has a config."""
    where = Path(str(getattr(hf.config, "_name_or_path", "") or "")).expanduser()
    return where if (where / "config.json").is_file() else None


def _saved_tokenizer(hf: Any) -> Any:
    """The tokenizer saved next to the object's weights, loaded as ``hf:<dir>`` would load it."""
    from headlens.models.hf.boot import _load_tokenizer
    from headlens.models.hf.hub import resolve

    where = _saved_dir(hf)
    return None if where is None else _load_tokenizer(resolve(str(where)), trust_remote_code=False)


def _prefix(tokenizer: Any, hf: Any) -> Any:
    """What every prompt starts with (:mod:`headlens.models.hf.prefix`): whether the tokenizer puts its BOS
    first is read from the saved directory as for ``hf:<dir>``, else asked of the tokenizer itself."""
    from headlens.models.hf.prefix import adds_bos, choose

    if tokenizer is None:
        return None
    where = _saved_dir(hf)
    adds = adds_bos(where) if where is not None else None
    bos = getattr(tokenizer, "bos_token_id", None)
    if where is None and bos is not None:
        adds = list(tokenizer("a", add_special_tokens=True)["input_ids"])[:1] == [bos]
    return choose(tokenizer, adds, getattr(hf.config, "vocab_size", None))


def _default_name(hf: Any) -> str:
    path = str(getattr(hf.config, "_name_or_path", "") or "").rstrip("/")
    return path.rsplit("/", 1)[-1] if path else str(hf.config.model_type)
