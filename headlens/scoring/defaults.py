"""The default scan, defined once: ``headlens classify``, :func:`headlens.classify`, the dashboard and the
zoo's shipped score tables all use these, so every view of a model shows the same labels.

Light on purpose (no torch): the CLI's help and the dashboard import it before anything heavy.
"""

from __future__ import annotations

N_PROMPTS = 64  # prompts per generated probe: enough for L2H3 of induction-2l to pass the label rule
SEQ_LEN = 64  # tokens per generated prompt (capped by the model's context)
BATCH_SIZE = 32  # prompts per forward pass
SEED = 0  # seeds the probes and the bootstrap
SCAN_PATH = "auto"  # dense for short prompts, sparse (q, k, log-sum-exp) for long ones
SCAN_PATHS = ("auto", "dense", "sparse")
