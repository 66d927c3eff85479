"""What a head does across real text: exemplars, what it reads and writes, a tested description, the atlas.

One streamed pass over a corpus (:mod:`headlens.atlas.exemplars`) keeps each head's top-k contexts under
several rankings in O(heads x k) memory (:mod:`headlens.atlas.topk`) and accumulates its attention by
relative offset (:mod:`headlens.atlas.reads`); :mod:`headlens.atlas.describe` writes one paragraph per head
from the measured evidence and scores the rule it names on held-out text; :mod:`headlens.atlas.site`
writes the static HTML atlas. Writes and DLA come from :mod:`headlens.readout` (never restated here).
"""

from headlens.atlas.describe import Description, describe
from headlens.atlas.exemplars import AtlasConfig, Exemplars, exemplar_pass

__all__ = ["AtlasConfig", "Description", "Exemplars", "describe", "exemplar_pass"]
