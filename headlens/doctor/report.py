"""What the doctor found: small dataclasses with a readable ``__str__`` and ``to_dict()`` for JSON."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


def _num(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "nan"
    if math.isinf(x):
        return "inf"
    return f"{x:.2e}" if abs(x) < 1e-2 and x != 0 else f"{x:.4f}"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


@dataclass(frozen=True)
class Evidence:
    """How well one candidate explanation reproduces the user's output."""

    bug: str  # bug name, "correct" for the reference itself
    variant: str  # which form of the bug
    max_abs_diff: float  # max |user output - candidate output|
    matches: bool  # within tolerance


@dataclass(frozen=True)
class ProbeResult:
    """One invariant every correct multi-head attention satisfies."""

    name: str
    passed: bool
    value: float  # the measured violation (max abs change)
    detail: str


@dataclass
class AttentionReport:
    """Result of :func:`headlens.doctor.check_attention`."""

    passed: bool
    diagnosis: str | None  # bug name that reproduces the module's output; None when passed or unexplained
    diagnosis_title: str
    variant: str
    layout: str
    max_abs_diff: float  # module vs correct reference
    tolerance: float
    evidence: list[Evidence] = field(default_factory=list)
    probes: list[ProbeResult] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(dataclasses.asdict(self))

    def __str__(self) -> str:
        s = self.settings
        lines = [
            f"attention check: {'PASSED' if self.passed else 'FAILED'}",
            f"  module layout : {self.layout}",
            f"  expected      : d_model={s.get('d_model')}, n_heads={s.get('n_heads')}, "
            f"causal={s.get('causal')}; input {s.get('input_shape')} ({s.get('dtype')})",
            f"  vs reference  : max |diff| = {_num(self.max_abs_diff)} (tolerance {_num(self.tolerance)})",
        ]
        if not self.passed:
            if self.diagnosis:
                lines.append(f"  diagnosis     : {self.diagnosis} — {self.diagnosis_title} [{self.variant}]")
                if s.get("looks_like"):
                    lines.append(f"  looks like    : {s['looks_like']}")
            else:
                lines.append(f"  diagnosis     : {self.diagnosis_title}")
        if self.evidence:
            lines.append("  evidence (reference with each bug injected, closest first):")
            for e in self.evidence[:8]:
                mark = "<= reproduces" if e.matches else ""
                lines.append(f"    {e.bug:<24} {e.variant[:52]:<52} {_num(e.max_abs_diff):>9} {mark}")
        if self.probes:
            lines.append("  invariant probes:")
            for p in self.probes:
                lines.append(f"    {'[ok]' if p.passed else '[FAIL]':<6} {p.name:<22} {_num(p.value):>9}  {p.detail}")
        return "\n".join(lines)


@dataclass(frozen=True)
class HeadCountEvidence:
    """The model's loss when its weights are split into ``n_heads`` heads."""

    n_heads: int
    d_head: int
    loss: float  # mean next-token cross-entropy (nats) on the evaluation text
    delta: float  # loss - best loss over all candidates
    z: float  # delta in standard errors of the paired per-row loss gap
    n_kv_heads: int | None = None  # key/value heads of this layout (Hugging Face families with GQA/MQA)
    rows: int | None = None  # evaluation rows it ran (fewer than the source's: dropped as clearly worse)


@dataclass
class SourceEvidence:
    """The head-layout evidence from one evaluation source (a text, or random token ids repeated)."""

    name: str  # "text" | "random tokens (period P)"
    description: str
    status: str  # what this source alone says: "passed" | "failed" | "inconclusive"
    separation: float  # nats between its best layout and the runner-up
    used: bool  # the verdict was taken from this source
    evidence: list[HeadCountEvidence] = field(default_factory=list)
    fits: bool | None = None  # whether the source fits the model (random ids: whether the model copies them)
    problems: list[str] = field(default_factory=list)  # why it does not fit
    unknown_share: float | None = None  # share of unknown tokens
    distinct_tokens: int | None = None
    unigram_loss: float | None = None  # loss of the source's own token frequencies (nats)
    note: str = ""  # what was not run on it (layouts ruled out on an earlier source)
    baseline: str = "unigram"  # what unigram_loss is: "unigram" (a text's frequencies) or "chance" (generated ids)


def _evidence_lines(evidence: list[HeadCountEvidence], inferred: int | None, claimed: int) -> list[str]:
    lines = [f"    {'n_heads':>7} {'n_kv':>4} {'d_head':>6} {'rows':>4} {'loss':>8} {'+best':>8} {'z':>7}"]
    for e in evidence:
        tags = []
        if e.n_heads == inferred:
            tags.append("<= best")
        if e.n_heads == claimed:
            tags.append("<= claimed")
        kv = e.n_heads if e.n_kv_heads is None else e.n_kv_heads
        z = f"{e.z:>7.1f}" if abs(e.z) < 1e6 else f"{'>1e6' if e.z > 0 else '<-1e6':>7}"
        rows = "" if e.rows is None else e.rows
        lines.append(f"    {e.n_heads:>7} {kv:>4} {e.d_head:>6} {rows:>4} {e.loss:>8.4f} {e.delta:>8.4f} {z}  "
                     f"{' '.join(tags)}".rstrip())
    return lines


@dataclass
class CheckpointReport:
    """Result of :func:`headlens.doctor.check_checkpoint`."""

    path: str
    format: str  # "headlens" | "huggingface"
    passed: bool
    config_n_heads: int  # what the checkpoint's config says
    claimed_n_heads: int  # what was checked against (--n-heads, else the config)
    inferred_n_heads: int  # the head count the weights work best with (the claim, when it is plausible)
    plausible_n_heads: list[int]  # head counts the evaluation cannot tell apart from the best
    d_model: int
    evaluation: str  # what text the losses were measured on
    margin: float  # loss gap (nats) a disagreement must exceed (and z_min standard errors)
    evidence: list[HeadCountEvidence] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    family: str = "gpt2"  # the transformers model_type (gpt2 for headlens checkpoints)
    config_n_kv_heads: int | None = None  # key/value heads the config says (families with GQA/MQA fields)
    inferred_n_kv_heads: int | None = None  # key/value heads of the inferred layout
    verdict: str = "passed"  # "passed" | "failed" | "inconclusive" (no source separates the layouts)
    sources: list[SourceEvidence] = field(default_factory=list)  # every evaluation source, the used one marked
    file: dict[str, Any] | None = None  # a GGUF file's provenance (sha256, quantization): what was converted
    notes: list[str] = field(default_factory=list)  # what was substituted (a GGUF file: its dequantized model)
    skipped_sources: list[str] = field(default_factory=list)  # not run: an earlier source that fits had decided
    weights: str = ""  # what the weight shapes fix about the layout (then no source runs: :mod:`headlens.doctor.shapes`)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(dataclasses.asdict(self))

    def __str__(self) -> str:
        decided = self.verdict != "inconclusive"
        lines = [
            f"checkpoint check: {self.verdict.upper()}  ({self.path}, {self.format})",
            f"  family          : {self.family}" + (f", config n_kv_heads {self.config_n_kv_heads}"
                                                     + (f", inferred n_kv_heads {self.inferred_n_kv_heads}"
                                                        if decided else "")
                                                     if self.config_n_kv_heads is not None else ""),
            f"  config n_heads  : {self.config_n_heads}"
            + (f"   (checked against --n-heads {self.claimed_n_heads})"
               if self.claimed_n_heads != self.config_n_heads else ""),
            (f"  inferred n_heads: {self.inferred_n_heads}   (d_model={self.d_model}, "
             f"{'from' if self.weights else 'loss on'} {self.evaluation})"
             if decided else f"  inferred n_heads: none   (d_model={self.d_model}: no source separates the layouts)")
            + (f"\n  plausible       : {self.plausible_n_heads}" if len(self.plausible_n_heads) > 1 else ""),
        ]
        if self.weights:
            lines.append(f"  weights         : {self.weights}")
        shown = self.sources or ([] if self.weights else [SourceEvidence("evaluation", self.evaluation, self.verdict,
                                                                         0.0, True, self.evidence)])
        for src in shown:
            used = "  <= verdict" if src.used and decided else ""
            lines.append(f"  {src.name}: {src.description} -> {src.status}{used}")
            if src.note:
                lines.append(f"    ({src.note})")
            if src.fits is not None:
                lines.append(f"    fit: {'yes' if src.fits else 'NO'} (unknown tokens {src.unknown_share:.0%}, "
                             f"{src.distinct_tokens} distinct, {src.baseline} loss {src.unigram_loss:.3f} nats)")
            lines += _evidence_lines(src.evidence, self.inferred_n_heads if src.used and decided else None,
                                     self.claimed_n_heads)
        if self.skipped_sources:
            lines.append(f"  not run: {', '.join(self.skipped_sources)} (the {self.sources[-1].name} decided; "
                         f"--all-sources runs them)")
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"  took {self.seconds:.1f} s")
        return "\n".join(lines)
