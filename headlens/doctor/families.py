"""Head-count inference for Hugging Face causal LMs of every family (Llama, Mistral, Qwen2, Gemma, GPT-NeoX ...).

Why it works like the GPT-2 check (:mod:`headlens.doctor.checkpoint`): the weights fix only the
widths of the attention projections, ``Q = n_heads * head_dim`` (query rows, output columns) and
``KV = n_kv_heads * head_dim`` (key and value rows). Any layout ``(n_heads, n_kv_heads, head_dim)``
with the same two products loads in ``transformers`` without a shape error: a Llama trained as
(4, 2, 16) at d_model 64 loads as (2, 1, 32) and computes garbage. The weights still know their
layout, though: rebuilt with the layout they were trained with, the model predicts text it has
learnt; split any other way, each "head" mixes slices of several trained heads and RoPE rotates
the wrong pairs of dimensions, and the loss is much worse. So the doctor asks ``transformers``
itself to build the model under every layout the weight shapes allow (:func:`candidate_layouts`),
loads the weights into each, and compares their losses on the same evaluation text.

Layouts: ``head_dim`` runs over the common divisors of ``Q`` and ``KV`` (even ones only when the
family rotates with RoPE), ``n_heads = Q / head_dim``, ``n_kv_heads = KV / head_dim``; families
whose config has no ``head_dim`` (GPT-NeoX, Qwen2 ...) tie it to ``d_model / n_heads``, so only
those layouts are tried. A layout ``transformers`` refuses to build, load or run (GPT-J's fixed
``rotary_dim`` wider than the head) is not a candidate.

Evaluation sources (:mod:`headlens.doctor.sources`; :mod:`headlens.doctor.verdict` weighs them): a text,
the user's (``texts``, tokenized with the directory's tokenizer) or else English prose for a tokenizer that
reads words, Python standard-library source for a byte- or character-level one, checked against the model
before it counts (a word-level tokenizer makes Python source the unknown token almost everywhere); and
always periodic random segments ``BOS s s s ...`` of distinct non-special ids, at several periods (any
model with an induction circuit predicts the copies). The check itself is
:mod:`headlens.doctor.family_check`.

Each layout is built by ``from_pretrained`` with its config (the directory's key renames, tying and
conversions apply; a float32 safetensors file is read without a copy, ~0.1 s for a 135M model), with
the attention ``transformers`` chooses (SDPA where the family has it: eager attention materialises
every pattern and was 5x slower at 512 tokens).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from headlens.doctor.sources import EvalSource, periodic_sources, prose_rows, reads_words, stdlib_text
from headlens.errors import CheckpointError

ROPE_TYPES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gpt_neox", "phi3", "gptj", "mixtral", "qwen2_moe",
              "olmo", "stablelm", "cohere", "starcoder2", "granite")  # rotary families: head_dim must be even
FAMILY_MARGIN = 0.1  # nats; random-weight Llamas' splits differ by up to ~0.03, a trained model's wrong split by ~1
ENCODER_TYPES = ("bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta")


@dataclass(frozen=True)
class HeadLayout:
    """How the attention widths are split: query heads, key/value heads, width of each."""

    n_heads: int
    n_kv_heads: int
    d_head: int

    def __str__(self) -> str:
        return f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.d_head}"


def read_config(model_dir: Path) -> Any:
    """The directory's ``transformers`` config, never running repository code."""
    from transformers import AutoConfig

    try:
        raw = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {str(model_dir / 'config.json')!r}: {err}") from None
    if raw.get("model_type") in ENCODER_TYPES:
        raise CheckpointError(f"the doctor checks causal language models; {str(model_dir)!r} is a "
                              f"{raw['model_type']!r} encoder (masked LM), which it cannot score")
    try:
        return AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False, local_files_only=True)
    except Exception as err:  # unknown model_type, remote code, malformed fields
        raise CheckpointError(f"transformers cannot read {str(model_dir / 'config.json')!r}: "
                              f"{str(err).splitlines()[0]}") from None


def _has_head_dim(cfg: Any) -> bool:
    return getattr(cfg, "head_dim", None) is not None


def claimed_layout(cfg: Any, n_heads: int | None = None) -> HeadLayout:
    """The layout the config states (or ``n_heads`` query heads at the config's widths)."""
    H = int(cfg.num_attention_heads)
    H_kv = int(getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_kv_heads", None)
               or (1 if getattr(cfg, "multi_query", False) else H))
    dh = int(cfg.head_dim) if _has_head_dim(cfg) else int(cfg.hidden_size) // H
    if n_heads is None or n_heads == H:
        return HeadLayout(H, H_kv, dh)
    q, kv = H * dh, H_kv * dh
    if n_heads <= 0 or q % n_heads or kv % (q // n_heads):
        from headlens.errors import ConfigError

        raise ConfigError(f"n_heads={n_heads} does not split the query width {q} and key/value width {kv} "
                          f"into equal heads")
    return HeadLayout(n_heads, kv // (q // n_heads), q // n_heads)


def candidate_layouts(cfg: Any, claimed: HeadLayout) -> list[HeadLayout]:
    """Every layout with the claimed projection widths, fewest query heads first."""
    q, kv = claimed.n_heads * claimed.d_head, claimed.n_kv_heads * claimed.d_head
    rope = cfg.model_type in ROPE_TYPES
    out = []
    for dh in range(math.gcd(q, kv), 0, -1):
        if q % dh or kv % dh or (rope and dh % 2) or (q // dh) % (kv // dh):
            continue
        if not _has_head_dim(cfg) and dh * (q // dh) != cfg.hidden_size:
            continue  # head_dim is hidden_size / n_heads in this family
        out.append(HeadLayout(q // dh, kv // dh, dh))
    if claimed not in out:
        out.append(claimed)
    return sorted(out, key=lambda layout: layout.n_heads)


def gguf_rows(n_rows: int, header: int, layout: int) -> torch.Tensor:
    """``(n_rows,)`` indices into the query (or key) rows of a model transformers read from a llama GGUF
    whose header said ``header`` heads: the rows it would have produced had the header said ``layout``.

    llama.cpp stores each head's rows interleaved for its RoPE (``permute`` in convert_hf_to_gguf.py), and
    transformers' GGUF reader un-permutes them with the header's head count (``LlamaTensorProcessor``). So a
    header that lies scrambles the rows; re-interleaving with its count and un-permuting with another
    layout's gives that layout's rows.

    >>> gguf_rows(8, 2, 2).tolist(), gguf_rows(8, 2, 1).tolist()
    ([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 4, 5, 2, 3, 6, 7])
    """
    idx = torch.arange(n_rows)
    in_file = idx.view(header, 2, n_rows // header // 2).transpose(1, 2).reshape(n_rows)  # llama.cpp's permute
    return in_file.view(layout, n_rows // layout // 2, 2).transpose(1, 2).reshape(n_rows)  # transformers' reverse


def _regroup_gguf_rows(model: Any, header: HeadLayout, layout: HeadLayout) -> None:
    """Give every attention's q/k projection the rows a GGUF header saying ``layout`` would have given it."""
    q = gguf_rows(header.n_heads * header.d_head, header.n_heads, layout.n_heads)
    k = gguf_rows(header.n_kv_heads * header.d_head, header.n_kv_heads, layout.n_kv_heads)
    for name, module in model.named_modules():
        idx = q if name.endswith("q_proj") else k if name.endswith("k_proj") else None
        if idx is None:
            continue
        module.weight = torch.nn.Parameter(module.weight.detach()[idx], requires_grad=False)
        if getattr(module, "bias", None) is not None:
            module.bias = torch.nn.Parameter(module.bias.detach()[idx], requires_grad=False)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """``transformers`` without its warnings (the load report a layout that cannot hold the weights prints)
    and progress bars, restored afterwards."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def build(model_dir: Path, cfg: Any, layout: HeadLayout, gguf_header: HeadLayout | None = None,
          attn_implementation: str | None = None) -> Any | None:
    """The directory's weights loaded by ``transformers`` into the model rebuilt with ``layout``
    (float32, eval, its own key renames and tying), or None when this layout cannot hold them.

    ``gguf_header``: the directory is transformers' reading of a llama GGUF whose header said this layout;
    the q/k rows are then regrouped as that reader would have un-permuted them under ``layout``
    (:func:`gguf_rows`). ``attn_implementation``: transformers' default (SDPA, what the doctor's losses need)
    unless named (``"eager"`` returns attention patterns)."""
    from transformers import AutoModelForCausalLM

    c = cfg.__class__.from_dict(cfg.to_dict())
    c.num_attention_heads = layout.n_heads
    if hasattr(c, "num_key_value_heads"):
        c.num_key_value_heads = layout.n_kv_heads
    if isinstance(getattr(type(c), "head_dim", None), property):  # derived (Falcon: hidden_size // heads)
        if c.head_dim != layout.d_head:
            return None  # the family cannot be given another head width
    elif _has_head_dim(c):
        c.head_dim = layout.d_head
    try:
        with quiet_transformers():  # its load report and progress bars are not headlens' output
            model, info = AutoModelForCausalLM.from_pretrained(
                str(model_dir), config=c, dtype=torch.float32, local_files_only=True,
                trust_remote_code=False, output_loading_info=True, ignore_mismatched_sizes=False,
                **({"attn_implementation": attn_implementation} if attn_implementation else {}))
    except (RuntimeError, ValueError, OSError):  # size mismatch, or a layout the family refuses
        return None
    if any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")):
        return None  # a key this layout lacks, or would re-initialise: it cannot hold these weights
    if gguf_header is not None and layout != gguf_header:
        _regroup_gguf_rows(model, gguf_header, layout)
    return model.eval()


def n_ctx(cfg: Any) -> int:
    return int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 2048)


def _stack(rows: list[list[int]]) -> list[torch.Tensor]:
    by_len: dict[int, list[list[int]]] = {}
    for r in rows:
        by_len.setdefault(len(r), []).append(r)
    return [torch.tensor(group) for _, group in sorted(by_len.items())]


def first_token(model_dir: Path, cfg: Any, tok: Any) -> tuple[int | None, Any]:
    """What every evaluation row starts with, and the :class:`~headlens.models.hf.prefix.Prefix` that says why:
    headlens' rule for position 0 (:mod:`headlens.models.hf.prefix`, as every probe uses) when the directory
    has a tokenizer, else the config's BOS (None: rows start with their first token)."""
    if tok is not None:
        from headlens.models.hf.prefix import adds_bos, choose

        prefix = choose(tok, adds_bos(model_dir), int(cfg.vocab_size))
        return prefix.token_id, prefix
    bos = getattr(cfg, "bos_token_id", None)
    return (int(bos) if isinstance(bos, int) else None), None


def text_source(cfg: Any, tok: Any, first: int | None, n_rows: int, T: int, seed: int, texts: list[str] | None
                ) -> EvalSource | None:
    """The text source: the user's ``texts``, else English prose (a tokenizer that reads words) or Python
    source (bytes, characters); every row starts with ``first`` (none when None). None without a tokenizer."""
    if tok is None:
        return None
    tok.model_max_length = 1 << 30  # long texts are cut into rows here (no length warning)
    if texts is not None:
        rows = [tok(t)["input_ids"] for t in texts if t.strip()]
        if first is not None:  # the tokenizer may put it first itself
            rows = [r if r[:1] == [first] else [first, *r] for r in rows]
        rows = [r[: n_ctx(cfg)] for r in rows if len(r[: n_ctx(cfg)]) >= 2]
        if not rows:
            raise CheckpointError("the evaluation text is empty: give at least one line of text")
        return EvalSource("text", _stack(rows), f"the given text ({len(rows)} rows, {sum(map(len, rows))} tokens)")

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    if reads_words(encode):
        rows = prose_rows(encode, n_rows, T, first, seed)
        if rows is not None:
            return EvalSource("text", [rows], f"English prose of the Python documentation ({rows.shape[0]} x "
                                              f"{T} tokens)")
    body_len = T - (first is not None)
    ids = encode(stdlib_text(n_rows * T * 2, seed))
    n = min(n_rows, len(ids) // body_len)
    body = torch.tensor(ids[: n * body_len]).view(n, body_len)  # (N, T - 1) after a first token, else (N, T)
    rows = body if first is None else torch.cat([torch.full((n, 1), first), body], 1)  # (N, T)
    return EvalSource("text", [rows], f"Python stdlib source ({n} x {T} tokens)")


def random_sources(cfg: Any, n_rows: int, T: int, seed: int, tok: Any = None, first: int | None = None
                   ) -> list[EvalSource]:
    """Periodic random segments of distinct non-special ids (:func:`headlens.doctor.sources.periodic_sources`),
    each row starting with ``first`` (none when None)."""
    special = {i for i in (first, getattr(cfg, "bos_token_id", None), getattr(cfg, "eos_token_id", None),
                           getattr(cfg, "pad_token_id", None), getattr(tok, "unk_token_id", None)) if isinstance(i, int)}
    if tok is not None:
        special |= {i for i in getattr(tok, "all_special_ids", []) if isinstance(i, int)}
    ids = torch.tensor([i for i in range(int(cfg.vocab_size)) if i not in special])
    return periodic_sources(ids, n_rows, T, first, seed)


def tokenizer(model_dir: Path, required: bool = True) -> Any:
    """The directory's tokenizer (None when it has none and ``required`` is False)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False, local_files_only=True)
    except Exception:
        if not required:
            return None
        raise CheckpointError(f"{str(model_dir)!r} has no tokenizer the doctor can read; cannot tokenize "
                              f"--text (drop --text to use generated token ids)") from None


@torch.inference_mode()
def row_losses(model: Any, rows: list[torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of each evaluation row."""
    out = []
    for tokens in rows:  # (N, T) each
        logits = model(tokens[:, :-1], use_cache=False).logits.float()  # (N, T - 1, V)
        ce = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
        out.append(ce.view(tokens.shape[0], -1).double().mean(dim=1))  # (N,)
    return torch.cat(out)


CACHE_PARAMS = 1 << 26  # parameters of all layouts' models together below which every built model is kept


class Builder:
    """``evaluate(n_heads, rows)`` for :func:`headlens.doctor.racing.race`: each layout built when it is first
    needed, the claimed one kept (every source runs it) and one other (the sequential rule runs the layouts
    in turn, so more would only hold memory; small models keep them all: rebuilding would cost more than
    running them)."""

    def __init__(self, model_dir: Path, cfg: Any, layouts: dict[int, HeadLayout], keep: int,
                 on_run: Callable[[int, int], None] | None = None, gguf_header: HeadLayout | None = None) -> None:
        self.model_dir, self.cfg, self.layouts, self.keep, self.on_run = model_dir, cfg, layouts, keep, on_run
        self.gguf_header = gguf_header
        self.models: dict[int, Any] = {}
        self.broken: set[int] = set()

    def model(self, h: int) -> Any | None:
        if h in self.broken:
            return None
        if h not in self.models:
            model = build(self.model_dir, self.cfg, self.layouts[h], self.gguf_header)
            if model is None:
                self.broken.add(h)
                return None
            if sum(p.numel() for p in model.parameters()) * len(self.layouts) > CACHE_PARAMS:
                self.models = {k: m for k, m in self.models.items() if k == self.keep}
            self.models[h] = model
        return self.models[h]

    def __call__(self, h: int, rows: list[torch.Tensor]) -> torch.Tensor | None:
        model = self.model(h)
        if model is None:
            return None
        try:
            losses = row_losses(model, rows)
        except (RuntimeError, ValueError, IndexError):  # e.g. GPT-J's rotary_dim wider than this head
            self.broken.add(h)
            self.models.pop(h, None)
            return None
        if self.on_run is not None:
            self.on_run(h, sum(r.numel() for r in rows))
        return losses
