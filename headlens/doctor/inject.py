"""Plant a known multi-head bug in a copy of a native model, to watch what it does to a real model.

The doctor's other half: ``headlens.doctor.bugs`` describes each bug as an override of the
reference recipe; here a copy of a ``headlens.GPT`` gets every attention layer replaced by
:class:`BuggedAttention`, which runs that recipe on the layer's own weights. The copy runs,
produces logits of the right shape and a worse loss; ``check_attention`` on one of its layers
names the bug. The Learn view of the dashboard is built on this.

``hook_pattern`` keeps its TransformerLens name, so ``run_with_cache`` reads the bugged
pattern; its shape is what the bug makes of it (``(B, T, H, H)`` when the split forgets its
transpose: heads attend over heads).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from headlens.doctor.bugs import AttentionRecipe, apply_bug, reference_attention
from headlens.errors import ConfigError
from headlens.models.hooks import HookPoint

# the bugs the Learn view toggles: name -> (what people write, recipe overrides)
LESSON_BUGS: dict[str, tuple[str, dict[str, Any]]] = {
    "missing_transpose_split": ("q = q.view(B, T, n_heads, d_head)  # no .transpose(1, 2)",
                                {"split": "no_transpose"}),
    "wrong_view_order": ("q = q.view(B, n_heads, T, d_head)  # reshapes straight to head-first",
                         {"split": "head_first_view"}),
    "missing_transpose_merge": ("y = y.reshape(B, T, d_model)  # y is still (B, H, T, d_head)",
                                {"merge": "no_transpose"}),
}


class BuggedAttention(nn.Module):
    """A native attention layer's weights run through a bugged recipe (same names, same hooks).

    >>> from headlens.models.config import ModelConfig
    >>> from headlens.models.gpt import MultiHeadAttention
    >>> attn = MultiHeadAttention(ModelConfig(n_layers=1, n_heads=2, d_model=8, n_ctx=4, d_vocab=3))
    >>> BuggedAttention(attn, {"split": "no_transpose"})(torch.randn(1, 4, 8)).shape
    torch.Size([1, 4, 8])
    """

    def __init__(self, attn: nn.Module, overrides: dict[str, Any]) -> None:
        super().__init__()
        self.n_heads, self.d_head, self.d_model = attn.n_heads, attn.d_head, attn.d_model
        self.c_attn, self.c_proj = attn.c_attn, attn.c_proj  # the layer's own weights
        self.recipe = apply_bug(AttentionRecipe(n_heads=attn.n_heads), overrides)
        self.hook_pattern = HookPoint()  # (B, A, S, S): (B, H, T, T) unless the split is wrong

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reference_attention(x, self.c_attn.weight, self.c_attn.bias, self.c_proj.weight,
                                   self.c_proj.bias, self.recipe, pattern_hook=self.hook_pattern)


def inject_bug(model: Any, bug: str) -> Any:
    """A deep copy of the native ``model`` with ``bug`` (a key of ``LESSON_BUGS``) in every layer.

    The original model is untouched. Raises ``ConfigError`` for an unknown bug or a model that
    is not headlens' own GPT (bridged models have no attention code of ours to break).
    """
    if bug not in LESSON_BUGS:
        raise ConfigError(f"unknown bug {bug!r}; expected one of {', '.join(LESSON_BUGS)}")
    blocks = getattr(getattr(model, "transformer", None), "h", None)
    if blocks is None or not hasattr(model, "setup_hooks"):
        raise ConfigError(f"cannot inject a bug into {type(model).__name__}: it needs headlens' native GPT")
    broken = copy.deepcopy(model)
    broken.reset_hooks()
    for block in broken.transformer.h:
        block.attn = BuggedAttention(block.attn, LESSON_BUGS[bug][1])
    broken.setup_hooks()  # register the new hook points under their TransformerLens names
    broken.name = f"{getattr(model, 'name', 'model')}+{bug}"
    return broken.eval()
