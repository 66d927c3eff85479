"""The rules a head's description may name: each a predicate that marks, per query, the keys it predicts.

Why it looks like this:

* **Causal pattern detectors** with a predicate (previous token, induction, duplicate token) are taken from
  the registry as they are; the fixed offsets 2 and 3 are one lambda each.
* **What real heads do that those miss** (:func:`candidate_rules`): the first token (the sink) and the
  query's own token; even attention over every token so far, with the first token or without it (a head
  that spreads its attention but avoids the sink would otherwise be put back writing the sink's value, which
  it never reads); recent windows (a band of the last 4 or 16 tokens, and two decays whose weight halves
  every 1 or 8 tokens back: the only rules whose targets are *weighted*, :data:`WEIGHTED`); delimiters
  (the last newline, sentence end and comma before the query, the opening bracket of the innermost pair
  still open); the start of the current word at a subword continuation; earlier tokens of the query's own
  class (digits, capitalised words, identifiers); the latest earlier copy and the token after it; and
  an absolute position (the first token after the start). Token classes are read from the model's own
  token strings (:func:`token_classes`: a leading space, byte-level BPE's ``Ġ`` or sentencepiece's ``▁``
  starts a word; BERT's ``##`` continues one) and reach the predicates as ``cls:<class>`` annotations.
* **``induction_longest``**: induction's targets narrowed to the copies whose preceding text matches the
  text before the query longest (all of them when tied). Induction heads match prefixes (Olsson et al.
  2022) and weigh a longer match more, while ``induction`` spreads a row's mass evenly over every earlier
  copy, however short its match; on SmolLM2 the narrower rule agrees better with its induction heads
  (benchmarks/README.md). Its role is ``induction`` (:data:`ROLE`).
* **``predicted_token``** (McDougall et al. 2023's copy suppression): a key holding one of the model's own
  top :data:`N_PREDICTED` next tokens at the query. Its targets need the forward's logits, so it is one of
  the :data:`LATE` rules (:mod:`headlens.atlas.heldout` keeps each layer's pattern until they are known).
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.detectors.base import Detector, predicate_mask
from headlens.probes.base import ProbeBatch

RULES = ("previous_token", "induction", "duplicate_token")  # registered causal rules a description may name
OFFSETS = (2, 3)  # fixed offsets tried as rules (offset 1 is previous_token)
N_PREDICTED = 5  # "a token the model predicts": among the model's own top N_PREDICTED next tokens at the query
SMALL_VOCAB = 5000  # below this, top 1 only: a top 5 of a few dozen tokens covers much of any window
ROLE = {"induction_longest": "induction", "induction_last": "induction", "duplicate_last": "duplicate_token",
        "first_token": "resting", "uniform_rest": "uniform"}  # a rule's role, where it is not the rule's own name
LATE = ("predicted_token",)  # rules whose targets need the forward's own logits (the others read the tokens)
SINK = "first_token"  # the rule every other one falls back to in a row where it has no target
BANDS = (4, 16)  # recent windows: the last n tokens, the query's own included
HALF_LIVES = (1, 8)  # recent decays: a key's weight halves every h tokens back
CLASSES = ("newline", "sentence_end", "comma", "open", "close", "word_start", "digit", "capital", "identifier")
SAME_CLASS = ("digit", "capital", "identifier")  # "earlier tokens of the query's own class"
DELIMITERS = {"last_newline": ("newline", "the last newline"), "sentence_end": ("sentence_end", "the end of the "
              "last sentence"), "last_comma": ("comma", "the last comma")}
SINK_BANDS = (2, 4, 8, 16, 32, 64)  # query positions where the first token's share may change: 0-1, 2-3, 4-7, .., 64+
WEIGHTED = tuple(f"decay_{h}" for h in HALF_LIVES)  # rules whose predicate gives weights, not a 0/1 mask


def candidate_rules() -> dict[str, Detector]:
    """name -> detector: the rules a description may name (module docstring)."""
    from headlens.detectors import get_detector

    def rule(name: str, text: str, pred: Any) -> None:
        rules[name] = Detector(name, "mask", None, None, text, predicate=pred)

    rules: dict[str, Detector] = {}
    rule(SINK, "attends to the first token (the sink)", lambda b, q, k: k == 0)
    rule("self", "attends to the current token itself", lambda b, q, k: k == q)
    rules.update({name: get_detector(name) for name in RULES})
    rule("induction_longest", "attends to the token after the earlier copy of the current token whose preceding "
         "text matches longest", longest_match)
    rule("induction_last", "attends to the token after the latest earlier copy of the current token", _latest(
        lambda b, q, k: _registered("induction")(b, q, k)))
    rule("duplicate_last", "attends to the latest earlier copy of the current token", _latest(
        lambda b, q, k: _registered("duplicate_token")(b, q, k) & (k < q)))
    for d in OFFSETS:
        rule(f"offset_{d}", f"attends {d} tokens back", lambda b, q, k, d=d: k == q - d)
    for n in BANDS:
        rule(f"recent_{n}", f"attends evenly to the last {n} tokens", lambda b, q, k, n=n: (k > q - n) & (k >= 1))
    rule("uniform", "attends evenly to every token so far", lambda b, q, k: k <= q)
    rule("uniform_rest", "attends evenly to every token so far but the first",
         lambda b, q, k: (k <= q) & (k >= 1))
    for h in HALF_LIVES:
        rule(f"decay_{h}", f"attends to recent tokens, a key's weight halving every {h} token{'s' * (h > 1)} back",
             lambda b, q, k, h=h: torch.where((k >= 1) & (k <= q), 0.5 ** ((q - k).clamp(min=0) / h), 0.0))
    for name, (cls, text) in DELIMITERS.items():
        rule(name, f"attends to {text} before it", lambda b, q, k, c=cls: k == _last_before(b, c)[:, q])
    rule("open_bracket", "attends to the opening bracket of the innermost pair still open",
         lambda b, q, k: k == b.annotations["open_at"][:, q])
    rule("word_start", "attends to the start of the current word (at a subword continuation)",
         lambda b, q, k: (k == _last_before(b, "word_start")[:, q]) & ~b.annotations["cls:word_start"][:, q].bool())
    for cls in SAME_CLASS:
        rule(f"same_{cls}", f"attends to earlier {_CLASS_TEXT[cls]} when the current token is one", lambda b, q, k, c=cls:
             b.annotations[f"cls:{c}"][:, q].bool() & b.annotations[f"cls:{c}"][:, k].bool() & (k < q))
    rule("position_1", "attends to the first token after the start", lambda b, q, k: k == 1)
    rule("predicted_token", f"attends to an earlier copy of a token the model predicts next (its top {N_PREDICTED})",
         predicted)
    return rules


_CLASS_TEXT = {"digit": "digits", "capital": "capitalised words", "identifier": "identifier-like tokens"}


def _registered(name: str) -> Any:
    from headlens.detectors import get_detector

    return get_detector(name).predicate


def _latest(pred: Any) -> Any:
    """A predicate narrowed to the latest (largest k) of each row's targets."""
    def latest(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        hit = pred(batch, q, k)  # (B, C, K)
        idx = torch.where(hit, k, -1).amax(-1, keepdim=True)  # (B, C, 1)
        return hit & (k == idx)
    return latest


def _last_before(batch: ProbeBatch, cls: str) -> torch.Tensor:
    """``(B, T)``: per position q, the latest k < q whose token is of class ``cls`` (-1 where none)."""
    on = batch.annotations[f"cls:{cls}"].bool() & ~batch.special  # (B, T)
    T = on.shape[1]
    idx = torch.where(on, torch.arange(T), -1).cummax(1).values  # (B, T): latest at or before
    return torch.cat([torch.full_like(idx[:, :1], -1), idx[:, :-1]], 1)


def token_classes(strings: list[str], raw: list[str] | None = None) -> dict[str, torch.Tensor]:
    """class -> ``(V,)`` bool over the vocabulary, from each token's text (``strings``: a leading space marks a
    word start) and its raw vocabulary string (``raw``: ``Ġ``/``▁`` start a word; in a vocabulary with ``##``
    pieces, every token but those starts one).

    >>> c = token_classes([" The", "cat", ".", "\\n", " 42", "(", "x_1"], ["ĠThe", "cat", ".", "Ċ", "Ġ42", "(", "x_1"])
    >>> [s for s, on in zip(" The cat . nl 42 ( x_1".split(), c["word_start"]) if on]
    ['The', '.', 'nl', '42', '(']
    >>> c["capital"].tolist()[:2], c["digit"].tolist()[4], c["identifier"].tolist()[6], c["open"].tolist()[5]
    ([True, False], True, True, True)
    """
    raw = raw or strings
    wordpiece = any(r.startswith("##") for r in raw)
    out: dict[str, list[bool]] = {c: [] for c in CLASSES}
    for s, r in zip(strings, raw, strict=True):
        t = s.strip()
        flags = {"newline": "\n" in s or r in ("Ċ", "<0x0A>"), "sentence_end": t[-1:] in (".", "!", "?") and len(t) <= 2,
                 "comma": t in (",", ";"), "open": t[-1:] in "([{" and t != "", "close": t[:1] in ")]}" and t != "",
                 "word_start": (not r.startswith("##")) if wordpiece else (s[:1].isspace() or r[:1] in "Ġ▁Ċ"
                                                                           or not t[:1].isalnum()),
                 "digit": t.isdigit(), "capital": t[:1].isupper() and t.isalpha(),
                 "identifier": t.replace("_", "a").isalnum() and not t.isdigit() and not t[:1].isdigit()}
        for c in CLASSES:
            out[c].append(bool(flags[c]))
    return {c: torch.tensor(v, dtype=torch.bool) for c, v in out.items()}


def annotate(batch: ProbeBatch, classes: dict[str, torch.Tensor]) -> None:
    """Put each position's token classes (``cls:<class>``, ``(B, T)``) and the innermost open bracket before it
    (``open_at``, -1 where none) on ``batch``."""
    x = batch.tokens.clamp(min=0)
    for c, table in classes.items():
        batch.annotations[f"cls:{c}"] = (table[x.clamp(max=len(table) - 1)] & (x < len(table))).long()
    opens = batch.annotations.get("cls:open", torch.zeros_like(x)).tolist()
    closes = batch.annotations.get("cls:close", torch.zeros_like(x)).tolist()
    at = []
    for o_row, c_row in zip(opens, closes, strict=True):
        stack: list[int] = []
        row = []
        for i, (o, c) in enumerate(zip(o_row, c_row, strict=True)):
            row.append(stack[-1] if stack else -1)  # what is open before position i
            if c and stack:
                stack.pop()
            if o:
                stack.append(i)
        at.append(row)
    batch.annotations["open_at"] = torch.tensor(at, dtype=torch.long).reshape(x.shape)


def rule_targets(rule: Detector, batch: ProbeBatch, T: int) -> torch.Tensor:
    """``(B, Q, K)`` float64: the rule's weight on each key (0/1 for all but :data:`WEIGHTED`), limited like
    :func:`~headlens.detectors.base.predicate_mask` (real keys, countable rows, ``k <= q``)."""
    hit = predicate_mask(rule.predicate, batch, 0, T, 0, T)  # (B, Q, K) bool
    if rule.name not in WEIGHTED:
        return hit.double()
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return torch.as_tensor(rule.predicate(batch, q, k), dtype=torch.float64) * hit


def longest_match(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(B, C, K)``: induction's targets at q (``x_{k-1} == x_q``) whose match, counted back from ``k - 1`` and
    ``q`` while the tokens agree, is the longest of the row's (all tied ones).

    >>> from headlens.probes.base import ProbeBatch
    >>> t = torch.tensor([[9, 2, 3, 1, 5, 4, 1, 7, 2, 3, 1]]); v = torch.ones(1, 11, dtype=torch.bool)
    >>> b = ProbeBatch(t, torch.tensor([11]), v, t == 9, causal=True)
    >>> q, k = torch.arange(11)[:, None], torch.arange(11)[None, :]
    >>> longest_match(b, q, k)[0, 10].nonzero().tolist()  # "2 3 1" recurs before key 4; induction also takes 7
    [[4]]
    """
    from headlens.detectors.induction import predicate

    x, ok = batch.tokens, ~batch.special
    T = x.shape[1]
    eq = (x[:, :, None] == x[:, None, :]) & ok[:, :, None] & ok[:, None, :]  # (B, T, T): x_i == x_j, ordinary
    run = eq.long()  # (B, T, T): run[i, j] = how many tokens agree counting back from i and from j
    for i in range(1, T):
        run[:, i, 1:] *= 1 + run[:, i - 1, :-1]
    length = run[:, q[:, 0]][:, :, (k[0] - 1).clamp(min=0)]  # (B, C, K): the match behind key k's earlier copy
    hit = predicate(batch, q, k)  # (B, C, K): induction's targets
    score = torch.where(hit, length, 0)
    return hit & (score == score.amax(-1, keepdim=True))


def predicted(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(B, C, K)``: key k holds one of the model's top next-token predictions at q (annotations ``pred{i}``,
    the model's own logits on the window): the pattern of copy suppression (McDougall et al. 2023)."""
    x = batch.tokens[:, k]  # (B, 1, K)
    hit = torch.zeros(x.shape[0], q.shape[0], k.shape[1], dtype=torch.bool)
    for i in range(N_PREDICTED):
        hit |= x == batch.annotations[f"pred{i}"][:, q]  # (B, C, K)
    return hit & (k <= q - 1) & (k >= 1)


def late_rules(rules: dict[str, Detector]) -> Any:
    """The targets of the rules that read the model's own next-token predictions, from its logits ``(B, T, V)``."""
    late = {name: rule for name, rule in rules.items() if name in LATE}

    def targets(logits: torch.Tensor, batch: ProbeBatch, cells: torch.Tensor) -> dict[str, torch.Tensor]:
        top = logits.topk(N_PREDICTED if logits.shape[-1] >= SMALL_VOCAB else 1, -1).indices.cpu()  # (B, T, n)
        pred = torch.cat([top, top[..., :1].expand(*top.shape[:2], N_PREDICTED - top.shape[-1])], -1)  # (B, T, N)
        batch.annotations.update({f"pred{i}": pred[..., i] for i in range(N_PREDICTED)})
        T = cells.shape[-1]
        return {name: predicate_mask(rule.predicate, batch, 0, T, 0, T) & cells for name, rule in late.items()}
    return targets


def causal_cells(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, K)`` bool: the cells of whole causal rows (a real key at or before a countable query)."""
    T = batch.tokens.shape[1]
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (k <= q) & batch.valid[:, None, :] & batch.query_ok[:, :, None]


def used_targets(rules: dict[str, Detector], used: list[str], batch: ProbeBatch, cells: torch.Tensor,
                 logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """``name -> (B, Q, K)`` float64: the targets at ``cells`` of the rules ``used`` (names in ``rules``), those
    that read the model's next-token predictions (:data:`LATE`) from its ``logits`` ``(B, T, V)``."""
    hits = {r: rule_targets(rules[r], batch, cells.shape[-1]) * cells for r in used if r not in LATE}
    late = {r: rules[r] for r in used if r in LATE}
    if late:
        hits.update({name: t.double() for name, t in late_rules(late)(logits, batch, cells).items()})
    return hits
