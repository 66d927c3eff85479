"""Interventions: what a head actually does, by taking it out.

Zero / mean / resample / uniform ablation as context managers (:mod:`~headlens.interventions.ablation`),
sweeps over head groups with random-head controls and bootstrap CIs
(:mod:`~headlens.interventions.sweep`; its ablated forwards in :mod:`~headlens.interventions.runners`, logits
read only where the metrics read, in chunks: :mod:`~headlens.interventions.logits`), the one-pass attribution that ranks heads
(:mod:`~headlens.interventions.attribution`), ``--confirm``, and the task metrics they measure
(:mod:`~headlens.interventions.metrics`).
"""
