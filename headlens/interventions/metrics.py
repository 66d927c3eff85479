"""Task metrics for ablations, each returning one value per prompt (so effects get bootstrap CIs).

A metric reads the logits at chosen positions of a *task* (probe tokens plus the positions
that count). Logits at position ``t`` predict token ``t + 1``.

| metric | probe | per-prompt value |
|---|---|---|
| ``repeated_loss`` | ``BOS + r + r`` | mean next-token loss on the repeated half (its first token excluded: nothing predicts it) |
| ``first_half_loss`` | same | mean next-token loss on the first copy of ``r`` |
| ``bracket_accuracy`` | balanced bracket strings with filler | fraction of closing brackets whose type is the argmax among the closers' logits |
| ``lm_loss`` | the user's prompts (stdlib source for byte-level models if none) | mean next-token loss |
| ``kl`` | the user's prompts (else the repeated probe) | mean KL(clean ‖ ablated) of the next-token distribution |
| ``needle_recall`` | needle-in-a-haystack prompts (``headlens.probes.haystack``) | fraction of the needle's copy steps whose argmax is the next needle token |
| ``logit_diff`` | IOI prompts (``headlens.probes.ioi``) | logit of IO minus logit of S at the final position (Wang et al. 2022) |

``r`` is drawn without replacement from the model's ordinary tokens (no accidental repeats).
A task narrowed to some columns (:meth:`Task.at`) takes the logits at those positions only, ``(B, C, V)``:
the runners unembed only what the metrics read, and every value is reduced in chunks of positions
(:mod:`headlens.interventions.logits`), never a whole batch's ``(B, T, V)`` float copy.
Wherever prompts are taken, ``"ioi"`` (or an :class:`~headlens.probes.ioi.IOIProbe`) names the IOI prompts.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from headlens.errors import ProbeError, did_you_mean
from headlens.interventions.ablation import AblationError
from headlens.interventions.coreference import coreference_margins as coreference_margins  # it lived here
from headlens.interventions.logits import kl_divergence, target_log_probs
from headlens.interventions.task import Task as Task  # it lived here
from headlens.zoo import names

BRACKET_PAIRS = ("()", "[]", "{}", "<>")


@dataclass(frozen=True)
class Metric:
    """One registered metric: its probe, its per-position value, and which way is worse."""

    name: str
    probe: str  # "repeated" | "brackets" | "prompts"
    value: Callable[[torch.Tensor, Task, torch.Tensor | None], torch.Tensor]  # -> (B, T) per position
    higher_is_worse: bool
    description: str
    needs_clean: bool = False
    differentiable: bool = True  # False: attribution patching estimates a smooth surrogate

    def __call__(self, logits: torch.Tensor, task: Task, clean_logits: torch.Tensor | None = None) -> torch.Tensor:
        """Per-prompt values ``(B,)`` in float64: the mean of the per-position value over ``task.positions``.

        ``logits`` (and ``clean_logits``) are ``(B, T, V)``, or ``(B, C, V)`` at ``task.cols``.
        """
        return per_prompt_mean(self.value(logits, task, clean_logits), task.read())


def per_prompt_mean(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` ``(B, T)`` over the True ``positions`` of each row -> ``(B,)`` float64."""
    mask = positions.to(values.dtype)
    return ((values * mask).sum(1) / mask.sum(1).clamp(min=1)).double()


def _next_token_loss(logits: torch.Tensor, task: Task, clean: torch.Tensor | None = None) -> torch.Tensor:
    targets, predicts = task.targets()  # (B, C), (C,)
    nll = -target_log_probs(logits, targets)  # (B, C)
    return nll.masked_fill(~predicts, 0.0)  # the last position predicts nothing: 0


def _closer_target(task: Task) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, C, 1)`` which closer comes next (an index into ``task.candidates``) and ``(C,)`` whether any can."""
    targets, predicts = task.targets()  # (B, C), (C,)
    return (targets[..., None] == task.candidates).float().argmax(-1, keepdim=True), predicts


def _closer_correct(logits: torch.Tensor, task: Task, clean: torch.Tensor | None = None) -> torch.Tensor:
    target, predicts = _closer_target(task)  # (B, C, 1), (C,)
    sub = logits[..., task.candidates]  # (B, C, n_closers)
    return (sub.argmax(-1, keepdim=True) == target).squeeze(-1).float() * predicts  # (B, C)


def _closer_soft(logits: torch.Tensor, task: Task, clean: torch.Tensor | None = None) -> torch.Tensor:
    """Smooth surrogate of closer accuracy: probability of the right closer among the closers."""
    target, predicts = _closer_target(task)  # (B, C, 1), (C,)
    p = F.softmax(logits[..., task.candidates].float(), dim=-1)  # (B, C, n_closers)
    return p.gather(-1, target).squeeze(-1) * predicts  # (B, C)


def _kl_from_clean(logits: torch.Tensor, task: Task, clean: torch.Tensor | None) -> torch.Tensor:
    if clean is None:
        raise AblationError("the kl metric needs the clean (unablated) logits")
    return kl_divergence(logits, clean)  # (B, C): KL(clean || ablated)


def _next_correct(logits: torch.Tensor, task: Task, clean: torch.Tensor | None = None) -> torch.Tensor:
    targets, predicts = task.targets()  # (B, C), (C,)
    return (logits.argmax(-1) == targets).float() * predicts  # (B, C): greedy prediction is the next token


def _logit_diff(logits: torch.Tensor, task: Task, clean: torch.Tensor | None = None) -> torch.Tensor:
    """Correct minus wrong answer logit at every column (the task's positions pick END)."""
    if task.answers is None:
        raise ProbeError("logit_diff needs prompts with a correct and a wrong answer: the IOI probe (prompts='ioi')")
    B, C = logits.shape[:2]
    pair = logits.gather(-1, task.answers[:, None, :].expand(B, C, 2))  # (B, C, 2): correct, wrong
    return (pair[..., 0] - pair[..., 1]).float()  # (B, C)


def _next_token_prob(logits: torch.Tensor, task: Task, clean: torch.Tensor | None = None) -> torch.Tensor:
    """Smooth surrogate of needle recall: the probability of the right next token."""
    return (-_next_token_loss(logits, task)).exp()  # (B, C)


METRICS: dict[str, Metric] = {
    "repeated_loss": Metric(
        "repeated_loss", "repeated", _next_token_loss, True, "next-token loss on the repeated half of BOS+r+r"
    ),
    "first_half_loss": Metric(
        "first_half_loss", "repeated", _next_token_loss, True, "next-token loss on the first half of BOS+r+r"
    ),
    "bracket_accuracy": Metric(
        "bracket_accuracy", "brackets", _closer_correct, False,
        "accuracy at predicting the type of each closing bracket", differentiable=False,
    ),
    "lm_loss": Metric("lm_loss", "prompts", _next_token_loss, True, "next-token loss on the prompts"),
    "kl": Metric("kl", "prompts", _kl_from_clean, True, "KL(clean || ablated) of next-token predictions", True),
    "needle_recall": Metric(
        "needle_recall", "needle", _next_correct, False,
        "greedy recall of a needle's tokens copied out of a long haystack (teacher-forced)", differentiable=False,
    ),
    "logit_diff": Metric("logit_diff", "ioi", _logit_diff, False, "IOI: logit of IO minus logit of S at END"),
}
if tuple(METRICS) != names.METRICS:  # the CLI checks --metric against the torch-free list before torch loads
    raise RuntimeError(f"headlens.zoo.names.METRICS {names.METRICS} lists other metrics than "
                       f"METRICS {tuple(METRICS)}")
SURROGATES = {"bracket_accuracy": _closer_soft, "needle_recall": _next_token_prob}


def get_metric(name: str) -> Metric:
    """The registered metric called ``name``, or an ``AblationError`` listing the known ones."""
    if name not in METRICS:
        raise AblationError(f"unknown metric {name!r}; expected one of {', '.join(METRICS)}{did_you_mean(name, METRICS)}")
    return METRICS[name]


# -- probes ------------------------------------------------------------------------------------
def ordinary_tokens(model: Any) -> list[int]:
    """Token ids fit for random probes: not special, and printable ASCII for byte-level models."""
    tok = getattr(model, "tokenizer", None)
    special = set(model.special_token_ids)
    if getattr(tok, "kind", None) == "byte":
        ids = range(33, 127)
    elif getattr(tok, "kind", None) == "char":
        ids = range(tok.n_symbols)
    else:
        ids = range(model.cfg.d_vocab)
    return [i for i in ids if i not in special]


def repeated_task(model: Any, n_prompts: int = 32, seg_len: int | None = None, seed: int = 0) -> Task:
    """``BOS + r + r`` prompts; positions of the repeated half (``repeated_loss``) set.

    ``seg_len`` defaults to the largest of at most 32 that fits the context and the vocabulary.
    """
    vocab = torch.tensor(ordinary_tokens(model))
    limit = min((model.cfg.n_ctx - 1) // 2, len(vocab))
    seg_len = min(32, limit) if seg_len is None else seg_len
    if not 2 <= seg_len <= limit:
        raise ProbeError(f"seg_len={seg_len} must be in 2..{limit} for this model (context and vocabulary)")
    gen = torch.Generator().manual_seed(seed)
    rows = [vocab[torch.randperm(len(vocab), generator=gen)[:seg_len]] for _ in range(n_prompts)]
    bos = torch.full((n_prompts, 1), model.bos_token_id, dtype=torch.long)
    r = torch.stack(rows)  # (N, L)
    tokens = torch.cat([bos, r, r], dim=1).to(model.device)  # (N, 2L + 1)
    t = torch.arange(tokens.shape[1], device=tokens.device)
    repeated = ((t >= seg_len + 1) & (t < 2 * seg_len)).expand_as(tokens)  # predicts r[1:] of the copy
    return Task(tokens, repeated.clone(), probe="repeated")


def first_half_positions(task: Task) -> torch.Tensor:
    """Positions predicting the first copy of ``r`` in a repeated task: ``t`` in ``0 .. L-1``."""
    seg_len = (task.tokens.shape[1] - 1) // 2
    t = torch.arange(task.tokens.shape[1], device=task.tokens.device)
    return (t < seg_len).expand_as(task.tokens).clone()


def _symbol_id(model: Any, ch: str) -> int | None:
    try:
        ids = model.to_tokens(ch, prepend_bos=False)[0].tolist()
    except Exception:  # not representable in this vocabulary
        return None
    return ids[0] if len(ids) == 1 else None


def bracket_ids(model: Any) -> tuple[list[tuple[int, int]], list[int]]:
    """``(opener, closer)`` id pairs this model's tokenizer has as single tokens, and filler ids."""
    pairs = []
    for pair in BRACKET_PAIRS:
        o, c = _symbol_id(model, pair[0]), _symbol_id(model, pair[1])
        if o is not None and c is not None:
            pairs.append((o, c))
    tok = getattr(model, "tokenizer", None)
    if getattr(tok, "kind", None) == "char":
        used = {i for p in pairs for i in p}
        filler = [i for i in range(tok.n_symbols) if i not in used]
    else:
        filler = [i for i in (_symbol_id(model, ch) for ch in string.ascii_lowercase[:8]) if i is not None]
    return pairs, filler


def bracket_task(model: Any, n_prompts: int = 32, length: int | None = None, seed: int = 0,
                 max_depth: int = 8, p_filler: float = 0.2) -> Task:
    """Balanced bracket strings (after BOS); positions whose next token is a closer are scored."""
    pairs, filler = bracket_ids(model)
    if len(pairs) < 2:
        raise ProbeError("bracket_accuracy needs at least two bracket pairs in the model's vocabulary")
    length = min(64, model.cfg.n_ctx - 1) if length is None else length
    gen = np.random.default_rng(seed)
    rows = [[model.bos_token_id, *_dyck(gen, length, pairs, filler, max_depth, p_filler)] for _ in range(n_prompts)]
    tokens = torch.tensor(rows, dtype=torch.long, device=model.device)  # (N, length + 1)
    closers = torch.tensor([c for _, c in pairs], device=model.device)
    nxt = torch.isin(tokens[:, 1:], closers)  # (N, length): next token is a closer
    positions = F.pad(nxt, (0, 1))  # (N, length + 1)
    return Task(tokens, positions, candidates=closers, probe="brackets")


def _dyck(gen: np.random.Generator, n: int, pairs: Sequence[tuple[int, int]], filler: Sequence[int],
          max_depth: int, p_filler: float) -> list[int]:
    out: list[int] = []
    stack: list[int] = []
    while len(out) < n:
        left = n - len(out)
        can_open = len(stack) < max_depth and left - 1 >= len(stack) + 1
        can_fill = bool(filler) and left - 1 >= len(stack)
        if stack and (left == len(stack) or (not can_open and not can_fill) or gen.random() < 0.4):
            out.append(stack.pop())
        elif can_fill and (gen.random() < p_filler or not can_open):
            out.append(int(gen.choice(filler)))
        elif can_open:
            o, c = pairs[gen.integers(len(pairs))]
            out.append(o)
            stack.append(c)
        else:  # odd slack and no filler: close is impossible only when the stack is empty
            out.append(pairs[0][0] if not stack else stack.pop())
    return out


def prompts_task(model: Any, prompts: Sequence[str] | None = None, n_prompts: int = 32, seq_len: int = 128,
                 seed: int = 0, corpus: str | None = None) -> Task:
    """The user's prompts (tokenized one by one, right-padded), else snippets of a corpus (stdlib source for
    byte-level models, English prose for the others, or the ``corpus`` named), cut to ``seq_len`` tokens."""
    if prompts is None:
        prompts = _snippets(model, n_prompts, seq_len, seed, corpus)
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise ProbeError("no prompts to measure on; give a prompts file with one prompt per line")
    rows = [model.to_tokens(p)[0][: model.cfg.n_ctx] for p in prompts]
    T = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), T, dtype=torch.long, device=model.device)
    mask = torch.zeros(len(rows), T, dtype=torch.long, device=model.device)
    for i, r in enumerate(rows):
        tokens[i, : len(r)], mask[i, : len(r)] = r, 1
    positions = F.pad(mask[:, 1:].bool(), (0, 1))  # (B, T): t counts when token t+1 is real
    return Task(tokens, positions, attention_mask=mask, probe="prompts")


def _snippets(model: Any, n: int, seq_len: int, seed: int, corpus: str | None = None) -> list[str]:
    """``n`` text snippets of about ``seq_len`` tokens for the text metrics: held-out stdlib source
    (``corpus="stdlib"``, the default for byte-level models) or English prose (``corpus="prose"``, the
    default for Hugging Face tokenizers: a real LM reads words); a char-level alphabet needs the user's prompts."""
    kind = getattr(getattr(model, "tokenizer", None), "kind", None)  # native tokenizers: "byte" | "char"
    byte_level = kind == "byte"
    if corpus is None and kind not in ("byte", None):
        raise ProbeError("this metric needs prompts for this model (--prompts FILE, one prompt per line)")
    corpus = corpus or ("stdlib" if byte_level else "prose")
    gen = np.random.default_rng(seed)
    if corpus == "prose":
        from headlens.probes.prose import prose_corpus

        text = prose_corpus()
        length = 4 * min(seq_len, model.cfg.n_ctx - 1)  # characters: ~4 per subword token of English
        starts = gen.integers(0, max(1, len(text) - length), size=n)
        return [text[s : s + length] for s in starts]
    import sysconfig
    from pathlib import Path

    text = "".join(p.read_text(errors="replace") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[a-d]*.py")))
    text = text.encode("ascii", errors="ignore").decode()
    length = min(seq_len, model.cfg.n_ctx - 1) * (1 if byte_level else 3)
    starts = gen.integers(0, len(text) - length, size=n)
    return [text[s : s + length] for s in starts]


def needle_task(model: Any, n_prompts: int = 32, seq_len: int | None = None, seed: int = 0,
                haystack: str | None = None) -> Task:
    """Needle-in-a-haystack prompts of one length (default ``min(n_ctx, 2048)``), the needle at depths
    0.1 .. 0.9 in turn; the positions read are the copy steps (``headlens.probes.haystack``; the haystack
    by default prose for a real LM, random tokens for a byte-level one)."""
    from headlens.probes.haystack import DEPTHS, NEEDLE_LEN, default_haystack, needle_prompt

    haystack = haystack or default_haystack(model)

    seq_len = min(model.cfg.n_ctx, 2048) if seq_len is None else seq_len
    gen = torch.Generator().manual_seed(seed)
    n = min(NEEDLE_LEN, len(ordinary_tokens(model)) // 2, (seq_len - 1) // 4)
    rows = [needle_prompt(model, seq_len, DEPTHS[i % len(DEPTHS)], n, haystack, gen) for i in range(n_prompts)]
    tokens = torch.tensor([ids for ids, _ in rows], dtype=torch.long, device=model.device)  # (N, T)
    positions = torch.tensor([nxt for _, nxt in rows], device=model.device) >= 0  # (N, T): copy steps
    return Task(tokens, positions, probe="needle")


def ioi_task(model: Any, probe: Any, corrupted: bool = False) -> Task:
    """The IOI prompts of ``probe`` (an :class:`~headlens.probes.ioi.IOIProbe`), right-padded, read at END
    against their answers (IO, S); ``corrupted``: the position-aligned ABC prompts instead (the paper's
    corrupted run, same shape, same answers)."""
    rows = probe.corrupted if corrupted else probe.prompts
    T = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)], mask[i, : len(r)] = r, 1
    end = F.one_hot(probe.positions["END"], T).bool()  # (N, T): the logits that predict the answer
    return Task(tokens.to(model.device), end.to(model.device), mask.to(model.device), probe="ioi",
                answers=probe.answers.to(model.device))


def make_task(model: Any, metric: str, prompts: Sequence[str] | str | Any = None, n_prompts: int = 32,
              seed: int = 0, seq_len: int | None = None, corpus: str | None = None) -> Task:
    """The task ``metric`` is measured on (for ``kl``: the prompts if given, else the repeated probe).

    ``seq_len`` sets the length of generated prompts (capped by the context; default: each probe's own),
    ``corpus`` (``"stdlib"`` source or ``"prose"``) puts real text windows under the text metrics
    (``lm_loss``, ``kl``); without it they read stdlib source on byte-level models and prose on the others.
    ``prompts="ioi"`` (or an ``IOIProbe``) is the IOI probe: ``logit_diff`` reads it (its default), the text
    metrics read its texts.
    """
    from headlens.probes.base import CORPORA
    from headlens.probes.ioi import ioi_probe, resolve

    m = get_metric(metric)
    if corpus is not None and corpus not in CORPORA:
        raise ProbeError(f"unknown corpus {corpus!r}; expected one of {', '.join(CORPORA)}")
    if corpus is not None and prompts is not None:
        raise AblationError("give prompts or a corpus, not both")
    if getattr(model, "output_kind", "logits") != "logits":
        raise ProbeError(f"metric {metric!r} reads logits; {model.name!r} has no output head (it returns hidden states)")
    ioi = resolve(model, prompts, n_prompts, seed)
    if m.probe == "ioi":
        if prompts is not None and ioi is None:
            raise ProbeError(f"metric {metric!r} reads IOI prompts, whose answers it knows; give prompts='ioi' "
                             f"(--prompts ioi) or none")
        if corpus is not None:
            raise AblationError(f"metric {metric!r} reads IOI prompts, not a corpus")
        return ioi_task(model, ioi or ioi_probe(model, n_prompts, seed))
    if ioi is not None:
        prompts = ioi.texts
    if m.probe in ("repeated", "brackets", "needle") or metric == "lm_loss":
        if not model.is_causal:
            raise ProbeError(f"metric {metric!r} scores next-token predictions; this model is bidirectional")
    n_ctx = model.cfg.n_ctx
    if m.probe == "repeated" or (metric == "kl" and prompts is None and corpus is None and model.is_causal):
        seg = None if seq_len is None else max(2, min((seq_len - 1) // 2, (n_ctx - 1) // 2))
        task = repeated_task(model, n_prompts, seg_len=seg, seed=seed)
        return task.with_positions(first_half_positions(task)) if metric == "first_half_loss" else task
    if m.probe == "brackets":
        return bracket_task(model, n_prompts, length=None if seq_len is None else min(seq_len, n_ctx - 1), seed=seed)
    if m.probe == "needle":
        return needle_task(model, n_prompts, seq_len=None if seq_len is None else min(seq_len, n_ctx), seed=seed)
    task = prompts_task(model, prompts, n_prompts, seed=seed, corpus=corpus,
                        **({} if seq_len is None else {"seq_len": seq_len}))
    if metric == "kl" and task.attention_mask is not None:  # every real position counts for kl
        task = task.with_positions(task.attention_mask.bool())
    return task


def bootstrap_ci(values: np.ndarray | torch.Tensor, n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of per-prompt ``values`` (NaN with fewer than 2)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(v), size=(n_boot, len(v)))
    means = v[idx].mean(1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))
