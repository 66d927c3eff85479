"""Llama-architecture zoo models: trained by a headlens recipe, shipped as Hugging Face directories.

Why a second architecture in the zoo: users study Llama, Qwen and Mistral, not GPT-2. A small
``LlamaForCausalLM`` (RoPE, RMSNorm, SwiGLU MLPs, grouped-query attention) trained here and
loaded back through TransformerBridge shows the whole path on the architecture they care about.

Why a Hugging Face directory and not a headlens checkpoint: the native ``GPT`` cannot hold RoPE,
RMSNorm or GQA, and the point is that headlens reads the model ``transformers`` runs. The
directory holds ``config.json``, ``model.safetensors`` and a byte-level tokenizer that gives the
same ids as :meth:`headlens.Tokenizer.byte_level` (``headlens.models.export.hf_tokenizer``: id ``b`` is
byte ``b``, BOS ``<bos>`` = 256).

``transformers`` is imported inside the functions that need it (``import headlens`` stays light).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headlens.errors import CheckpointError, ConfigError
from headlens.models.files import atomic_write
from headlens.models.tokenizer import Tokenizer
from headlens.zoo import HF_WEIGHTS as WEIGHTS_FILE  # what save_pretrained writes and the bridge reads


@dataclass(frozen=True)
class LlamaSpec:
    """Shape of a small ``LlamaForCausalLM`` (TransformerLens names; HF names in ``hf_config``).

    >>> LlamaSpec(n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, n_ctx=128, d_vocab=257).d_head
    16
    """

    n_layers: int  # decoder layers
    n_heads: int  # query heads per layer
    n_kv_heads: int  # key/value heads per layer; each serves n_heads // n_kv_heads query heads (GQA)
    d_model: int  # residual stream width
    n_ctx: int  # max_position_embeddings (RoPE has no learned positions; this bounds the probes)
    d_vocab: int  # token ids, BOS included
    d_mlp: int = 0  # SwiGLU hidden width; 0 means 4 * d_model
    d_head: int = 0  # per-head width; 0 means d_model // n_heads (Llama allows others, like Gemma)
    rope_theta: float = 10000.0  # RoPE base
    rms_norm_eps: float = 1e-5
    init_range: float = 0.02  # std of the normal init (HF's initializer_range)
    tie_embeddings: bool = False  # untied is easier to train small (as for the native zoo models)
    architecture: str = "llama"  # tells recipes and cards this is not a native GPT

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "n_kv_heads", "d_model", "n_ctx", "d_vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"LlamaSpec.{name} must be a positive int, got {value!r}")
        if self.d_head == 0:
            if self.d_model % self.n_heads:
                raise ConfigError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.d_mlp == 0:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def hf_config(self, bos_token_id: int) -> dict[str, Any]:
        """``config.json`` fields of the equivalent ``LlamaConfig``."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.d_vocab,
            "hidden_size": self.d_model,
            "intermediate_size": self.d_mlp,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.d_head,
            "max_position_embeddings": self.n_ctx,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "initializer_range": self.init_range,
            "tie_word_embeddings": self.tie_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": bos_token_id,
            "eos_token_id": bos_token_id,
            "pad_token_id": bos_token_id,
        }


class LlamaLM(torch.nn.Module):
    """A ``LlamaForCausalLM`` whose ``forward(tokens)`` returns logits ``(B, T, d_vocab)``, like ``GPT``.

    The training loop needs nothing else; analysis goes through the bridge (:func:`load_run`).
    """

    def __init__(self, spec: LlamaSpec, tokenizer: Tokenizer, name: str) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        self.spec, self.tokenizer, self.name = spec, tokenizer, name
        hf = LlamaConfig(**spec.hf_config(tokenizer.bos_token_id), attn_implementation="sdpa")
        self.hf = LlamaForCausalLM(hf)  # weights drawn from torch's global generator (seeded by train)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=tokens, use_cache=False).logits  # (B, T, V)


def _hf_fast_tokenizer(tokenizer: Tokenizer, spec: LlamaSpec) -> Any:
    from transformers import PreTrainedTokenizerFast

    from headlens.models.export import BOS_TOKEN, hf_tokenizer

    return PreTrainedTokenizerFast(
        tokenizer_object=hf_tokenizer(tokenizer, spec.d_vocab),
        bos_token=BOS_TOKEN, eos_token=BOS_TOKEN, pad_token=BOS_TOKEN, unk_token=BOS_TOKEN,
        model_max_length=spec.n_ctx,
    )


def _header(model: LlamaLM, metadata: dict[str, Any] | None) -> dict[str, Any]:
    return {"spec": model.spec.to_dict(), "tokenizer": model.tokenizer.to_spec(), "name": model.name,
            "metadata": metadata or {}}


def save_state(model: LlamaLM, path: str | os.PathLike, metadata: dict[str, Any] | None = None,
               half: bool = False) -> Path:
    """Write the HF-named weights to one ``.safetensors`` file (a training snapshot), atomically.

    The header's ``headlens`` entry holds the spec, tokenizer, name and ``metadata``, so a snapshot
    is readable on its own (:func:`load_snapshot`).
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v.detach().cpu().half() if half else v.detach().cpu().float()).contiguous()
               for k, v in model.hf.state_dict().items()}
    header = {"format": "pt", "headlens": json.dumps(_header(model, metadata))}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=header))  # the umask's mode, not 0600
    return path


def save_dir(model: LlamaLM, out_dir: str | os.PathLike, metadata: dict[str, Any] | None = None,
             half: bool = False) -> Path:
    """Write ``model`` as a Hugging Face directory: config.json, model.safetensors, tokenizer files.

    ``config.json`` also carries ``headlens``: the spec, the native tokenizer spec (so the bridge
    shows tokens as headlens does), the name and ``metadata`` (recipe, seed, steps, losses).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        **model.spec.hf_config(model.tokenizer.bos_token_id),
        "torch_dtype": "float32",  # runs in float32 even when stored as float16 (to keep the package small)
        "headlens": _header(model, metadata),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_state(model, out / WEIGHTS_FILE, metadata, half=half)
    _hf_fast_tokenizer(model.tokenizer, model.spec).save_pretrained(str(out))
    return out


def _read_header(path: Path) -> dict[str, Any] | None:
    """The ``headlens`` entry of a snapshot file, or of a directory's config.json; None if absent."""
    try:
        if path.is_dir():
            return json.loads((path / "config.json").read_text()).get("headlens")
        from safetensors import SafetensorError, safe_open

        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("headlens")
        return json.loads(raw) if raw else None
    except (OSError, ValueError, SafetensorError):  # JSONDecodeError is a ValueError
        return None


def is_snapshot(path: str | os.PathLike) -> bool:
    """True for a weights file written by :func:`save_state`."""
    path = Path(path)
    return path.is_file() and path.suffix == ".safetensors" and bool((_read_header(path) or {}).get("spec"))


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The training metadata (recipe, seed, step, loss) of a snapshot file or a saved directory."""
    header = _read_header(Path(path))
    if not header:
        raise CheckpointError(f"{str(path)!r} is not a headlens Llama snapshot or directory")
    return dict(header.get("metadata") or {})


def load_snapshot(path: str | os.PathLike) -> LlamaLM:
    """A float32 :class:`LlamaLM` from a snapshot file or a directory written here."""
    from safetensors.torch import load_file

    path = Path(path)
    header = _read_header(path)
    if not header or "spec" not in header:
        raise CheckpointError(f"{str(path)!r} is not a headlens Llama snapshot or directory")
    fields = {f.name for f in dataclasses.fields(LlamaSpec)}
    spec = LlamaSpec(**{k: v for k, v in header["spec"].items() if k in fields})
    model = LlamaLM(spec, Tokenizer.from_spec(header["tokenizer"]), header["name"])
    weights = path / WEIGHTS_FILE if path.is_dir() else path
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
    model.hf.load_state_dict(state, strict=not spec.tie_embeddings)
    return model.eval()


def load_run(model_dir: str | os.PathLike, name: str | None = None) -> Any:
    """Boot a directory written by :func:`save_dir` through the bridge (what ``headlens.load`` does)."""
    from headlens.models.hf.boot import load_bridge

    return load_bridge(model_dir, name=name)


def load_snapshot_run(path: str | os.PathLike, name: str | None = None) -> Any:
    """A snapshot file booted through the bridge (written to a temporary directory first)."""
    model = load_snapshot(path)
    with tempfile.TemporaryDirectory(prefix="headlens-llama-") as tmp:
        return load_run(save_dir(model, Path(tmp) / model.name), name=name or model.name)
