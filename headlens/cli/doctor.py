"""``headlens doctor CHECKPOINT``: infer the head count a checkpoint was trained with; exit 8 on a mismatch,
9 when no evaluation source can tell the head layouts apart (inconclusive, never passed)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

EXIT_PROBLEM = 8  # cli/__init__.py: "8 doctor found a problem"
EXIT_INCONCLUSIVE = 9  # cli/__init__.py: "9 doctor inconclusive (no evidence either way)"


def _resolve(ref: str) -> Path:
    """A zoo name, ``smollm2``, ``gguf:PATH``, a .gguf, .safetensors file or a Hugging Face directory
    (``hf:<dir>``) -> a path (a GGUF file is converted by the doctor itself)."""
    from headlens.errors import ModelReferenceError
    from headlens.models.hf.gguf import parse_reference
    from headlens.zoo import ZOO

    if ref in ZOO:
        return ZOO[ref].path
    if not ref.startswith("hf:") and (gguf := parse_reference(ref)) is not None:
        if gguf.is_file():  # a torn header: refused before torch loads and before the cache is touched
            from headlens.models.hf.gguf_file import read_header

            read_header(gguf)
        return gguf  # a missing file, or no gguf package, is one line from the converter
    path = Path(ref[3:] if ref.startswith("hf:") else ref).expanduser()
    if path.is_file() and path.suffix == ".safetensors":  # a corrupt header: refused before torch loads
        from headlens.models.safetensors_file import read_safetensors_header

        read_safetensors_header(path)
    if not path.exists():
        raise ModelReferenceError(f"{ref!r} is neither a zoo name ({', '.join(sorted(ZOO)) or 'none installed'}), "
                                  f"smollm2 nor an existing checkpoint file, GGUF file or Hugging Face directory")
    return path


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(
        checkpoint: Annotated[str, typer.Argument(help="headlens .safetensors, Hugging Face dir (GPT-2, Llama, Mistral, Qwen2, Gemma, GPT-NeoX ...), GGUF file (x.gguf, gguf:PATH, smollm2) or zoo name")],
        n_heads: Annotated[
            int | None, typer.Option("--n-heads", help="the head count you mean to use (default: the config's)")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
        text: Annotated[Path | None, typer.Option("--text", help="evaluation text file, one row per line")] = None,
        seed: Annotated[int, typer.Option("--seed", help="seed of the generated evaluation text")] = 0,
        rows: Annotated[int | None, typer.Option(
            "--rows", help="rows of each generated source (default: sized to the model, 48 for small ones, "
                           "16 for a 135M LM)")] = None,
        seq_len: Annotated[int | None, typer.Option(
            "--seq-len", help="tokens per generated row, capped at n_ctx (default: sized to the model, 512 for "
                              "small ones, 64 for a 135M LM)")] = None,
        all_sources: Annotated[bool, typer.Option(
            "--all-sources", help="run every source, even after one that fits the model has decided")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress")] = False,
    ) -> None:
        """Check that a checkpoint's head count is the one its weights were trained with.

        Where the weight shapes fix the layout (a per-head q/k norm as in Qwen3 and Gemma 3, Cohere's and
        StableLM's per-head norms, attention sinks), it is read from them before anything runs, and a config
        that says otherwise fails naming the tensor. Otherwise it loads the weights split into every head layout their shapes allow (every divisor of d_model
        for GPT-2; query heads, key/value heads and head width for other families) and measures the
        loss of each on several sources: a text (--text, else the recipe's data, English prose for a
        word-piece tokenizer, Python source for a byte-level one), checked first for fit (unknown tokens,
        distinct tokens, loss vs a unigram model of the text), and random segments of distinct token ids
        repeated at several periods. Layouts clearly worse after 8 rows stop running. The verdict comes
        from a source that separates the layouts. A GGUF file is checked as the Hugging Face directory
        transformers dequantizes it into (once, cached under HEADLENS_CACHE or ~/.cache/headlens).

        Exit codes: 0 passed (config, --n-heads and weights agree); 8 failed (they do not, by the weight
        shapes or by the losses);
        9 inconclusive (no source separates the layouts: untrained weights, or text the model does not
        predict; never reported as passed).
        """
        import json

        from headlens.errors import ConfigError
        from headlens.probes.prompt_file import read_prompts

        texts = read_prompts(text) if text is not None else None  # not UTF-8, binary: one line, before torch
        if (rows is not None and rows < 2) or (seq_len is not None and seq_len < 2):
            raise ConfigError(f"--rows and --seq-len must be >= 2, got {rows} and {seq_len}")
        path = _resolve(checkpoint)
        from headlens.cli.progress import progress
        from headlens.doctor import check_checkpoint

        with progress("doctor: reading the checkpoint", quiet=quiet, at_most=True) as bar:  # the totals are upper bounds
            report = check_checkpoint(
                path, n_heads=n_heads, seed=seed, texts=texts, n_rows=rows, seq_len=seq_len, all_sources=all_sources,
                progress=bar.update)
        typer.echo(json.dumps(report.to_dict(), indent=2) if as_json else str(report))
        if report.verdict == "inconclusive":
            raise typer.Exit(code=EXIT_INCONCLUSIVE)
        if not report.passed:
            raise typer.Exit(code=EXIT_PROBLEM)
