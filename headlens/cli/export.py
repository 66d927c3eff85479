"""``headlens export-hf``: write a native model as a Hugging Face GPT-2 directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("export-hf")
    def export_hf_cmd(
        model: Annotated[str, typer.Option("--model", "-m", help="zoo name or path to a headlens .safetensors")],
        out: Annotated[Path, typer.Option("--out", "-o", help="directory to write (created)")],
    ) -> None:
        """Export to a Hugging Face GPT-2 directory that transformers and TransformerLens load offline.

        The export computes the same logits and patterns (checked before writing; an export that
        would not is refused with an error)."""
        from headlens.errors import ModelReferenceError
        from headlens.models.export import export_hf
        from headlens.models.gpt import GPT
        from headlens.models.loading import load

        loaded = load(model)
        if not isinstance(loaded, GPT):
            raise ModelReferenceError(f"{model!r} is not a native headlens model; only those can be exported")
        path = export_hf(loaded, out)
        typer.echo(f"wrote {path} (load with hf:{path})")
