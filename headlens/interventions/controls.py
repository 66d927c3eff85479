"""Random-head controls: groups of as many heads as the one ablated, drawn from its own layers or from
the whole model, so that an effect can be compared with what taking out *any* such heads costs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from headlens.interventions.ablation import Head
from headlens.zoo.names import CONTROLS as CONTROLS  # re-exported: sweep and the app read it here

Group = tuple[Head, ...]

# CONTROLS: where control heads are drawn: the group's own layers, anywhere, or "auto" (its layers while they
# have heads to spare, else anywhere: a group that fills a layer would otherwise get no control at all)


def control_scope(group: Group, n_heads: int, control: str) -> str:
    """``control`` itself, or for ``"auto"``: ``"layer"`` when every layer of the group has as many
    other heads to draw, else ``"model"``."""
    if control != "auto":
        return control
    per_layer: dict[int, int] = {}
    for layer, _ in group:
        per_layer[layer] = per_layer.get(layer, 0) + 1
    return "layer" if all(n_heads - k >= k for k in per_layer.values()) else "model"


def control_groups(group: Group, n_heads: int, n_control: int, rng: np.random.Generator,
                   n_layers: int = 0, scope: str = "layer") -> list[Group]:
    """Random groups of as many heads as ``group``, none of its own heads.

    ``scope="layer"``: as many heads in each of the group's layers (the default: a layer's heads
    share its inputs, so this controls for depth). ``scope="model"``: as many heads drawn from all
    ``n_layers x n_heads`` heads (Wu et al. 2024's random heads; the only control left when the
    group fills its layers). ``scope="auto"``: :func:`control_scope` picks one of the two.
    """
    if scope == "auto":
        scope = control_scope(group, n_heads, scope)
    if scope == "model":
        free = [(layer, h) for layer in range(n_layers) for h in range(n_heads) if (layer, h) not in group]
        if len(free) < len(group):
            return []
        if math.comb(len(free), len(group)) <= n_control:
            return [tuple(c) for c in itertools.combinations(free, len(group))]
        drawn: set[Group] = set()
        while len(drawn) < n_control:
            drawn.add(tuple(sorted(free[i] for i in rng.choice(len(free), len(group), replace=False))))
        return sorted(drawn)
    per_layer: dict[int, int] = {}
    for layer, _ in group:
        per_layer[layer] = per_layer.get(layer, 0) + 1
    options = []
    for layer, k in sorted(per_layer.items()):
        free = [h for h in range(n_heads) if (layer, h) not in group]
        if len(free) < k:
            return []
        options.append([tuple((layer, h) for h in c) for c in itertools.combinations(free, k)])
    total = math.prod(len(o) for o in options)
    if total <= n_control:
        return [tuple(h for part in combo for h in part) for combo in itertools.product(*options)]
    chosen: set[Group] = set()
    while len(chosen) < n_control:
        chosen.add(tuple(h for o in options for h in o[rng.integers(len(o))]))
    return sorted(chosen)
