"""The doctor: catch silent multi-head bugs in attention modules and checkpoints.

``check_attention(module, d_model=..., n_heads=...)`` names the bug in a hand-written
attention; ``check_checkpoint(path)`` infers the head count a checkpoint was trained with.
"""

from headlens.doctor.attention import check_attention
from headlens.doctor.checkpoint import check_checkpoint

__all__ = ["check_attention", "check_checkpoint"]
