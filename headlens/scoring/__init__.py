"""Scoring: from probes and detectors to the tidy scores table.

The scan (:mod:`~headlens.scoring.engine`, :mod:`~headlens.scoring.scan`) runs forward passes and
reduces each head's attention on a detector's targets to a few float64 sums per prompt: from the
dense pattern for short prompts, or from q, k and each row's log-sum-exp (:mod:`~headlens.scoring.lse`)
for long ones; the top-1 engine (:mod:`~headlens.scoring.top1`) scores retrieval heads. Statistics,
baselines, bootstrap CIs and the label rule are in :mod:`~headlens.scoring.stats`; :func:`classify`
(:mod:`~headlens.scoring.classification`) puts it together into the table of
:mod:`~headlens.scoring.table`, every row with its resting mass (:mod:`~headlens.scoring.resting`) and
the one order of a head's labels (:mod:`~headlens.scoring.primary`); :mod:`~headlens.scoring.summary`
says what a table holds at a glance. Also here: annotated spans, induction by distance, training series,
torchrun ranks and resumable shards.
"""
