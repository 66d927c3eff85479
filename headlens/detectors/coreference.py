"""coreference (Clark et al. 2019): T(pronoun) = {its antecedent}, on templated sentences.

An *annotated* head type: its targets come from character spans in the probe's sentences
(:mod:`headlens.probes.coreference` writes them, :mod:`headlens.probes.spans` maps them to tokens,
:mod:`headlens.scoring.annotated` scores them), not from a function of the token ids. The other
candidate of each sentence is the distractor, which adds the preference accuracy column.
"""

from __future__ import annotations

from headlens.detectors.base import Detector

DETECTOR = Detector("coreference", "annotated", None, "coreference",
                    "attends from a pronoun to the name or noun it refers to, not to the other candidate")
