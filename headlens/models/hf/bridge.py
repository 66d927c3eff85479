"""TransformerLens bridge backend: any Hugging Face model TransformerBridge can boot offline.

Why a wrapper: ``TransformerBridge`` already names its hook points the TransformerLens way
(``blocks.{l}.attn.hook_pattern`` ``(B, H, Q, K)``, ``blocks.{l}.attn.hook_z``
``(B, T, H, d_head)``, both checked in ``tests/models/test_bridge.py``), but its call conventions
differ from the native ``GPT`` in small ways that matter to a scan: tokenization (CLS/SEP for
BERT), padding masks for bidirectional models, hook removal on error, and what ``forward``
returns. ``BridgeModel`` gives it exactly the surface every headlens backend shares.

transformer_lens (about 5-10 s to import) is imported inside :func:`load_bridge` only. What an
``hf:`` reference points at (a local directory or a hub repository at a revision, through the
Hugging Face cache) is decided in :mod:`headlens.models.hf.hub`; headlens never sets
``HF_HUB_OFFLINE`` itself: online users download, offline users set it.

A directory without a tokenizer still boots: ``tokenizer`` is None, generated probes draw token
ids from the config's vocabulary, and anything that needs text (``to_tokens``) is refused with
one line naming the missing files.

What ``forward`` returns: logits ``(B, T, d_vocab)`` when the checkpoint has a language-model
head (``GPT2LMHeadModel``, ``BertForMaskedLM`` ...). A bare encoder checkpoint (architecture
``BertModel``, e.g. all-MiniLM-L6-v2, a sentence-transformers model) has no head weights: the
bridge would boot ``BertForMaskedLM`` with a *randomly initialised* MLM head, so its logits mean
nothing. For those ``forward`` returns the final hidden states ``(B, T, d_model)`` (the token
embeddings sentence-transformers pools) and ``output_kind == "hidden"``; the random head is
never run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlens.errors import HeadlensError, ProbeError
from headlens.models.hf.prefix import Prefix
from headlens.models.hf.specs import attention_specs, n_kv_heads
from headlens.models.hooks import ActivationCache
from headlens.models.tokenizer import Tokenizer

HookFn = Callable[..., torch.Tensor | None]
NameOrFilter = str | Callable[[str], bool]



@dataclass(frozen=True)
class BridgeConfig:
    """The TransformerLens-named shape facts of a bridged model (same names as ModelConfig)."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    n_ctx: int
    d_vocab: int
    n_kv_heads: int = 0  # key/value heads (grouped/multi-query attention); 0 means n_heads

    def __post_init__(self) -> None:
        if not self.n_kv_heads:
            object.__setattr__(self, "n_kv_heads", self.n_heads)


class _NamedHook:
    """The bridge's HookPoint as a hook function sees it, under the name the hook was added by.

    The bridge reports aliases by their canonical name (a ``hook_z`` hook is called with
    ``hook.name == "blocks.0.attn.o.hook_in"``); headlens code keys on the TransformerLens name.
    """

    def __init__(self, point: Any, name: str) -> None:
        self._point = point
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._point, attr)


def _as_named(fn: HookFn, name: str) -> HookFn:
    def named(x: torch.Tensor, hook: Any) -> torch.Tensor | None:
        return fn(x, hook=_NamedHook(hook, name))

    return named


class _StopForward(Exception):
    """Raised from a hook to end the forward pass once the final hidden state is known."""


class BridgeModel:
    """A TransformerBridge behind the shared headlens model surface.

    Attributes:
        bridge: the underlying ``transformer_lens.model_bridge.TransformerBridge``.
        output_kind: ``"logits"`` (``forward`` returns ``(B, T, d_vocab)``) or ``"hidden"``
            (``(B, T, d_model)``, for checkpoints without an output head).
    """

    def __init__(
        self, bridge: Any, name: str, output_kind: str = "logits", native_tokenizer: Tokenizer | None = None,
        hf_config: dict[str, Any] | None = None, tokenizer_dir: str | None = None,
    ) -> None:
        self.bridge = bridge
        self.hf_config = dict(hf_config or {})
        self.tokenizer_dir = tokenizer_dir  # where tokenizer files were looked for (for error messages)
        self.substitutions: list[str] = []  # what runs in place of what the directory asks for (boot.substitutions)
        self.prefix: Prefix | None = None  # what a causal prompt starts with, and why (headlens.models.hf.prefix)
        self.native_tokenizer = native_tokenizer  # set for directories written by headlens export-hf
        self.name = name
        self.output_kind = output_kind
        c = bridge.cfg
        self.cfg = BridgeConfig(
            n_layers=int(c.n_layers), n_heads=int(c.n_heads), d_model=int(c.d_model),
            d_head=int(c.d_head), n_ctx=int(c.n_ctx), d_vocab=int(c.d_vocab), n_kv_heads=n_kv_heads(bridge),
        )
        self.is_causal = getattr(c, "attention_dir", "causal") == "causal"
        self.tokenizer = bridge.tokenizer
        self.current_attention_mask: torch.Tensor | None = None  # (B, T) of the forward in progress
        self._final_hook = self._find_final_hook() if output_kind == "hidden" else None

    # -- the surface every backend shares -----------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.cfg.n_layers

    @property
    def n_heads(self) -> int:
        return self.cfg.n_heads

    @property
    def device(self) -> torch.device:
        """Where inputs go: the embedding's device (a model spread by a device map has several)."""
        placed = str(getattr(self.bridge.cfg, "device", None) or "")
        if placed and placed not in ("meta", "disk"):
            return torch.device(placed)
        first = next(self.bridge.parameters()).device
        return torch.device("cpu") if first.type == "meta" else first  # offloaded to disk: runs on the CPU

    @property
    def dtype(self) -> torch.dtype:
        return next(self.bridge.parameters()).dtype

    @property
    def bos_token_id(self) -> int:
        """The id every prompt starts with: CLS for BERT-style encoders, else BOS (:attr:`prefix` decides)."""
        tok = self.tokenizer
        if self.is_causal and self.prefix is not None and self.prefix.token_id is not None:
            return self.prefix.token_id
        if tok is None:  # no tokenizer: the config's ids
            ids = [self.hf_config.get(k) for k in ("bos_token_id", "cls_token_id", "eos_token_id")]
        elif not self.is_causal and tok.cls_token_id is not None:
            ids = [tok.cls_token_id]
        else:
            ids = [tok.bos_token_id, tok.cls_token_id, tok.eos_token_id]
        for tid in ids:
            if isinstance(tid, list):
                tid = tid[0] if tid else None
            if tid is not None:
                return int(tid)
        raise HeadlensError(f"model {self.name!r} has no BOS/CLS token")

    @property
    def special_token_ids(self) -> set[int]:
        """Ids of CLS/SEP/PAD/BOS/EOS/UNK/MASK: positions detectors usually skip."""
        if self.tokenizer is None:
            keys = ("bos_token_id", "eos_token_id", "pad_token_id", "cls_token_id", "sep_token_id")
            values = [self.hf_config.get(k) for k in keys]
            flat = [v for x in values for v in (x if isinstance(x, list) else [x])]
            return {int(v) for v in flat if isinstance(v, int) and 0 <= v < self.cfg.d_vocab}
        return {int(i) for i in self.tokenizer.all_special_ids} | {self.bos_token_id}

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            from headlens.models.hf.hub import TOKENIZER_FILES

            raise ProbeError(
                f"model {self.name!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)} in "
                f"{self.tokenizer_dir or 'its directory'}); text input needs one; generated probes do not"
            )
        return self.tokenizer

    def attention_specs(self) -> list[Any] | None:
        """Per layer, how the LSE scan redoes this model's attention scores (``headlens.scoring.lse``).

        q and k come from ``hook_rot_q``/``hook_rot_k`` (after the rotary embedding) where the bridge
        has them, else ``hook_q``/``hook_k``; ``(B, T, H, d)`` with unrepeated KV heads under GQA. The
        scale is the Hugging Face module's own ``scaling`` (``1/sqrt(d_head)`` where it has none),
        the sliding window and logit soft-capping come from the HF config (per layer where
        ``layer_types`` says so). Tests check the patterns this implies against ``transformers``'
        eager attentions. None when a layer lacks q/k hooks: the scan then reads the pattern.
        """
        return attention_specs(self.bridge, self.is_causal)

    def fused_attention(self) -> contextlib.AbstractContextManager[bool]:
        """For a sparse scan: inside the block, attention runs fused (SDPA, or a blocked attention for
        soft-capped and sink layers; no ``(B, H, T, T)`` pattern) and still shows q and k to the hooks
        named by ``attention_specs``; yields whether it could (:mod:`headlens.models.hf.fused`; every
        family of the architecture matrix). ``hook_pattern`` and ``hook_z`` do not fire inside."""
        from headlens.models.hf.fused import fused_attention

        return fused_attention(self.bridge)

    @property
    def hook_dict(self) -> dict[str, Any]:
        return self.bridge.hook_dict

    def to_tokens(self, text: str | list[str], prepend_bos: bool = True) -> torch.Tensor:
        """Tokenize with the model's own HF tokenizer to ``(batch, pos)`` ids.

        ``prepend_bos`` adds what the model expects around a text: ``[CLS] ... [SEP]`` for
        BERT-style encoders, a leading BOS for causal models (the token :attr:`prefix` chose, whatever the
        tokenizer itself adds: ``docs/real-models.md``); special-token strings inside the
        text are tokenized as plain text. Texts of different token
        lengths are right-padded when the model has a distinct PAD token (forward then masks
        the pads); otherwise they are refused, like the native model does.
        """
        texts = [text] if isinstance(text, str) else list(text)
        if not texts:
            raise ProbeError("to_tokens got no texts")
        tok = self._require_tokenizer()
        # text is text: a literal "<bos>" or "[SEP]" in it is not a special token
        chosen = self.is_causal and self.prefix is not None  # the prefix, not the tokenizer, starts the prompt
        specials = prepend_bos and not chosen
        rows = [list(tok(t, add_special_tokens=specials, split_special_tokens=True)["input_ids"]) for t in texts]
        if prepend_bos and self.is_causal:
            bos = [] if chosen and self.prefix.token_id is None else [self.bos_token_id]
            rows = [r if not chosen and r[:1] == bos else [*bos, *r] for r in rows]
        longest = max(len(r) for r in rows)
        if longest > self.cfg.n_ctx:
            raise ProbeError(f"text is {longest} tokens long; this model's context is n_ctx={self.cfg.n_ctx}")
        if len({len(r) for r in rows}) > 1:
            pad = self._pad_id()
            if pad is None:
                raise ProbeError("to_tokens got texts of different token lengths; tokenize them one by one")
            rows = [r + [pad] * (longest - len(r)) for r in rows]
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def to_str_tokens(self, tokens: str | torch.Tensor) -> list[str]:
        if isinstance(tokens, str):
            tokens = self.to_tokens(tokens)
        ids = [int(i) for i in (tokens[0] if tokens.ndim == 2 else tokens)]
        native = self.native_tokenizer
        if native is not None and all(i < native.d_vocab for i in ids):
            return [native.str_token(i) for i in ids]  # same strings as the native model shows
        if self.tokenizer is None:
            return [f"<{i}>" for i in ids]  # no tokenizer: ids are all there is
        return [str(s) for s in self.tokenizer.convert_ids_to_tokens(ids)]

    def forward(
        self, tokens: torch.Tensor | str | list[str], attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``(B, T, d_vocab)`` (or final hidden states, see ``output_kind``).

        For a bidirectional model without ``attention_mask``, PAD positions are masked out
        (derived from the tokens), so padded and unpadded prompts give the same result at
        real positions.
        """
        if not isinstance(tokens, torch.Tensor):
            tokens = self.to_tokens(tokens)
        tokens = tokens.to(self.device)
        if tokens.ndim != 2:
            raise ProbeError(f"tokens must be (batch, pos), got shape {tuple(tokens.shape)}")
        if tokens.shape[1] > self.cfg.n_ctx:
            raise ProbeError(f"input has {tokens.shape[1]} positions; this model's context is n_ctx={self.cfg.n_ctx}")
        if attention_mask is None and not self.is_causal:
            pad = self._pad_id()
            if pad is not None and bool((tokens == pad).any()):
                attention_mask = (tokens != pad).long()  # (B, T), 1 = real token
        kwargs: dict[str, Any] = {"return_type": "logits"}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(self.device)
        # hooks that need the padding (uniform ablation of a bidirectional model) read it here:
        # the bridge fires hook_pattern only after hook_z, too late to derive it from the pattern
        self.current_attention_mask = kwargs.get("attention_mask")
        try:
            if self._final_hook is None:
                return self.bridge(tokens, **kwargs)
            return self._forward_hidden(tokens, kwargs)
        finally:
            self.current_attention_mask = None

    __call__ = forward

    # -- hooks ----------------------------------------------------------------------------------
    def _names(self, name: NameOrFilter, dedupe: bool = True, hook_dict: dict[str, Any] | None = None) -> list[str]:
        """Hook names for a name or predicate. The bridge lists some hook points under two names
        (``attn.hook_z`` is an alias of ``attn.o.hook_in``); ``dedupe`` keeps one name per point so
        a predicate never installs the same function twice. ``hook_dict``: the bridge's, when the caller
        resolves several names (the bridge rebuilds it, aliases and all, on every access: ~1 ms on SmolLM2)."""
        hook_dict = self.bridge.hook_dict if hook_dict is None else hook_dict
        if callable(name):
            names = [n for n in hook_dict if name(n) and self._usable(n)]
            if not dedupe:
                return names
            by_point = {id(hook_dict[n]): n for n in names}  # the last (alias) name per point
            return [n for n in names if by_point[id(hook_dict[n])] == n]
        if name not in hook_dict:
            close = [n for n in hook_dict if n.split(".")[-1] == name.split(".")[-1]][:4]
            raise HeadlensError(
                f"unknown hook name {name!r}; expected one of the model's hook names, "
                f"e.g. {close or list(hook_dict)[:4]}"
            )
        return [name]

    def _usable(self, name: str) -> bool:
        gated = getattr(self.bridge, "_gated_hook_reason", None)
        return gated is None or gated(name) is None

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[NameOrFilter, HookFn]] = ()) -> Iterator[BridgeModel]:
        """Install ``(name_or_filter, fn)`` hooks for a ``with`` block; removed on exit, also on error.

        ``fn(tensor, hook)`` observes (returns None) or replaces (returns a tensor).
        """
        points = self.bridge.hook_dict if fwd_hooks else {}  # once for every name (a scan's batch installs 30-60)
        resolved = [(n, _as_named(fn, n)) for name, fn in fwd_hooks for n in self._names(name, hook_dict=points)]
        with self.bridge.hooks(fwd_hooks=resolved, reset_hooks_end=True):
            yield self

    def run_with_hooks(
        self,
        tokens: torch.Tensor | str | list[str],
        fwd_hooks: Sequence[tuple[NameOrFilter, HookFn]] = (),
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run ``forward`` with temporary hooks (removed afterwards, even on error)."""
        with self.hooks(fwd_hooks):
            return self.forward(tokens, attention_mask=attention_mask)

    def run_with_cache(
        self,
        tokens: torch.Tensor | str | list[str],
        names_filter: NameOrFilter | Sequence[str] | None = None,
        attention_mask: torch.Tensor | None = None,
        detach: bool = True,
    ) -> tuple[torch.Tensor, ActivationCache]:
        """Run ``forward`` and return ``(output, cache)``; cache keys are the names asked for."""
        if names_filter is None:
            names = [n for n in self.bridge.hook_dict if self._usable(n)]
        elif isinstance(names_filter, str):
            names = [names_filter]
        elif callable(names_filter):
            names = self._names(names_filter, dedupe=False)  # observers: cache under every name
        else:
            names = list(names_filter)
        cache = ActivationCache()

        def saver(key: str) -> HookFn:
            def save(x: torch.Tensor, hook: Any) -> None:
                cache[key] = x.detach() if detach else x

            return save

        out = self.run_with_hooks(tokens, [(n, saver(n)) for n in names], attention_mask)
        return out, cache

    def active_hooks(self) -> list[str]:
        """Names of hook points that carry a temporary forward hook (empty when nothing leaked).

        The bridge's own permanent hooks (it installs some for BERT's MLP aliases) are not ours.
        """
        hooked = {
            id(hp): n  # one name per hook point, the last (alias, e.g. attn.hook_z) one
            for n, hp in self.bridge.hook_dict.items()
            if any(not getattr(h, "is_permanent", False) for h in getattr(hp, "fwd_hooks", ()))
        }
        return list(hooked.values())

    def reset_hooks(self) -> None:
        self.bridge.reset_hooks()

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.bridge.parameters()

    def eval(self) -> BridgeModel:
        self.bridge.eval()
        return self

    # -- helpers ------------------------------------------------------------------------------
    def _pad_id(self) -> int | None:
        if self.tokenizer is None:
            pad = self.hf_config.get("pad_token_id")
            doubles = pad in (self.hf_config.get("bos_token_id"), self.hf_config.get("eos_token_id"))
            return None if not isinstance(pad, int) or doubles else pad
        pad = self.tokenizer.pad_token_id
        if pad is None or pad in (self.tokenizer.bos_token_id, self.tokenizer.eos_token_id):
            return None  # PAD doubles as a real token: padding cannot be told from text
        return int(pad)

    def _find_final_hook(self) -> str:
        """The hook whose input is the encoder's final hidden state (the head's input)."""
        for name in ("mlm_head.hook_in", "ln_final.hook_in", "unembed.hook_in"):
            if name in self.bridge.hook_dict:
                return name
        raise HeadlensError(f"cannot find the final hidden state of {self.name!r} (no head hook)")

    def _forward_hidden(self, tokens: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        box: list[torch.Tensor] = []

        def grab(x: torch.Tensor, hook: Any) -> None:
            box.append(x)
            raise _StopForward  # the head is random for headless checkpoints: never run it

        with contextlib.suppress(_StopForward), self.bridge.hooks(fwd_hooks=[(self._final_hook, grab)]):
            self.bridge(tokens, **kwargs)
        if not box:
            raise HeadlensError(f"the forward pass of {self.name!r} never reached {self._final_hook}")
        return box[0]  # (B, T, d_model)

    def __repr__(self) -> str:
        c = self.cfg
        return (
            f"BridgeModel({self.name!r}, n_layers={c.n_layers}, n_heads={c.n_heads}, d_model={c.d_model}, "
            f"causal={self.is_causal}, output={self.output_kind})"
        )
