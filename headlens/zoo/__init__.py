"""The model zoo: small models trained by headlens' own recipes, shipped in the package.

Each entry names a safetensors checkpoint under ``headlens/zoo/weights/`` and the
heads its model card says it contains. ``headlens.load(name)`` resolves these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class ZooEntry:
    """One bundled model."""

    name: str  # the reference users type: headlens.load("induction-2l")
    file: str  # checkpoint file name under headlens/zoo/weights/
    description: str  # one line for `headlens models`
    known_heads: dict[str, list[str]] = field(default_factory=dict)  # detector -> ["L1H2", ...]
    snapshots: str = ""  # folder of training snapshots under weights/, if shipped

    @property
    def path(self) -> Path:
        return weights_dir() / self.file

    @property
    def available(self) -> bool:
        return self.path.is_file()

    @property
    def snapshot_files(self) -> list[Path]:
        """The shipped training snapshots (``step_XXXXX.safetensors``), in step order."""
        if not self.snapshots:
            return []
        return sorted((weights_dir() / self.snapshots).glob("step_*.safetensors"))

    @property
    def card(self) -> Path:
        """The model card (markdown) written by ``headlens.zoo.ship``."""
        return Path(__file__).parent / "cards" / f"{self.name}.md"


def weights_dir() -> Path:
    return Path(str(resources.files("headlens.zoo") / "weights"))


# Filled in by the zoo recipes as their models are trained and shipped.
ZOO: dict[str, ZooEntry] = {}

DEFAULT_MODEL = "code"


def available() -> dict[str, ZooEntry]:
    """Zoo entries whose weights are present in this install."""
    return {name: entry for name, entry in ZOO.items() if entry.available}
