"""``headlens.circuit``: the edge table for chosen receivers, or the circuit discovered for a metric."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from headlens.circuits.edges import control_edges, edge_table
from headlens.circuits.engine import edge_values
from headlens.circuits.local import check_edges, is_receiver_metric, receiver_detector, receiver_values
from headlens.circuits.nodes import (
    CircuitError,
    Edge,
    Node,
    at_positions,
    make_edges,
    parse_inputs,
    parse_nodes,
)
from headlens.circuits.positions import NamedPositions, parse_positions
from headlens.circuits.senders import Alignment, SenderDeltas, check_method
from headlens.interventions.metrics import Task, get_metric, make_task
from headlens.models.memory import release_freed
from headlens.scoring.output import provenance


class MaskedDeltas:
    """Sender deltas kept at the positions of ``mask`` ``(B, T)`` only (the effect split by position)."""

    def __init__(self, inner: SenderDeltas, mask: torch.Tensor) -> None:
        self.inner, self.mask = inner, mask

    def delta(self, node: Node) -> torch.Tensor:
        return self.inner.delta(node) * self.mask[:, :, None].to(self.inner.clean["embed"])


@dataclass
class Setup:
    """What every edge run of one call shares: the model, task, sender deltas and settings."""

    model: Any
    metric: str
    task: Task
    deltas: SenderDeltas
    n_control: int
    n_boot: int
    seed: int
    fast: bool
    labels: dict[str, str] | None
    progress: Callable[[int], None] | None = None
    prompts: Any = None  # the user's prompts (or the IOI probe), for the sweep that finds discovery's roots
    composition_ref: dict[str, Any] = field(default_factory=dict)  # reference scores, once per call (edge_table)
    named: NamedPositions | None = None  # the prompts' named positions (edges restricted to them)
    ioi: Any = None  # the IOI probe, when the prompts are it
    measured: dict[Edge, np.ndarray] = field(default_factory=dict)  # per-prompt effects (B,) of every edge tabled
    # the patchers of this call's prompts, kept from one table to the next (each records a clean forward when
    # made); discovery empties it when its rounds are done (:meth:`done_patching`)
    patchers: dict[Any, Any] = field(default_factory=dict)
    # the clean run of every prompt recorded with the senders' activations (one forward for both), until the first
    # table's patcher takes it; discovery's roles read the attention patterns of the same forward (None: a forward)
    clean_run: Any = None
    patterns: dict[str, torch.Tensor] | None = None
    # called as stage(what, total, done) when a stage of `total` steps starts (its edges then come through
    # `progress`) or, for a stage that counts itself (discovery's sweep), as it goes: the CLI's bar and time left
    stage: Callable[[str, int, int], None] | None = None

    def begin(self, what: str, total: int, done: int = 0) -> None:
        """Tell the progress display where the work is (:attr:`stage`); nothing when no one listens."""
        if self.stage is not None:
            self.stage(what, total, done)

    def values(self, edges: Sequence[Edge]) -> tuple[Any, dict[tuple[Edge, str], np.ndarray]]:
        """``(clean, values)`` of ``edges`` on this process: ``values[edge, metric]`` per prompt; ``clean`` the
        metric's clean values, or for a receiver metric ``values[edge, "clean"]`` (each receiver its own)."""
        if is_receiver_metric(self.metric):
            clean, patched = receiver_values(self.model, self.task, self.metric, edges, self.deltas, self.named,
                                             self.fast, progress=self.progress)
            return None, {**{(e, self.metric): v for e, v in patched.items()},
                          **{(e, "clean"): v for e, v in clean.items()}}
        clean, values = edge_values(self.model, self.task, [self.metric], edges, self.deltas, self.fast,
                                    self.progress, named=self.named, patchers=self.patchers, run=self.clean_run)
        return clean[self.metric], values

    def recorded_run(self) -> Any:
        """The clean run of every prompt that a kept patcher recorded (a :class:`~headlens.circuits.recorded.CleanRun`,
        for the first pass to start from), or None."""
        for patcher in self.patchers.values():
            run = getattr(patcher, "run", None)
            if run is not None and run.final.shape[0] == self.task.n_prompts:
                return run
        return self.clean_run

    def done_patching(self) -> None:
        """Free the kept patchers and their clean runs (what a phase after the tables needs the memory for)."""
        self.patchers.clear()
        self.clean_run = None
        release_freed()

    def table(self, edges: Sequence[Edge], composition: bool = True, what: str = "patching edges") -> Any:
        """The edge table of ``edges`` (with their controls). Under torchrun each rank patches a
        contiguous block of the edges, rank 0 builds the table and the other ranks return None. ``what``: the
        stage's name in the progress display."""
        from headlens.scoring.distributed import current, gather_objects, run_everywhere

        controls = control_edges(self.model, edges, self.n_control, self.seed)
        todo = list(dict.fromkeys([*edges, *(c for cs in controls.values() for c in cs)]))
        rank = current()
        mine = [todo[i] for i in rank.block(len(todo))]
        self.begin(what, len(mine))
        release_freed()  # what the phase before freed (discovery's first pass: 0.7 GB on SmolLM2) goes back first
        clean, values = run_everywhere(rank, self.values, mine)
        release_freed()
        gathered = gather_objects(rank, list(values.items()))
        if gathered is None:
            return None
        values = dict(gathered)
        if clean is None:  # a receiver metric: each edge against its receiver's clean score
            clean = {e: values[e, "clean"] for e in todo}
        self.measured.update({e: values[e, self.metric] - (clean[e] if isinstance(clean, dict) else clean)
                              for e in edges})  # what the run-time check compares, prompt by prompt
        return edge_table(self.model, self.metric, edges, clean, values, controls,
                          self.labels, self.n_boot, self.seed, composition, self.composition_ref)


def setup(model: Any, metric: str = "repeated_loss", method: str = "mean", prompts: Sequence[Any] | None = None,
          reference: Any = None, n_prompts: int = 32, n_control: int = 8, n_boot: int = 1000, seed: int = 0,
          fast: bool = True, labels: Any = None, progress: Callable[[int], None] | None = None,
          stage: Callable[[str, int, int], None] | None = None) -> Setup:
    """Resolve the metric's task, the prompts' named positions, the reference and the sender deltas once.

    ``prompts`` may hold JSONL rows (dicts) that name positions by character span (:mod:`headlens.probes.named`).
    """
    check_method(method)
    from headlens.probes.ioi import resolve

    ioi = None if isinstance(prompts, list | tuple) else resolve(model, prompts, n_prompts, seed)
    texts, index = (ioi, dict(ioi.positions)) if ioi is not None else split_positions(model, prompts)
    if is_receiver_metric(metric):
        receiver_detector(metric)
        base = "lm_loss" if texts is not None else "repeated_loss"  # the detectors' probe: BOS + r + r
    else:
        metric = base = get_metric(metric).name
    task = make_task(model, base, texts, n_prompts, seed)
    aligned = None
    if ioi is not None and reference is None:  # the paper's corrupted distribution: each prompt's ABC twin
        from headlens.interventions.metrics import ioi_task

        reference = ioi_task(model, ioi, corrupted=True).tokens
        aligned = Alignment.of(task, index)
    elif method == "corrupted" and reference is None:  # a fresh draw of the same probe: same shape, other tokens
        reference = make_task(model, base, texts, n_prompts, seed + 1).tokens
    run, patterns = _clean_run(model, task, metric, fast, bool(index))
    deltas = SenderDeltas(model, task.tokens, method, reference, seed, task.attention_mask, aligned,
                          None if run is None else run.extra)
    dev = task.tokens.device
    named = NamedPositions({k: v.to(dev) for k, v in index.items()}, tuple(task.tokens.shape)) if index else None
    return Setup(model, metric, task, deltas, n_control, n_boot, seed, fast, head_labels(labels), progress,
                 texts, named=named, ioi=ioi, stage=stage, clean_run=run, patterns=patterns)


def _clean_run(model: Any, task: Task, metric: str, fast: bool, named: bool) -> tuple[Any, dict | None]:
    """The clean run the first table's resumed patcher starts from, recorded with what the senders' deltas read of
    the same forward (and, for prompts that name positions, every layer's attention pattern for the roles), or
    ``(None, None)`` where no resumed patcher will take it: its block of prompts would not hold them all."""
    from headlens.circuits.engine import rows_per_block
    from headlens.circuits.recorded import CleanRun, resumable
    from headlens.readout.write import write_path

    if not fast or is_receiver_metric(metric) or not resumable(model) or rows_per_block(model, task)[0] < task.n_prompts:
        return None, None
    patterns = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)] if named else []
    run = CleanRun(model, task, keys=True, extra=[*write_path(model).activations().values(), *patterns])
    return run, {n: run.extra.pop(n) for n in patterns} if named else None


def split_positions(model: Any, prompts: Sequence[Any] | None) -> tuple[list[str] | None, dict[str, torch.Tensor]]:
    """The prompts' texts and their named positions (``{}`` when no row names any)."""
    if prompts is None:
        return None, {}
    rows = list(prompts)
    if not any(isinstance(r, dict) for r in rows):
        return [str(r) for r in rows], {}
    from headlens.probes.named import named_positions

    return named_positions(model, rows)


def head_labels(labels: Any) -> dict[str, str] | None:
    """``{"L1H1": "induction", ...}`` from a dict or a ``classify`` scores table (each head's labelled
    detectors, strongest lift first, comma-joined: the first is the colour a graph gives it); None stays None."""
    if labels is None or isinstance(labels, dict):
        return labels
    from headlens.scoring.table import head_labels as by_head

    return {f"L{layer}H{head}": ",".join(dets) for (layer, head), dets in by_head(labels).items()}


def circuit(
    model: Any,
    receivers: str | Sequence[str] | None = None,
    senders: str | Sequence[str] | None = None,
    inputs: str = "qkv",
    metric: str = "repeated_loss",
    method: str = "mean",
    prompts: Sequence[str] | None = None,
    reference: Any = None,
    n_prompts: int = 32,
    n_control: int = 8,
    per_group: bool = False,
    positions: str | Sequence[str] | bool | None = None,
    sender_positions: str | Sequence[str] | None = None,
    labels: Any = None,
    n_boot: int = 1000,
    seed: int = 0,
    fast: bool = True,
    progress: Callable[[int], None] | None = None,
    device: str = "cpu",
    first_pass: int | None = None,
    stage: Callable[[str, int, int], None] | None = None,
    check: bool = True,
) -> Any:
    """Measure how heads work together: the edge table (ARCHITECTURE.md) for ``receivers``, or a discovered circuit.

    Args:
        model: a loaded model or a reference (zoo name, ``.safetensors`` path, ``hf:<dir>``).
        receivers: ``"L1H0,L1H1"`` (heads, or ``logits``); None: discover the circuit for ``metric``
            (:func:`headlens.circuits.discovery.discover`).
        senders: ``"L0H0,embed,mlp0"``; None: every sender that runs before each receiver. A named sender
            that runs after its receiver is an error.
        inputs: which receiver inputs, letters of ``"qkv"``.
        metric: a registered task metric (``repeated_loss``, ``lm_loss``, ``kl``, ``bracket_accuracy``,
            ``needle_recall``, ...); the effect is ``metric(patched) - metric(clean)``. Or a receiver-local
            metric ``receiver:<detector>`` (``receiver:induction``): the receiver's own score for that
            detector, nothing downstream (:mod:`headlens.circuits.local`; q and k edges, receivers given).
        method: how the sender is ablated on the edge: ``mean``, ``resample``, ``zero`` or ``corrupted``
            (the same row of a corrupted run: ``reference``, default a fresh draw of the metric's probe).
        prompts: the user's prompts (``lm_loss``, ``kl``), or ``"ioi"``: the IOI probe (``logit_diff``'s; its
            named positions IO, S1, S1+1, S2, END, and its corrupted ABC twin for ``method="corrupted"``).
            JSONL rows as dicts may name positions by character span, ``{"text": ..., "positions": {"END":
            [40, 42]}}`` (:mod:`headlens.probes.named`).
        reference: reference prompts for ``mean``/``resample`` (default: the task's own), corrupted ones
            for ``corrupted``.
        n_prompts: probe prompts.
        n_control: random senders of the sender's layer per edge, for the control.
        per_group: under grouped-query attention, key/value edges per key/value group (named by the
            group's first query head) instead of per query head.
        positions: receiver positions the edges are restricted to: names the prompts give (``"END,S2"``)
            or ``all``; one row per position (``receiver_pos``). The receiver's output is patched at those
            query positions only (:mod:`headlens.circuits.positions`). ``True``: instead, add
            ``effect_first_half`` / ``effect_second_half`` columns (the sender patched only at positions
            ``t <= T // 2`` or only after; for ``BOS + r + r``: the first copy vs the repeat).
        sender_positions: the positions of the sender's write that enter a key or value (``sender_pos``;
            a query reads at its own position, so q edges take the receiver's).
        labels: ``classify``'s scores table or ``{"L1H1": "induction"}``: fills the ``label`` column.
        n_boot: bootstrap resamples for the CIs.
        seed: seeds the probe, the controls, resampling, the null and the bootstrap.
        fast: the cached / batched path (same numbers as ``fast=False``, one forward per edge).
        progress: called with the number of steps just finished in the current stage (edges patched; in
            discovery also the first pass's prompts, the faithfulness runs' circuits and the run-time check's
            edges).
        stage: called as ``stage(what, total, done)`` when a stage starts (``"patching edges"`` with its
            number of edges; in discovery each round's first pass and patching, the faithfulness runs, the
            run-time check, and the sweep of single heads as it goes), so a progress display can show a
            fraction and a time left.
        device: where a model reference is loaded.
        first_pass: discovery only: rank each round's candidate edges by edge attribution patching (one
            forward and backward) and patch the top ``first_pass`` exactly; the rest are not measured.
            Every reported edge is still measured exactly. ``attrs["first_pass"]`` reports the ranking.
        check: re-measure the strongest edge and one drawn at random by path patching by freezing before
            returning (:mod:`headlens.circuits.check`; a few forwards), and raise ``CheckError`` when they
            disagree; ``attrs["check"]`` holds the result. ``False`` skips it (power users, known families).

    Under ``torchrun`` (receivers given) the edges are shared out to the ranks in contiguous blocks and rank 0
    returns the table; the other ranks return None.

    Returns:
        A pandas DataFrame with :data:`headlens.circuits.edges.COLUMNS`; ``attrs`` hold the metric, its clean
        value, the method and the random composition baseline (discovery adds faithfulness).

    >>> import headlens
    >>> df = headlens.circuit("induction-2l", receivers="L1H1", senders="L0H0", inputs="k")  # doctest: +SKIP
    """
    from headlens.scoring.classification import resolve_model

    if isinstance(model, str) or model is None or not hasattr(model, "n_heads"):  # a reference or an object
        model = resolve_model(model, device=device)
    if not model.is_causal:  # found by the run-time check: BERT's edges into the logits were off by 2x
        raise CircuitError(f"{model.name!r} is an encoder: its post-LN blocks normalise the residual stream itself "
                           "after each sublayer, so no component's write is an additive part of what later layers "
                           "read, and edges by path patching on sender deltas do not apply")
    ins = parse_inputs(inputs)
    recv = parse_nodes(receivers, model)
    if first_pass is not None and recv is not None:
        raise CircuitError("first_pass ranks discovery's candidates; with receivers given every edge is patched "
                           "(drop --receivers to discover, or drop --first-pass)")
    send = parse_nodes(senders, model)
    if is_receiver_metric(metric):
        receiver_detector(metric)
        if recv is None:
            raise CircuitError(f"{metric} is a receiver's own score: give --receivers (discovery needs a task metric)")
    if recv is not None:  # names first: a bad edge fails before any forward
        edges = make_edges(model, recv, send, ins, per_group)
        if is_receiver_metric(metric):
            check_edges(edges)
    elif hasattr(model, "bridge"):  # discovery patches q/k/v inputs: a family without forks fails before the sweep
        from headlens.circuits.bridge import forks

        with forks(model):
            pass
    s = setup(model, metric, method, prompts, reference, n_prompts, n_control, n_boot, seed, fast, labels, progress,
              stage)
    if recv is None:
        from headlens.circuits.discovery import discover
        from headlens.scoring.distributed import current

        if current().world_size > 1:
            raise CircuitError("discovery runs in one process; under torchrun give --receivers")

        df = discover(s, inputs=ins, senders=send, first_pass=first_pass)
        edges = None  # read back from the rows by the check
    else:
        named_pos = None if isinstance(positions, bool) else parse_positions(positions, s.named)
        sender_pos = parse_positions(sender_positions, s.named)
        if named_pos or sender_pos:
            edges = list(dict.fromkeys(p for e in edges for p in at_positions(e, named_pos, sender_pos)))
        df = s.table(edges)
        if df is None:  # a rank other than 0 under torchrun: its edges went to rank 0
            return None
        if positions is True:
            add_position_split(s, df, edges)
    if check:
        from headlens.circuits.check import run_check

        run_check(s, df, edges)
    df.attrs["method"] = method
    made = provenance(model, table="circuit edges", metric=metric, method=method, inputs=inputs,
                      n_prompts=n_prompts, n_control=n_control, per_group=per_group, seed=seed, check=check)
    df.attrs.update({k: v for k, v in made.items() if k not in df.attrs})  # what the engine recorded wins
    return df


def add_position_split(s: Setup, df: Any, edges: Sequence[Edge]) -> None:
    """``effect_first_half`` / ``effect_second_half``: the edge patched at positions ``t <= T // 2`` / after."""
    T = s.task.tokens.shape[1]
    first = (torch.arange(T, device=s.task.tokens.device) <= T // 2).expand_as(s.task.tokens)
    for name, mask in (("effect_first_half", first), ("effect_second_half", ~first)):
        part = Setup(s.model, s.metric, s.task, MaskedDeltas(s.deltas, mask), 0, s.n_boot, s.seed, s.fast, None)
        clean, values = edge_values(part.model, part.task, [s.metric], edges, part.deltas, part.fast)
        df[name] = [float(np.mean(values[e, s.metric] - clean[s.metric])) for e in edges]
