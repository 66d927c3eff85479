"""Hook points with TransformerLens' vocabulary, without importing TransformerLens.

Why our own: importing transformer_lens takes seconds and pulls in transformers and
friends; the native model must need torch only. Conventions follow TL so code written
for it reads naturally here:

* a ``HookPoint`` is an identity module placed at an interesting activation and named
  TL-style (``blocks.0.attn.hook_pattern``);
* a hook function is ``fn(tensor, hook)``: return ``None`` to observe, a tensor to replace;
* hooks are global state on the module, so they are only ever installed by the
  ``hooks(...)`` context manager, which removes them in ``finally`` even when the
  forward pass raises.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from headlens.errors import HeadlensError

HookFn = Callable[..., torch.Tensor | None]
NameOrFilter = str | Callable[[str], bool]


class HookPoint(nn.Module):
    """Identity module that runs its hook functions on the tensor passing through.

    >>> hp = HookPoint(); hp.name = "demo"
    >>> hp.add_hook(lambda x, hook: x * 2)
    >>> hp(torch.ones(1)).item()
    2.0
    """

    def __init__(self) -> None:
        super().__init__()
        self.name: str = ""
        self.fns: list[HookFn] = []
        self.ctx: dict[str, Any] = {}  # scratch space for hooks that keep state

    @property
    def has_hooks(self) -> bool:
        return bool(self.fns)

    def add_hook(self, fn: HookFn) -> None:
        self.fns.append(fn)

    def remove_hooks(self) -> None:
        self.fns.clear()
        self.ctx.clear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fn in self.fns:
            out = fn(x, hook=self)
            if out is not None:
                x = out
        return x

    def extra_repr(self) -> str:
        return f"name={self.name!r}, n_hooks={len(self.fns)}"


class ActivationCache(dict):
    """A dict of hook name -> tensor, with a few TL-style conveniences."""

    def pattern(self, layer: int) -> torch.Tensor:
        """The attention pattern of ``layer``: ``(batch, head, query_pos, key_pos)``."""
        return self[f"blocks.{layer}.attn.hook_pattern"]


def tl_hook_name(module_path: str) -> str:
    """Translate a GPT-2 module path to the TransformerLens hook name.

    >>> tl_hook_name("transformer.h.3.attn.hook_pattern")
    'blocks.3.attn.hook_pattern'
    """
    name = re.sub(r"^transformer\.", "", module_path)
    return re.sub(r"^h\.(\d+)\.", r"blocks.\1.", name)


class HookedRootModule(nn.Module):
    """Mixin for models whose hook points are reachable by TL-style names.

    Subclasses call ``self.setup_hooks()`` at the end of ``__init__``.
    """

    hook_dict: dict[str, HookPoint]

    def setup_hooks(self) -> None:
        self.hook_dict = {}
        for path, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = tl_hook_name(path)
                self.hook_dict[module.name] = module

    # -- resolution ---------------------------------------------------------------------------
    def _resolve(self, name: NameOrFilter) -> list[HookPoint]:
        if callable(name):
            return [hp for n, hp in self.hook_dict.items() if name(n)]
        if name not in self.hook_dict:
            close = [n for n in self.hook_dict if n.split(".")[-1] == name.split(".")[-1]][:4]
            raise HeadlensError(
                f"unknown hook name {name!r}; expected one of the model's hook names, "
                f"e.g. {close or list(self.hook_dict)[:4]}"
            )
        return [self.hook_dict[name]]

    def reset_hooks(self) -> None:
        """Remove every hook from every hook point."""
        for hp in self.hook_dict.values():
            hp.remove_hooks()

    def active_hooks(self) -> list[str]:
        """Names of the hook points that currently carry a hook (empty when nothing leaked)."""
        return [n for n, hp in self.hook_dict.items() if hp.has_hooks]

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[NameOrFilter, HookFn]] = ()) -> Iterator[Any]:
        """Install ``(name_or_filter, fn)`` hooks for the duration of a ``with`` block.

        The hooks are removed on exit, also when the block raises.
        """
        added: list[tuple[HookPoint, HookFn]] = []
        try:
            for name, fn in fwd_hooks:
                for hp in self._resolve(name):
                    hp.add_hook(fn)
                    added.append((hp, fn))
            yield self
        finally:
            for hp, fn in added:
                with contextlib.suppress(ValueError):
                    hp.fns.remove(fn)
                if not hp.fns:
                    hp.ctx.clear()

    def run_with_hooks(
        self, *args: Any, fwd_hooks: Sequence[tuple[NameOrFilter, HookFn]] = (), **kwargs: Any
    ) -> torch.Tensor:
        """Run ``forward`` with temporary hooks (removed afterwards, even on error)."""
        with self.hooks(fwd_hooks):
            return self(*args, **kwargs)

    def run_with_cache(
        self,
        *args: Any,
        names_filter: NameOrFilter | Sequence[str] | None = None,
        detach: bool = True,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, ActivationCache]:
        """Run ``forward`` and return ``(logits, cache)`` of the activations named by the filter.

        ``names_filter`` is a hook name, a list of names, a predicate, or None for all hooks.
        """
        if names_filter is None:
            names = list(self.hook_dict)
        elif isinstance(names_filter, str):
            names = [names_filter]
        elif callable(names_filter):
            names = [n for n in self.hook_dict if names_filter(n)]
        else:
            names = list(names_filter)
        cache = ActivationCache()

        def save(x: torch.Tensor, hook: HookPoint) -> None:
            cache[hook.name] = x.detach() if detach else x

        out = self.run_with_hooks(*args, fwd_hooks=[(n, save) for n in names], **kwargs)
        return out, cache
