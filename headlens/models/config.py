"""ModelConfig: the one description of a headlens transformer's shape.

A frozen dataclass validated on construction, so that an impossible head layout
(d_model not divisible by n_heads) fails loudly here instead of running silently.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from headlens.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    """Shape and architecture of a native headlens GPT.

    >>> cfg = ModelConfig(n_layers=2, n_heads=4, d_model=64, n_ctx=128, d_vocab=257)
    >>> cfg.d_head
    16
    """

    n_layers: int  # number of transformer blocks
    n_heads: int  # heads per attention layer; d_model is split into n_heads subspaces
    d_model: int  # residual stream width
    n_ctx: int  # longest sequence the learned positional embedding covers
    d_vocab: int  # number of token ids (tokenizer size, special tokens included)
    d_head: int = 0  # per-head width; 0 means d_model // n_heads (the GPT-2 convention); else free (tracr's)
    d_mlp: int = 0  # MLP hidden width; 0 means 4 * d_model; ignored when attn_only
    attn_only: bool = False  # no MLP sublayers (the toy models of Elhage et al. 2021)
    normalization: Literal["LN", "none"] = "LN"  # pre-sublayer LayerNorm, or none at all
    positional_embedding: Literal["learned"] = "learned"  # GPT-2's learned absolute positions
    layer_norm_eps: float = 1e-5  # GPT-2's epsilon
    act_fn: Literal["gelu_new", "relu"] = "gelu_new"  # GPT-2's tanh-approximated GELU, or ReLU (tracr's)
    causal: bool = True  # each position attends to itself and earlier ones; False: to every position
    tie_embeddings: bool = False  # lm_head shares wte (GPT-2 does); untied is easier to train small
    init_range: float = 0.02  # std of the normal init, GPT-2's value
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # free notes

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "d_model", "n_ctx", "d_vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.d_head == 0 and self.d_model % self.n_heads != 0:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                f"each head needs an equal d_model/n_heads slice (divisors of {self.d_model}: "
                f"{[d for d in range(1, self.d_model + 1) if self.d_model % d == 0][:12]})"
            )
        if self.d_head == 0:
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if not isinstance(self.d_head, int) or self.d_head <= 0:
            raise ConfigError(f"ModelConfig.d_head must be a positive int (or 0 for d_model // n_heads), got {self.d_head!r}")
        if self.d_mlp == 0:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        if self.normalization not in ("LN", "none"):
            raise ConfigError(f"normalization must be 'LN' or 'none', got {self.normalization!r}")
        if self.act_fn not in ("gelu_new", "relu"):
            raise ConfigError(f"act_fn must be 'gelu_new' or 'relu', got {self.act_fn!r}")
        if self.positional_embedding != "learned":
            raise ConfigError(
                f"positional_embedding must be 'learned', got {self.positional_embedding!r}"
            )

    @property
    def d_attn(self) -> int:
        """Width of the heads side by side, ``n_heads * d_head`` (``d_model`` unless ``d_head`` was set freely)."""
        return self.n_heads * self.d_head

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (JSON-serialisable)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build a config from a dict, refusing unknown keys by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown ModelConfig field(s) {unknown}; expected some of {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"config is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)
