"""The model zoo: small models trained by headlens' own recipes, shipped in the package.

Each entry names its weights under ``headlens/zoo/weights/`` and the heads its model card says
it contains. ``headlens.load(name)`` resolves these names. Two formats:

* ``headlens``: a native checkpoint ``<name>.safetensors`` (the GPT-2-style models);
* ``hf``: a Hugging Face directory ``<name>/`` (config.json, model.safetensors, tokenizer files),
  booted through TransformerBridge like any ``hf:<dir>`` (the Llama-architecture model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

HF_WEIGHTS = "model.safetensors"  # the weights file of an "hf" entry's directory


@dataclass(frozen=True)
class ZooEntry:
    """One bundled model."""

    name: str  # the reference users type: headlens.load("induction-2l")
    file: str  # checkpoint file (format "headlens") or directory (format "hf") under headlens/zoo/weights/
    description: str  # one line for `headlens models`
    known_heads: dict[str, list[str]] = field(default_factory=dict)  # detector -> ["L1H2", ...]
    known_seq_len: int = 0  # classify's seq_len for known_heads (0: its default); long-context models
    # heads classify labels on real Python source (corpus="stdlib", seq_len=STDLIB_SEQ_LEN), for code models
    stdlib_heads: dict[str, list[str]] = field(default_factory=dict)
    snapshots: str = ""  # folder of training snapshots under weights/, if shipped
    format: Literal["headlens", "hf"] = "headlens"  # native checkpoint, or Hugging Face directory

    @property
    def path(self) -> Path:
        """The checkpoint file, or for an ``hf`` entry its directory (what ``hf:<dir>`` would name)."""
        return weights_dir() / self.file

    @property
    def weights_file(self) -> Path:
        """The one file holding the weights (the checkpoint, or the directory's model.safetensors)."""
        return self.path / HF_WEIGHTS if self.format == "hf" else self.path

    @property
    def available(self) -> bool:
        if self.format == "hf":
            return (self.path / "config.json").is_file() and self.weights_file.is_file()
        return self.path.is_file()

    @property
    def size_bytes(self) -> int:
        """Bytes on disk (every file of an ``hf`` directory)."""
        if self.format == "hf":
            return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())
        return self.path.stat().st_size

    @property
    def snapshot_files(self) -> list[Path]:
        """The shipped training snapshots (``step_XXXXX.safetensors``), in step order."""
        if not self.snapshots:
            return []
        return sorted((weights_dir() / self.snapshots).glob("step_*.safetensors"))

    @property
    def card(self) -> Path:
        """The model card (markdown) written by ``headlens.training.ship``."""
        return cards_dir() / f"{self.name}.md"


def weights_dir() -> Path:
    return Path(str(resources.files("headlens.zoo") / "weights"))


def cards_dir() -> Path:
    """Where the model cards live (``<name>.md`` for people, ``<name>.json`` for the tests)."""
    return Path(str(resources.files("headlens.zoo") / "cards"))


# One entry per shipped model; known_heads are the heads its model card measured
# (cards/<name>.md, written by headlens.training.ship; tests/training/test_zoo.py re-measures them).
ZOO: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in (
        ZooEntry(
            name="induction-2l",
            file="induction-2l.safetensors",
            description="attention-only 2 layers x 4 heads, letters/digits/space; a textbook induction "
            "circuit: previous-token head L0H0 feeds induction head L1H1 (repeated half 0.72 vs 4.15 nats)",
            known_heads={"previous_token": ["L0H0"], "induction": ["L1H1"]},
            snapshots="induction-2l-snapshots",
        ),
        ZooEntry(
            name="llama-induction",
            file="llama-induction",
            format="hf",
            description="Hugging Face LlamaForCausalLM (2 layers, 4 query / 2 key-value heads, RoPE, RMSNorm, "
            "SwiGLU), byte-level, booted through TransformerBridge: induction heads in all of layer 1 fed by "
            "the previous-token pair L0H0+L0H1 (key-value group 0; 0.38/0.40, under the label bar); "
            "repeated half 1.72 vs 5.59 nats",
            known_heads={"induction": ["L1H0", "L1H1", "L1H2", "L1H3"]},
        ),
        ZooEntry(
            name="needle-2k",
            file="needle-2k",
            format="hf",
            description="long-context Llama (3 layers, 4 query / 2 key-value heads, RoPE base 5M, n_ctx 2048), "
            "byte-level, trained to copy needles out of random haystacks: retrieval heads L1H0-L1H3 "
            "(Wu et al. 2024; 0.72-0.76 at 2,048 tokens) fed by previous-token heads in layer 0; needle "
            "recall 0.98 at 1,024 tokens, 0.84 at 2,048",
            known_heads={"retrieval": ["L1H0", "L1H1", "L1H2", "L1H3"], "induction": ["L1H0", "L1H1", "L1H2", "L1H3"]},
            known_seq_len=2048,
        ),
        ZooEntry(
            name="code",
            file="code.safetensors",
            description="byte-level GPT-2 (3 layers x 4 heads, MLPs, LayerNorm) on the Python stdlib source; "
            "held-out 1.12 vs unigram 3.31 nats/byte; previous-token head L0H0, induction head L2H3 (also "
            "the first-token sink); on real code L2H2 attends to the bracket the next closer will close",
            known_heads={"previous_token": ["L0H0"], "induction": ["L2H3"], "first_token": ["L2H3"]},
            stdlib_heads={"open_bracket": ["L2H2"]},
        ),
        ZooEntry(
            name="dyck",
            file="dyck.safetensors",
            description="Dyck strings over ()[]{}<> with filler xyz, depth <= 8 (2 layers x 4 heads, MLPs); "
            "99.98% closing-bracket accuracy; L1H3 attends to the matching opener from the position "
            "before a closer (open_bracket, 0.64 on the hard subset), no head does so from the closer itself",
            known_heads={"open_bracket": ["L1H3"], "open_bracket_hard": ["L1H3"]},
        ),
    )
}

DEFAULT_MODEL = "code"
STDLIB_SEQ_LEN = 256  # stdlib windows the zoo's code model is checked on: its full context


def available() -> dict[str, ZooEntry]:
    """Zoo entries whose weights are present in this install."""
    return {name: entry for name, entry in ZOO.items() if entry.available}
