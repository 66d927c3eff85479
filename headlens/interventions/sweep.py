"""Ablation sweeps: every single head (or given groups) against random-head controls.

Each group's ablated logits come from :mod:`headlens.interventions.runners` (resumed blocks from one cached
clean run on native models, a hooked forward elsewhere), at the positions the metrics read only.

Each group is compared with a control: random groups with the same number of heads in the
same layers (other heads than the group's; or anywhere in the model, ``control="model"``),
``n_control`` of them or all when there are fewer. Per-prompt deltas are averaged over the control groups, so the excess over the
control gets a paired bootstrap CI over prompts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from headlens.interventions.ablation import (
    AblationError,
    Replacement,
    check_method,
    format_heads,
    parse_heads,
)
from headlens.interventions.attribution import attribution_patching, spearman
from headlens.interventions.controls import CONTROLS, Group, control_groups, control_scope
from headlens.interventions.metrics import Task, bootstrap_ci, get_metric, make_task
from headlens.interventions.runners import NaiveRunner, ResumeRunner
from headlens.interventions.runners import pattern_rows as pattern_rows  # where callers found them
from headlens.interventions.runners import task_logits as task_logits
from headlens.interventions.runners import task_metric as task_metric
from headlens.models.gpt import GPT
from headlens.scoring.distributed import Rank, current, gather_objects, run_everywhere
from headlens.scoring.output import provenance

SHARD_GROUPS = 16  # head groups per resume shard (a kill loses at most one shard's work)

COLUMNS = [  # "model" first, as in the scores table: a file keeps what it measured
    "model", "heads", "method", "metric", "clean", "ablated", "delta", "ci_low", "ci_high",
    "control_delta", "control_ci_low", "control_ci_high", "excess_ci_low", "excess_ci_high",
    "beats_control", "attribution", "n_prompts", "control",
]


def sweep(
    model: Any,
    groups: Sequence[Any] | None = None,
    method: str = "zero",
    metrics: Sequence[str] = ("repeated_loss",),
    prompts: Sequence[str] | str | None = None,
    reference: Any = None,
    n_prompts: int = 32,
    n_control: int = 8,
    control: str = "layer",
    n_boot: int = 1000,
    seed: int = 0,
    fast: bool = True,
    attribution: bool = True,
    progress: Callable[[int, int], None] | None = None,
    resume: Any = None,
    seq_len: int | None = None,
    corpus: str | None = None,
    batch_size: int | None = None,
) -> Any:
    """Ablate each group of heads and measure ``metrics`` against clean and random-head controls: the table
    behind ``headlens ablate`` (top level: ``headlens.sweep``).

    >>> import headlens
    >>> model = headlens.load("induction-2l")  # doctest: +SKIP
    >>> table = headlens.sweep(model, groups=["L1H1"], metrics=["repeated_loss"])  # doctest: +SKIP
    >>> table[["model", "heads", "metric", "delta", "ci_low", "ci_high", "beats_control"]]  # doctest: +SKIP

    Args:
        model: any headlens backend (the cached fast path is used for native ``GPT`` models).
        groups: head groups (each ``"L1H2,L1H3"``, a list of ids or pairs); None = every single head.
        method: ``"zero"``, ``"mean"``, ``"resample"`` or ``"uniform"`` (see ``headlens.interventions.ablation``).
        metrics: registered metric names (``headlens.interventions.metrics.METRICS``).
        prompts: user prompts (``lm_loss`` / ``kl``), or ``"ioi"``: the IOI probe (``logit_diff``'s).
        reference: reference prompts for mean/resample; default: each metric's own probe prompts.
        n_prompts: probe prompts per metric.
        n_control: random control groups per group (all of them when there are fewer).
        control: where control heads are drawn (:data:`CONTROLS`): ``"layer"``, the group's own
            layers; ``"model"``, anywhere in the model; ``"auto"``, the first when it can (see
            :func:`control_groups`). The ``control`` column says which each row used.
        n_boot: bootstrap resamples for the CIs.
        seed: seeds the probes, the control draws, resampling and the bootstrap.
        fast: use the cached resume path on native models (same numbers as ``fast=False``).
        attribution: add attribution-patching estimates for single-head groups.
        progress: called as ``progress(done, total)`` after each evaluated group (``total`` is None
            under torchrun: the count is this rank's share).
        resume: a folder for finished blocks of head groups (:mod:`headlens.scoring.resume`).
        seq_len: tokens per generated probe prompt (capped by the context; default: each probe's own).
        corpus: ``"stdlib"`` (source) or ``"prose"`` (English): real text windows for the text metrics
            (``lm_loss``, ``kl``).
        batch_size: prompt rows per forward pass when single-layer groups are stacked (at least one
            group's prompts; default: ``max_tokens`` of 4096 tokens). Changes speed, not the numbers.

    Under ``torchrun`` the head groups (and their controls) are shared out to the ranks in contiguous
    blocks and rank 0 builds the table; the other ranks return None.

    Returns:
        A tidy ``pandas.DataFrame`` with ``COLUMNS`` (``model`` first); ``df.attrs`` holds the provenance
        (headlens version, model, method, metrics, probe sizes, seed; written with the table by
        :func:`headlens.scoring.output.write_frame`) and ``attribution_spearman``: each metric's rank
        correlation of attribution estimates with exact single-head deltas.
    """
    import pandas as pd

    check_method(method)
    if control not in CONTROLS:
        raise AblationError(f"control must be one of {', '.join(CONTROLS)}, got {control!r}")
    metrics = [get_metric(m).name for m in metrics]
    L, H = model.n_layers, model.n_heads
    targets: list[Group] = (
        [((layer, h),) for layer in range(L) for h in range(H)]
        if groups is None
        else [tuple(parse_heads(g, L, H)) for g in groups]
    )
    rng = np.random.default_rng(seed)
    scopes = {g: control_scope(g, H, control) for g in targets}
    controls = {g: control_groups(g, H, n_control, rng, n_layers=L, scope=scopes[g]) for g in targets}
    todo = list(dict.fromkeys([*targets, *(c for cs in controls.values() for c in cs)]))
    tasks = {m: make_task(model, m, prompts, n_prompts, seed, seq_len=seq_len, corpus=corpus) for m in metrics}
    per_prompt: dict[tuple[Group, str], np.ndarray] = {}
    clean: dict[str, np.ndarray] = {}
    attrib: dict[str, torch.Tensor] = {}
    probes = _probe_groups(tasks)
    rank = current()
    store = None
    if resume is not None:
        from headlens.scoring.resume import sweep_store

        store = sweep_store(resume, model, tasks, todo, reference, method=method, n_control=n_control,
                            seed=seed, fast=fast)
    done = iter(range(1, len(todo) * len(probes) + 1))
    total = len(todo) * len(probes) if rank.world_size == 1 else None  # a rank's share is known only later
    tick = (lambda: progress(next(done), total)) if progress is not None else (lambda: None)
    for names in probes:
        ref = tasks[names[0]].tokens if reference is None else reference
        replacement = Replacement.build(model, range(L), method, ref, seed)
        run_everywhere(rank, _measure, model, names, tasks, todo, replacement, fast, clean, per_prompt, tick,
                       rank, store, batch_size)
        if attribution and rank.is_main and any(len(g) == 1 for g in targets):  # estimates only single heads
            for m in names:
                attrib[m] = attribution_patching(model, tasks[m], m, replacement).mean(0)  # (L, H)
    gathered = gather_objects(rank, list(per_prompt.items()))  # every rank's head groups, on rank 0
    if gathered is None:
        return None
    per_prompt = dict(gathered)
    name = str(getattr(model, "name", None) or type(model).__name__)
    rows = [
        [name, *_row(g, method, m, clean[m], per_prompt, controls[g], attrib.get(m), n_boot, seed), scopes[g]]
        for g in targets for m in metrics
    ]
    df = pd.DataFrame(rows, columns=COLUMNS)
    singles = df["heads"].str.fullmatch(r"L\d+H\d+")
    df.attrs["attribution_spearman"] = {
        m: spearman(df.loc[singles & (df.metric == m), "attribution"], df.loc[singles & (df.metric == m), "delta"])
        for m in metrics
    } if attribution else {}
    df.attrs.update(provenance(model, table="ablation sweep", method=method, metrics=metrics, n_prompts=n_prompts,
                               user_prompts=prompts is not None, reference=reference is not None,
                               seq_len=seq_len, corpus=corpus, batch_size=batch_size,
                               n_control=n_control, control=control, n_boot=n_boot, seed=seed,
                               world_size=rank.world_size))
    return df


def _measure(model: Any, names: list[str], tasks: dict[str, Task], todo: list[Group], replacement: Replacement,
             fast: bool, clean: dict, per_prompt: dict, tick: Callable[[], None], rank: Rank | None = None,
             store: Any = None, batch_size: int | None = None) -> None:
    """Per-prompt values of metrics ``names`` (one shared probe) clean and for this rank's groups of ``todo``.

    The runner's units of work are dealt out to ranks in contiguous blocks (a unit keeps the shapes it
    has in one process, so the numbers are the same); with a ``store`` each run of units holding at
    least ``SHARD_GROUPS`` groups is one shard on disk.
    """
    task = tasks[names[0]]
    rank = rank or Rank()
    with torch.no_grad():
        read = torch.stack([tasks[m].positions for m in names]).any(0)  # (B, T): positions any metric reads
        if fast and isinstance(model, GPT) and not model.padded(task.attention_mask):  # resumes blocks unmasked
            budget = {} if batch_size is None else {"max_tokens": batch_size * task.tokens.shape[1]}
            runner: NaiveRunner = ResumeRunner(model, task, replacement, read, **budget)
        else:
            runner = NaiveRunner(model, task, replacement, read, keep_clean=any(get_metric(m).needs_clean for m in names))
        score = _scorer(runner, {m: tasks[m].at(runner.cols) for m in names})
        clean.update(_collect(score(rows, logits) for rows, logits in runner.clean()))
        units = runner.plan(todo)
        mine = rank.block(len(units))
        shards = _shards(units, mine, SHARD_GROUPS if store is not None else len(todo) + 1)
        for first, last in shards:
            key = f"{'+'.join(names)}-{first}-{last}"
            groups = [g for u in units[first:last] for g in u]
            stored = store.load(key) if store is not None else None
            if stored is not None:  # (n_groups, n_metrics, B)
                for i, group in enumerate(groups):
                    for j, m in enumerate(names):
                        per_prompt[group, m] = stored[0]["rows"][i, j].numpy()
                    tick()
                continue
            for unit in units[first:last]:
                for group, chunks in itertools.groupby(runner.run_unit(unit), key=lambda out: out[0]):
                    values = _collect(score(rows, logits) for _, rows, logits in chunks)
                    per_prompt.update({(group, m): v for m, v in values.items()})
                    tick()
            if store is not None:
                rows = np.stack([[per_prompt[g, m] for m in names] for g in groups])  # (n_groups, n_metrics, B)
                store.save(key, {"rows": torch.from_numpy(rows)}, groups=[format_heads(g) for g in groups])


def _scorer(runner: NaiveRunner, tasks: dict[str, Task]) -> Callable[[slice, torch.Tensor], dict[str, np.ndarray]]:
    """Per-prompt values of each metric from the logits ``(b, C, V)`` of prompts ``rows`` at the runner's columns."""
    def score(rows: slice, logits: torch.Tensor) -> dict[str, np.ndarray]:
        clean = None if runner.clean_logits is None else runner.clean_logits[rows]
        if clean is not None and runner.cols is not None and clean.shape[1] != logits.shape[1]:
            clean = clean[:, runner.cols]  # the native runner keeps every position of its clean run
        return {m: get_metric(m)(logits, task.rows(rows), clean).cpu().numpy() for m, task in tasks.items()}

    return score


def _collect(chunks: Iterator[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-metric values of consecutive chunks of prompts, joined."""
    parts: dict[str, list[np.ndarray]] = {}
    for values in chunks:
        for m, v in values.items():
            parts.setdefault(m, []).append(v)
    return {m: np.concatenate(v) for m, v in parts.items()}


def _shards(units: list[list[Group]], mine: range, min_groups: int) -> list[tuple[int, int]]:
    """``mine`` cut into runs of whole units holding at least ``min_groups`` groups (the last may hold fewer)."""
    out, first, n = [], mine.start, 0
    for i in mine:
        n += len(units[i])
        if n >= min_groups:
            out.append((first, i + 1))
            first, n = i + 1, 0
    if first < mine.stop:
        out.append((first, mine.stop))
    return out


def _probe_groups(tasks: dict[str, Task]) -> list[list[str]]:
    """Metrics whose tasks share the same tokens run from the same ablated forwards."""
    out: list[list[str]] = []
    for m, task in tasks.items():
        for names in out:
            first = tasks[names[0]]
            if first.tokens.shape == task.tokens.shape and torch.equal(first.tokens, task.tokens):
                names.append(m)
                break
        else:
            out.append([m])
    return out


def _row(group: Group, method: str, metric: str, clean: np.ndarray, per_prompt: dict, controls: list[Group],
         attrib: torch.Tensor | None, n_boot: int, seed: int) -> list[Any]:
    ablated = per_prompt[group, metric]
    delta = ablated - clean
    lo, hi = bootstrap_ci(delta, n_boot, seed)
    c_mean = c_lo = c_hi = e_lo = e_hi = float("nan")
    beats = False
    if controls:
        c_delta = np.mean([per_prompt[c, metric] - clean for c in controls], axis=0)  # (B,) per prompt
        c_mean = float(c_delta.mean())
        c_lo, c_hi = bootstrap_ci(c_delta, n_boot, seed)
        e_lo, e_hi = bootstrap_ci(delta - c_delta, n_boot, seed)
        beats = bool(e_lo > 0) if get_metric(metric).higher_is_worse else bool(e_hi < 0)
    est = float(attrib[group[0]]) if attrib is not None and len(group) == 1 else float("nan")
    return [format_heads(group), method, metric, float(clean.mean()), float(ablated.mean()), float(delta.mean()),
            lo, hi, c_mean, c_lo, c_hi, e_lo, e_hi, beats, est, len(clean)]
