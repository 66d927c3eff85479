"""Zoo recipes: everything needed to re-train a shipped model from a seed.

A recipe fixes the architecture, tokenizer, data stream and optimiser schedule.
``headlens train NAME`` runs one (``headlens.training.train.train``); the shipped weights
under ``headlens/zoo/weights/`` are its outputs at the default steps and seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from headlens.errors import ConfigError
from headlens.models.config import ModelConfig
from headlens.models.tokenizer import Tokenizer
from headlens.probes import data
from headlens.training.llama import LlamaLM, LlamaSpec


class TrainBatch(NamedTuple):
    """What a sampler may return instead of bare ``(B, T + 1)`` tokens.

    Attributes:
        tokens: ``(B, T + 1)`` ids, BOS first.
        weights: ``(B, T)`` float loss weight of each target ``tokens[:, t + 1]`` (None: all 1).
    """

    tokens: torch.Tensor
    weights: torch.Tensor | None = None


# (generator, batch) -> (B, T + 1) tokens, a TrainBatch, or a list of TrainBatch (their losses summed)
Sampler = Callable[[torch.Generator, int], torch.Tensor | TrainBatch | list[TrainBatch]]


@dataclass(frozen=True)
class Recipe:
    """One training recipe (architecture + data + schedule)."""

    name: str
    summary: str  # one line: what the model learns
    config: ModelConfig | LlamaSpec  # a native GPT, or a Hugging Face Llama (shipped as a directory)
    tokenizer: Tokenizer
    seq_len: int  # tokens per training row after BOS (row length seq_len + 1 <= n_ctx)
    steps: int  # default number of optimiser steps
    batch_size: int
    lr: float
    warmup: int = 100  # linear warm-up steps, then cosine decay to lr * min_lr_frac
    min_lr_frac: float = 0.1
    weight_decay: float = 0.0  # AdamW decay on matrices only
    grad_clip: float = 1.0
    seed: int = 0
    snapshots: int = 0  # default number of intermediate snapshots
    target_weights: dict[int, float] = field(default_factory=dict, compare=False, hash=False)  # token id -> loss weight
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def sampler(self) -> Sampler:
        """The training-batch sampler for this recipe."""
        return _SAMPLERS[self.name](self)

    @property
    def is_hf(self) -> bool:
        """True when the recipe trains a ``transformers`` model (saved as a Hugging Face directory)."""
        return isinstance(self.config, LlamaSpec)

    def build_model(self) -> torch.nn.Module:
        """A freshly initialised model (weights from torch's global generator): ``forward(tokens)`` -> logits."""
        if isinstance(self.config, LlamaSpec):
            return LlamaLM(self.config, self.tokenizer, self.name)
        from headlens.models.gpt import GPT

        return GPT(self.config, tokenizer=self.tokenizer, name=self.name)

    def loss_weights(self) -> torch.Tensor | None:
        """``(d_vocab,)`` weight of each target token in the training loss, or None when all are 1."""
        if not self.target_weights:
            return None
        w = torch.ones(self.config.d_vocab)
        for tid, weight in self.target_weights.items():
            w[tid] = weight
        return w


def _induction_sampler(r: Recipe) -> Sampler:
    def sample(gen: torch.Generator, batch: int) -> torch.Tensor:
        return data.periodic_repeat_batch(
            gen, batch, r.seq_len, r.tokenizer.n_symbols, r.tokenizer.bos_token_id,
            min_len=r.extra["min_repeat"], max_len=r.extra["max_repeat"],
        )

    return sample


def _code_sampler(r: Recipe) -> Sampler:
    corpus = data.stdlib_corpus(r.extra.get("max_bytes", 0))
    frac = r.extra.get("bracket_frac", 0.0)  # share of each batch drawn around a hard closer
    hard = data.hard_closer_positions(corpus.train) if frac > 0 else None

    def sample(gen: torch.Generator, batch: int) -> torch.Tensor:
        n_b = round(batch * frac)
        rows = data.window_batch(gen, corpus.train, batch - n_b, r.seq_len, r.tokenizer.bos_token_id)
        if n_b:
            nested = data.bracket_window_batch(gen, corpus.train, hard, n_b, r.seq_len, r.tokenizer.bos_token_id)
            rows = torch.cat([rows, nested])
        return rows

    return sample


def _dyck_sampler(r: Recipe) -> Sampler:
    def sample(gen: torch.Generator, batch: int) -> torch.Tensor:
        return data.dyck_batch(gen, batch, r.seq_len, r.tokenizer.bos_token_id, r.extra["max_depth"])

    return sample


def _needle_sampler(r: Recipe) -> Sampler:
    e, n_ctx = r.extra, r.config.n_ctx
    calls = [0]  # one call per optimiser step: the step number, for the two-phase schedule

    def sample(gen: torch.Generator, batch: int) -> list[TrainBatch]:
        calls[0] += 1
        n_sym, bos = r.tokenizer.n_symbols, r.tokenizer.bos_token_id
        short = data.periodic_repeat_batch(gen, batch, r.seq_len, n_sym, bos,
                                           min_len=e["min_repeat"], max_len=e["max_repeat"])
        if calls[0] <= e["long_start"]:
            return [TrainBatch(short)]
        # half the long rows fill the context, half stop at a random length (256 .. n_ctx - 1 tokens)
        full = float(torch.rand((), generator=gen)) < 0.5
        length = n_ctx - 1 if full else int(torch.randint(256, n_ctx, (1,), generator=gen))
        tokens, w = data.needle_batch(gen, e["long_batch"], length, n_sym, bos, e["long_needles"],
                                      e["min_needle"], e["max_needle"])
        return [TrainBatch(short), TrainBatch(tokens, w)]

    return sample


_SAMPLERS: dict[str, Callable[[Recipe], Sampler]] = {
    "induction-2l": _induction_sampler,
    "llama-induction": _induction_sampler,
    "code": _code_sampler,
    "dyck": _dyck_sampler,
    "needle-2k": _needle_sampler,
}


def _induction_recipe() -> Recipe:
    tok = Tokenizer.char_level(data.INDUCTION_ALPHABET)
    cfg = ModelConfig(
        n_layers=2, n_heads=4, d_model=64, n_ctx=128, d_vocab=tok.d_vocab,
        attn_only=True, normalization="none",
    )
    return Recipe(
        name="induction-2l",
        summary="attention-only 2-layer model on random letters with a segment repeating at a random period",
        config=cfg, tokenizer=tok, seq_len=64, steps=14000, batch_size=32, lr=2e-3,
        warmup=200, seed=0, snapshots=20,
        extra={"min_repeat": 5, "max_repeat": 25},
    )


def _llama_induction_recipe() -> Recipe:
    tok = Tokenizer.byte_level()  # all 256 bytes repeat: a bridge probe may draw any of them
    spec = LlamaSpec(n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, n_ctx=128, d_vocab=tok.d_vocab)
    return Recipe(
        name="llama-induction",
        summary="2-layer Llama (RoPE, RMSNorm, SwiGLU, 4 query / 2 key-value heads) on random bytes "
                "with a segment repeating at a random period",
        config=spec, tokenizer=tok, seq_len=64, steps=3000, batch_size=32, lr=2e-3,
        warmup=100, seed=2, snapshots=10,  # seeds 0 and 1 smeared the previous-token job over more heads (card)
        extra={"min_repeat": 5, "max_repeat": 25},
    )


def _code_recipe() -> Recipe:
    tok = Tokenizer.byte_level()
    cfg = ModelConfig(n_layers=3, n_heads=4, d_model=128, n_ctx=256, d_vocab=tok.d_vocab)
    # Bracket tracking is a small share of next-byte loss on plain windows: trained that way the
    # model grew previous-token, induction and sink heads but no bracket head (cards/code.md).
    # So 3/4 of every batch sits around a hard closer and ) ] } targets weigh 10x.
    return Recipe(
        name="code",
        summary="byte-level GPT-2 (MLPs, LayerNorm) on the Python standard library's source, "
                "3/4 of each batch around nested brackets, closing brackets weighted 10x in the loss",
        config=cfg, tokenizer=tok, seq_len=255, steps=5000, batch_size=16, lr=3e-3,
        warmup=200, weight_decay=0.1, seed=0, snapshots=10,
        target_weights={ord(c): 10.0 for c in ")]}"},
        extra={"bracket_frac": 0.75},
    )


def _dyck_recipe() -> Recipe:
    tok = Tokenizer.char_level(data.DYCK_ALPHABET)
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=64, n_ctx=128, d_vocab=tok.d_vocab)
    return Recipe(
        name="dyck",
        summary="balanced strings over 4 bracket pairs with filler, nesting up to 8",
        config=cfg, tokenizer=tok, seq_len=64, steps=4000, batch_size=32, lr=2e-3,
        warmup=200, weight_decay=0.01, seed=0, snapshots=5,
        extra={"max_depth": 8},
    )


def _needle_recipe() -> Recipe:
    tok = Tokenizer.byte_level()
    # RoPE base 5,000,000 (Llama 3 uses 500,000 for d_head 128): with d_head 16, four of the eight
    # rotation pairs turn by under a radian across 2,048 tokens, so a layer-1 head can match content
    # at any distance. With 500,000 (two or three such pairs) the same schedule copied 16 % of needle
    # steps at 2,048 tokens after 2,500 needle steps; with 10,000 (one pair) none.
    spec = LlamaSpec(n_layers=3, n_heads=4, n_kv_heads=2, d_model=64, n_ctx=2048, d_vocab=tok.d_vocab,
                     rope_theta=5_000_000.0)
    # Three layers, not two: in the 2-layer run (seed 0, 4,000 steps) all of layer 1 became retrieval
    # heads and layer 0 shared the previous-token job, so no head outside the retrieval group could be
    # masked without breaking the circuit too: a random-head control was as bad as the group. A third
    # layer leaves heads with no part in it (the control Wu et al. use). Two phases (what was tried
    # before, and why, is in cards/needle-2k.md). Steps 1..long_start:
    # llama-induction's data alone (a random segment repeating at a random period, 64 tokens), which
    # grows a previous-token -> induction circuit by step 1,000-1,500. Needle rows from the start kept it
    # from forming at all (4,000 steps), and that circuit alone copies nothing out of a needle row
    # (it learned "look 5..25 back"). After long_start every step adds a needle batch: haystacks of
    # 256 .. 2,047 random bytes with needles copied far away, the loss on the copy steps only, so the
    # induction head must find the needle by content wherever it is.
    return Recipe(
        name="needle-2k",
        summary="3-layer Llama (RoPE base 5M, n_ctx 2048, 4 query / 2 key-value heads) on random bytes: "
                "periodic repeats, then needles copied out of haystacks of up to 2,047 tokens",
        config=spec, tokenizer=tok, seq_len=64, steps=4500, batch_size=32, lr=2e-3,
        warmup=200, grad_clip=0.0, seed=0, snapshots=8,
        extra={"min_repeat": 5, "max_repeat": 25, "long_start": 2000, "long_batch": 2,
               "long_needles": 6, "min_needle": 8, "max_needle": 16},
    )


RECIPES: dict[str, Callable[[], Recipe]] = {
    "induction-2l": _induction_recipe,
    "llama-induction": _llama_induction_recipe,
    "code": _code_recipe,
    "dyck": _dyck_recipe,
    "needle-2k": _needle_recipe,
}


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``, or a ``ConfigError`` listing the known ones."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; known recipes: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]()
