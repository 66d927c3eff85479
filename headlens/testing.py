"""Hand-weighted tiny models with planted heads, for tests and examples.

``planted_model()`` builds a 2-layer, 4-head, attention-only GPT (no LayerNorm) over a
char-level alphabet whose weights are set by hand so that

* **L0H0 is a previous-token head**: its query is the one-hot position p, its key the
  one-hot position j+1, so it attends from p to p-1; its OV circuit copies the token it
  reads into a "previous token" subspace of the residual stream;
* **L1H0 is an induction head**: its query is the current token, its key the "previous
  token" subspace, so it attends from q to every k with x_{k-1} = x_q (and so it is a
  retrieval head too: on a needle prompt its top-1 key is the needle token being copied);
* every other head has zero weights, hence uniform attention (exactly the baseline).

The residual stream is ``[token one-hot | position one-hot | previous-token one-hot | 0...]``.
Nothing is trained, so the planted heads are exact and the model builds in milliseconds.

>>> model = planted_model()
>>> PLANTED_HEADS["induction"]
[(1, 0)]
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from headlens.models.config import ModelConfig
from headlens.models.gpt import GPT
from headlens.models.tokenizer import Tokenizer

PLANTED_ALPHABET = "abcdefghijklmnop()[]"
PLANTED_HEADS: dict[str, list[tuple[int, int]]] = {"previous_token": [(0, 0)], "induction": [(1, 0)]}


def planted_model(sharpness: float = 30.0, n_ctx: int = 32, alphabet: str = PLANTED_ALPHABET) -> GPT:
    """A GPT whose L0H0 is a previous-token head and L1H0 an induction head (see module doc).

    Args:
        sharpness: attention logit of a target over a non-target (30 gives mass ~1 - 1e-12).
        n_ctx: context length; positions are one-hot, so ``d_head >= n_ctx``.
        alphabet: the char-level vocabulary (BOS is added after it).
    """
    tok = Tokenizer.char_level(alphabet)
    V = tok.d_vocab
    d_head = max(32, n_ctx, V)
    n_heads = 4
    cfg = ModelConfig(n_layers=2, n_heads=n_heads, d_model=n_heads * d_head, n_ctx=n_ctx, d_vocab=V,
                      attn_only=True, normalization="none")
    if 2 * V + n_ctx > cfg.d_model:
        raise ValueError("alphabet and context do not fit the residual stream")
    TOK, POS, PREV, D = 0, V, V + n_ctx, cfg.d_model
    model = GPT(cfg, tokenizer=tok, name="planted")
    c = sharpness * math.sqrt(d_head)  # logits are divided by sqrt(d_head)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.wte.weight[:, TOK:TOK + V] = torch.eye(V)
        model.transformer.wpe.weight[:, POS:POS + n_ctx] = torch.eye(n_ctx)
        # L0H0 (head 0 occupies rows 0..d_head-1 of each of q, k, v): previous-token head
        qkv0 = model.transformer.h[0].attn.c_attn.weight  # (3D, D): q = x W[:D]^T ...
        for i in range(n_ctx):
            qkv0[i, POS + i] = c  # q: position p -> e_p
            if i + 1 < n_ctx:
                qkv0[D + i + 1, POS + i] = 1.0  # k: position j -> e_{j+1}
        for i in range(V):
            qkv0[2 * D + i, TOK + i] = 1.0  # v: the token at the attended position
            model.transformer.h[0].attn.c_proj.weight[PREV + i, i] = 1.0  # o: into PREV
        # L1H0: induction head, query = current token, key = previous token
        qkv1 = model.transformer.h[1].attn.c_attn.weight
        for i in range(V):
            qkv1[i, TOK + i] = c
            qkv1[D + i, PREV + i] = 1.0
    return model.eval()



RESTING_HEADS: dict[str, list[tuple[int, int]]] = {"induction": [(1, 0)], "first_token": [(1, 0), (1, 1)]}


def resting_model(sharpness: float = 30.0, n_ctx: int = 32, rest: float = 1.0) -> GPT:
    """:func:`planted_model` whose layer-1 heads *rest* on the first token, as most heads of a trained LM do.

    * **L1H0 is an induction head that rests**: besides its key on the previous token, the first
      position's key matches every query at ``rest * sharpness``. Where an earlier copy exists it splits
      its attention between the copy and the first token (half each at ``rest=1``); where none does, it
      rests on the first token.
    * **L1H1 rests and does nothing else**: every query matches the first position's key.
    * L0H0 stays the previous-token head feeding L1H0; L0H1..3, L1H2, L1H3 are uniform.

    >>> m = resting_model()
    >>> RESTING_HEADS["first_token"]
    [(1, 0), (1, 1)]
    """
    model = planted_model(sharpness, n_ctx)
    V, D = model.cfg.d_vocab, model.cfg.d_model
    d_head = D // model.n_heads
    POS = V  # the position one-hots (planted_model's layout)
    c = sharpness * math.sqrt(d_head)
    with torch.no_grad():
        qkv1 = model.transformer.h[1].attn.c_attn.weight  # (3D, D): rows of q, k, v; head h: rows h*d_head..
        for head, dim in ((0, V), (1, d_head)):  # L1H0: a free query/key dimension after its V token ones
            qkv1[dim, :V] = (rest if head == 0 else 1.0) * c  # q: every token asks for the first position
            qkv1[D + dim, POS] = 1.0  # k: position 0 answers
    return model.eval()

# the planted circuit's edges (sender, receiver, input) that carry the task, and ones that carry exactly nothing
PLANTED_EDGES = [("L0H0", "L1H0", "k"), ("embed", "L1H0", "q"), ("embed", "L1H0", "v")]
PLANTED_ZERO_EDGES = [("L0H0", "L1H0", "q"), ("L0H0", "L1H0", "v"),
                      *((f"L0H{h}", "L1H0", c) for h in (1, 2, 3) for c in "qkv")]


def planted_circuit_model(sharpness: float = 30.0, n_ctx: int = 32, readout: float = 10.0) -> GPT:
    """:func:`planted_model` with an induction *circuit* that predicts: L1H0's value copies the token it
    attends to into an output subspace, and the unembedding reads it (``readout`` logits per unit).

    Its known edges (:data:`PLANTED_EDGES`): L0H0 -> L1H0.k (the previous token, what induction keys on),
    embed -> L1H0.q (the current token) and embed -> L1H0.v (the token copied). Known zeros
    (:data:`PLANTED_ZERO_EDGES`): L0H0 writes only the previous-token subspace, which L1H0's query and
    value do not read, and L0H1..3 have zero weights, so their deltas are exactly zero.

    >>> model = planted_circuit_model()
    >>> model.lm_head.weight.shape[0] == model.cfg.d_vocab
    True
    """
    model = planted_model(sharpness, n_ctx)
    V, D = model.cfg.d_vocab, model.cfg.d_model
    OUT = 2 * V + n_ctx
    if OUT + V > D:
        raise ValueError("no room for the output subspace in the residual stream")
    with torch.no_grad():
        attn = model.transformer.h[1].attn
        for i in range(V):
            attn.c_attn.weight[2 * D + i, i] = 1.0  # v: the attended token (TOK is dims 0..V-1)
            attn.c_proj.weight[OUT + i, i] = 1.0  # o: into OUT
        model.lm_head.weight = torch.nn.Parameter(torch.zeros(V, D))  # untied from the embedding
        model.lm_head.weight[:, OUT:OUT + V] = readout * torch.eye(V)
    return model.eval()


VOCAB_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"  # two ordered lists: the digits, the letters
VOCAB_HEADS: dict[str, list[tuple[int, int]]] = {"ov_copying": [(0, 0)], "ov_suppression": [(0, 1)],
                                                 "successor": [(0, 2)]}


def vocabulary_model(flip_final_norm: bool = False) -> GPT:
    """A 1-layer, 4-head GPT whose heads act in the vocabulary: their OV circuits are set by hand.

    Tokens are one-hot in the residual stream and the unembedding reads the same slots (``W_U = W_E^T``),
    so a head's OV is a ``V x V`` map of tokens:

    * **L0H0 copies** (identity), **L0H1 suppresses** (minus the identity);
    * **L0H2 is a successor head**: ``0 -> 1 ... 8 -> 9`` and ``a -> b ... y -> z``;
    * L0H3 writes nothing.

    ``flip_final_norm``: the model gets LayerNorms and the final one's scale is ``-1``, so the heads' raw
    ``W_E W_V W_O W_U`` is unchanged (L0H0's eigenvalues still say "copies") while what reaches the logits
    is flipped: L0H0 suppresses and L0H1 copies.

    >>> model = vocabulary_model()
    >>> model.to_str_tokens(model.lm_head.weight[:, :37].argmax(0)[:3])  # the unembedding reads the token slots
    ['0', '1', '2']
    """
    tok = Tokenizer.char_level(VOCAB_ALPHABET)
    V, d_head = tok.d_vocab, 40
    cfg = ModelConfig(n_layers=1, n_heads=4, d_model=4 * d_head, n_ctx=16, d_vocab=V, attn_only=True,
                      normalization="LN" if flip_final_norm else "none")
    model = GPT(cfg, tokenizer=tok, name="vocabulary")
    D, eye = cfg.d_model, torch.eye(V)
    nxt = torch.zeros(V, V)  # (src, dst): the successor of each list item
    for run in ("0123456789", "abcdefghijklmnopqrstuvwxyz"):
        for a, b in itertools.pairwise(run):
            nxt[VOCAB_ALPHABET.index(a), VOCAB_ALPHABET.index(b)] = 1.0
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.wte.weight[:, :V] = eye
        model.lm_head.weight[:, :V] = eye
        attn = model.transformer.h[0].attn
        for h, ov in enumerate((eye, -eye, nxt)):
            attn.c_attn.weight[2 * D + h * d_head:2 * D + h * d_head + V, :V] = eye  # v: the token
            attn.c_proj.weight[:V, h * d_head:h * d_head + V] = ov.T  # o: z W^T, the map src -> dst
        if flip_final_norm:
            model.transformer.h[0].ln_1.weight.fill_(1.0)
            model.transformer.ln_f.weight.fill_(-1.0)
    return model.eval()

PatternFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (tokens (B,T), valid (B,T)) -> (B,Q,K)


class PatternModel:
    """A stand-in backend whose attention patterns are given functions of the tokens.

    It has the shared model surface a scan uses (``n_layers``, ``n_heads``, ``cfg``,
    ``is_causal``, ``tokenizer``, ``special_token_ids``, ``to_tokens``, ``hooks``,
    ``forward``) and emits ``patterns[layer][head](tokens, valid)`` at
    ``blocks.{layer}.attn.hook_pattern``: hand-built patterns with exactly known scores.

    >>> m = PatternModel([[offset_pattern(-1), uniform_pattern]], causal=True)
    >>> m.n_layers, m.n_heads
    (1, 2)
    """

    def __init__(self, patterns: list[list[PatternFn]], causal: bool = True, n_ctx: int = 64,
                 tokenizer: Any = None, name: str = "patterns") -> None:
        self.patterns, self.is_causal, self.name = patterns, causal, name
        self.tokenizer = tokenizer or Tokenizer.char_level(PLANTED_ALPHABET)
        self._hf = hasattr(self.tokenizer, "all_special_ids")  # a Hugging Face tokenizer (WordPiece, BPE)
        d_vocab = len(self.tokenizer) if self._hf else self.tokenizer.d_vocab
        self.cfg = ModelConfig(n_layers=len(patterns), n_heads=len(patterns[0]), d_model=len(patterns[0]) * 4,
                               n_ctx=n_ctx, d_vocab=d_vocab)
        self.n_layers, self.n_heads = self.cfg.n_layers, self.cfg.n_heads
        self.device = torch.device("cpu")
        self._hooks: list[tuple[str, Callable[..., Any]]] = []

    @property
    def bos_token_id(self) -> int:
        if self._hf:
            tok = self.tokenizer
            return int(tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id)
        return self.tokenizer.bos_token_id

    @property
    def special_token_ids(self) -> set[int]:
        if self._hf:
            return {int(i) for i in self.tokenizer.all_special_ids}
        return {self.tokenizer.bos_token_id}

    def to_tokens(self, text: str | list[str], prepend_bos: bool = True) -> torch.Tensor:
        texts = [text] if isinstance(text, str) else text
        if self._hf:
            return torch.tensor([self.tokenizer(t, add_special_tokens=prepend_bos)["input_ids"] for t in texts])
        return torch.tensor([[self.bos_token_id] * prepend_bos + self.tokenizer.encode(t) for t in texts])

    def to_str_tokens(self, tokens: torch.Tensor) -> list[str]:
        if self._hf:
            return [str(s) for s in self.tokenizer.convert_ids_to_tokens(tokens.reshape(-1).tolist())]
        return [self.tokenizer.str_token(int(i)) for i in tokens.reshape(-1)]

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: list[tuple[str, Callable[..., Any]]]) -> Iterator[PatternModel]:
        self._hooks = list(fwd_hooks)
        try:
            yield self
        finally:
            self._hooks = []

    def active_hooks(self) -> list[str]:
        return [name for name, _ in self._hooks]

    def parameters(self) -> Iterator[torch.Tensor]:
        yield torch.zeros(0)  # no weights: the patterns are functions; float32 like a real model

    def run_with_hooks(self, tokens: torch.Tensor, fwd_hooks: list[tuple[str, Callable[..., Any]]] = (),
                       attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        with self.hooks(list(fwd_hooks)):
            return self.forward(tokens, attention_mask=attention_mask)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        valid = torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        for layer, heads in enumerate(self.patterns):
            pattern = torch.stack([fn(tokens, valid) for fn in heads], dim=1)  # (B, H, Q, K)
            pattern = _renormalize(pattern, valid, self.is_causal)  # (B, H, Q, K)
            for name, fn in self._hooks:
                if name == f"blocks.{layer}.attn.hook_pattern":
                    fn(pattern, SimpleNamespace(name=name))
        return torch.zeros(*tokens.shape, self.cfg.d_vocab)


def _renormalize(pattern: torch.Tensor, valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """Zero what a head cannot see (pads; the future in causal models); rows sum to 1."""
    T = pattern.shape[-1]
    seen = valid[:, None, None, :].expand_as(pattern).clone()  # (B, H, Q, K)
    if causal:
        seen &= torch.ones(T, T, dtype=torch.bool).tril()
    p = pattern * seen
    s = p.sum(-1, keepdim=True)
    fallback = seen / seen.sum(-1, keepdim=True).clamp_min(1)  # uniform where the fn gave nothing
    return torch.where(s > 0, p / s.clamp_min(1e-30), fallback)


def uniform_pattern(tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Uniform over every visible key (the model renormalizes)."""
    B, T = tokens.shape
    return torch.ones(B, T, T)


def offset_pattern(k: int) -> PatternFn:
    """All mass on key q+k where it exists (k=-1 previous, 0 current, +1 next), else uniform."""

    def fn(tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        return torch.diag(torch.ones(T - abs(k)), diagonal=k).expand(B, T, T)  # (B, Q, K): [q, q+k] = 1

    return fn


# -- coreference: a WordPiece tokenizer over the probe's words, and planted heads ---------------
def wordpiece_tokenizer(words: list[str] | None = None) -> Any:
    """A BERT-style fast WordPiece tokenizer (``[CLS] ... [SEP]``, lowercased) built in-process.

    Its vocabulary holds ``words`` (default: every word of the coreference templates) whole, plus
    letters and ``##``-letters, so any lowercase ASCII text tokenizes. Nothing downloads.
    """
    import re

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from headlens.probes import coreference as C

    if words is None:
        text = " ".join([*C.LEADS, *C.MALE, *C.FEMALE, *C.GENDER_FRAMES, *C.GENDER_PREDICATES, *C.SINGULAR,
                         *C.PLURAL, *C.NUMBER_FRAMES, *(p for pair in C.NUMBER_PREDICATES for p in pair),
                         *C.PRONOUNS.values(), "then left"])
        words = re.findall(r"[a-z]+", text.lower())
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,;:!?()[]{}<>'\"-0123456789", *letters,
             *(f"##{c}" for c in letters)]
    vocab += [w for w in dict.fromkeys(words) if w not in vocab]
    tok = HFTokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", mask_token="[MASK]")


def _word_ids(tokenizer: Any, words: Any) -> torch.Tensor:
    return torch.tensor([tokenizer.convert_tokens_to_ids(w.lower()) for w in words])


def coreference_pattern(tokenizer: Any) -> PatternFn:
    """A planted coreference head: from ``he``/``she``/``it``/``they`` all mass on the candidate of
    the pronoun's gender or number; every other row uniform."""
    from headlens.probes import coreference as C

    classes = {"male": C.MALE, "female": C.FEMALE, "singular": C.SINGULAR, "plural": C.PLURAL}
    pairs = [(int(_word_ids(tokenizer, [C.PRONOUNS[c]])[0]), _word_ids(tokenizer, words))
             for c, words in classes.items()]

    def fn(tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*tokens.shape, tokens.shape[1])  # (B, Q, K)
        for pronoun, candidates in pairs:
            rows = tokens == pronoun  # (B, Q)
            keys = torch.isin(tokens, candidates)  # (B, K)
            out += rows[:, :, None] & keys[:, None, :]
        return out

    return fn


def first_candidate_pattern(tokenizer: Any) -> PatternFn:
    """A position-only control: from every pronoun all mass on the *first* name or noun of the text,
    whatever the pronoun says."""
    from headlens.probes import coreference as C

    pronouns = _word_ids(tokenizer, C.PRONOUNS.values())
    candidates = _word_ids(tokenizer, [*C.MALE, *C.FEMALE, *C.SINGULAR, *C.PLURAL])

    def fn(tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        is_cand = torch.isin(tokens, candidates)  # (B, K)
        first = is_cand & (is_cand.long().cumsum(1) == 1)  # (B, K): the first candidate only
        rows = torch.isin(tokens, pronouns)  # (B, Q)
        return (rows[:, :, None] & first[:, None, :]).float()  # (B, Q, K)

    return fn
