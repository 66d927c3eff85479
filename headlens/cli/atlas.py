"""``headlens atlas``: a static HTML atlas of every head (exemplars, reads, tested descriptions); a thin layer
over :mod:`headlens.atlas`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headlens.cli import options as opt
from headlens.cli.failure import fail
from headlens.errors import HeadlensError


def register(app: typer.Typer) -> None:
    @app.command("atlas")
    def atlas_cmd(
        model: Annotated[list[str], typer.Option("--model", "-m", help="a model reference (zoo name, path, "
                                                 "hf:ORG/NAME); repeat it for an index of several models")],
        out: Annotated[Path, typer.Option("--out", help="folder to write the site into (index.html, heads/, "
                                          "exemplars.parquet)")],
        corpus: Annotated[str, typer.Option(
            "--corpus", help="'prose', 'code', 'repeats' (random tokens with a segment repeated: any tokenizer reads "
                             "it), or a .txt / JSONL file")] = "prose",
        n_windows: Annotated[int, typer.Option("--n-windows", min=2, help="windows of text read (a quarter, at "
                                               "most 256, held out to score the descriptions)")] = 64,
        seq_len: opt.SeqLen = 128,
        k: Annotated[int, typer.Option("--k", min=1, help="exemplars kept per head and ranking")] = 20,
        batch_size: opt.BatchSize = 8,
        seed: opt.Seed = 0,
        quiet: opt.Quiet = False,
        resume: opt.Resume = None,
        device: opt.Device = "cpu",
        subst_windows: Annotated[int, typer.Option("--subst-windows", min=0, help="held-out windows the substitution "
                                                   "test runs each described head on (0: no test; each window costs "
                                                   "about 1.2 forwards per head)")] = 8,
    ) -> None:
        """Read a corpus once, keep every head's top exemplars, describe each head with a rule tested on held-out
        text, and write an offline HTML atlas (open OUT/index.html from disk)."""
        try:
            run_atlas(model, out, corpus, n_windows, seq_len, k, batch_size, seed, quiet, device, resume, subst_windows)
        except HeadlensError as e:
            raise fail(e) from None


def run_atlas(model: list[str], out: Path, corpus: str, n_windows: int, seq_len: int, k: int, batch_size: int,
              seed: int, quiet: bool, device: str, resume: Path | None = None, subst_windows: int = 8) -> None:
    """The command body: library calls only, errors left to the caller."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from headlens.atlas.build import build_atlas
    from headlens.atlas.exemplars import AtlasConfig
    from headlens.atlas.site import write_sites
    from headlens.cli.progress import progress
    from headlens.errors import OutputError
    from headlens.models.files import check_writable
    from headlens.models.loading import load
    from headlens.scoring.distributed import current

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create the atlas folder {str(out)!r} ({err.strerror})") from None
    check_writable(out / "index.html", (".html",), what="the atlas")
    config = AtlasConfig(corpus=corpus, n_windows=n_windows, seq_len=seq_len, k=k, batch_size=batch_size, seed=seed)
    rank = current()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())
    atlases = []
    for i, ref in enumerate(model):
        loaded = load(ref, device=rank.device(device))
        with progress(f"atlas of {ref}: reading the corpus", quiet=quiet or not rank.is_main, columns=columns) as bar:
            atlases.append(build_atlas(loaded, config, progress=lambda d, t: bar.update(d, t),
                                       resume=resume if resume is None or len(model) == 1 else resume / str(i),
                                       stage=lambda name, ref=ref: bar.update(0, None, description=f"atlas of {ref}: "
                                                                                                  f"{name}"),
                                       subst_windows=subst_windows))
        del loaded
    if atlases[0] is None:  # a rank other than 0 under torchrun: rank 0 writes
        return
    with progress("atlas: writing the site", total=len(atlases), quiet=quiet, columns=columns) as bar:
        bar.update(0, len(atlases))
        index = write_sites(atlases, out)
        bar.update(len(atlases), len(atlases))
    if not quiet:
        for atlas in atlases:
            roles: dict[str, int] = {}
            for d in atlas.descriptions:
                roles[d.role] = roles.get(d.role, 0) + 1
            Console(stderr=True).print(f"{atlas.model}: {', '.join(f'{r} {n}' for r, n in sorted(roles.items()))}")
            described = sum(d.described for d in atlas.descriptions)
            sub = atlas.substitution
            line = f"{atlas.model}: {described} of {len(atlas.descriptions)} heads carry a tested description"
            if sub is not None:
                line += (f"; all {sub.n_heads} substituted at once: loss {sub.all_heads:.3f} against {sub.clean:.3f} "
                         f"clean ({100 * (sub.all_heads - sub.clean) / sub.clean:+.1f} %, {sub.windows} held-out windows)")
            Console(stderr=True).print(line)
        Console(stderr=True).print(f"wrote {index} (open it from disk)")
