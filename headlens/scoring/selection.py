"""Which detectors a classify runs: the ones asked for, or the defaults, less those the model cannot feed.

Every detector that needs something the model may lack (readable weights for the OV readout, direct logit
attribution for a gate, brackets in the tokenizer, a causal or a bidirectional model) is chosen or refused
here, before the scan starts: a default run skips it with the reason, a detector asked for by name is
refused in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headlens.detectors import all_detectors, get_detector, split_names
from headlens.detectors.base import Detector
from headlens.detectors.tl_compat import TL_DETECTORS
from headlens.errors import DetectorError, ProbeError
from headlens.models.vocab import vocab
from headlens.readout.ov import unsupported as no_readout
from headlens.readout.parts import unsupported as no_dla


def select_detectors(model: Any, names: Sequence[str] | str | None, tl_compatible: bool = False
                     ) -> tuple[list[Detector], dict[str, str], bool]:
    """The detectors to run, the default ones skipped (name -> why), and whether names were explicit."""
    if isinstance(names, str):
        names = split_names(names)
    explicit = bool(names)
    pool = TL_DETECTORS if tl_compatible else all_detectors()
    if tl_compatible and explicit:
        bad = [getattr(n, "name", n) for n in names if getattr(n, "name", n) not in TL_DETECTORS]
        if bad:
            raise DetectorError(f"detector(s) {bad} have no TransformerLens equivalent; tl_compatible "
                                f"mode scores {', '.join(TL_DETECTORS)}")
    chosen = [pool[getattr(n, "name", n)] if tl_compatible else get_detector(n) for n in names] if explicit \
        else [d for d in pool.values() if d.default]  # opt-in detectors (retrieval) only by name
    skipped: dict[str, str] = {}
    keep = []
    for d in chosen:
        why = ""
        if d.bidirectional_only and model.is_causal:
            why = f"{d.name} needs a bidirectional model; {getattr(model, 'name', 'this model')!r} is causal"
        elif d.kind == "weights" and (ov := no_readout(model)):
            why = f"{d.name}: {ov}"
        elif d.gate is not None and (dla := no_dla(model)):  # the gate reads what each head writes (DLA)
            why = f"{d.name}'s {d.gate.name} gate: {dla}"
        elif d.kind == "top1" and not model.is_causal:
            why = f"{d.name} scores copy steps of a causal model; {getattr(model, 'name', 'this model')!r} " \
                  f"is bidirectional"
        elif d.probe == "brackets" and not vocab(model).brackets:
            why = (f"{d.name}: the tokenizer keeps no bracket pair as single tokens" if model.tokenizer is not None
                   else f"{d.name} needs a tokenizer to find brackets; this model has none")
        elif d.probe in ("coreference", "ioi"):
            from importlib import import_module

            why = import_module(f"headlens.probes.{d.probe}").unsupported(model) or ""
        if why and explicit:
            raise (ProbeError if d.probe in ("brackets", "coreference", "ioi") else DetectorError)(why)
        if why:
            skipped[d.name] = why
        else:
            keep.append(d)
    return keep, skipped, explicit
