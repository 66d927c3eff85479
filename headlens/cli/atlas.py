"""``headlens atlas``: a static HTML atlas of every head (exemplars, reads, tested descriptions); a thin layer
over :mod:`headlens.atlas`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.cli import options as opt
from headlens.cli.failure import fail
from headlens.errors import ConfigError, HeadlensError


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
        scores: Annotated[list[Path] | None, typer.Option(
            "--scores", help="a scores table of the model (headlens classify -o scores.json), shown on each head's "
                             "page beside its atlas role; repeat it in the order of --model")] = None,
        subst_windows: Annotated[int, typer.Option("--subst-windows", min=0, help="held-out windows the substitution "
                                                   "test runs each described head on (0: no test; each window costs "
                                                   "about 1.2 forwards per head run exactly)")] = 8,
        subst: Annotated[str, typer.Option("--subst", help="which heads the substitution test puts back: 'estimate' "
                                           "(the first two layers, copy suppressors, the heads with the largest "
                                           "first-order effects and a random sample; the others get no share kept) or "
                                           "'exact' (every head)")] = "estimate",
        subst_exact: Annotated[int | None, typer.Option("--subst-exact", min=0, help="with --subst estimate: heads "
                                                        "run exactly beyond the first two layers and copy suppressors "
                                                        "(default 12)")] = None,
    ) -> None:
        """Read a corpus once, keep every head's top exemplars, describe each head with a rule tested on held-out
        text, and write an offline HTML atlas (open OUT/index.html from disk)."""
        try:
            run_atlas(model, out, corpus, n_windows, seq_len, k, batch_size, seed, quiet, device, resume, scores,
                      subst_windows, subst, subst_exact)
        except HeadlensError as e:
            raise fail(e) from None


def run_atlas(model: list[str], out: Path, corpus: str, n_windows: int, seq_len: int, k: int, batch_size: int,
              seed: int, quiet: bool, device: str, resume: Path | None = None,
              scores: list[Path] | None = None, subst_windows: int = 8, subst: str = "estimate",
              subst_exact: int | None = None) -> None:
    """The command body: library calls only, errors left to the caller."""
    if Path(corpus).is_file():  # a corpus file that is not UTF-8, or binary: refused before torch and the model
        from headlens.probes.prompt_file import read_prompts

        read_prompts(Path(corpus))
    from rich.console import Console

    from headlens.atlas.build import build_atlas
    from headlens.atlas.exemplars import AtlasConfig
    from headlens.atlas.site import write_sites
    from headlens.atlas.substitute import SUBST_MODES
    from headlens.cli.progress import progress
    from headlens.errors import OutputError
    from headlens.models.files import atomic_folder, check_writable
    from headlens.models.loading import load
    from headlens.scoring.distributed import current

    if subst not in SUBST_MODES:  # before the model loads
        raise ConfigError(f"--subst {subst!r} is not a substitution mode; expected one of {', '.join(SUBST_MODES)}")
    if scores and len(scores) != len(model):
        raise ConfigError(f"--scores given {len(scores)} times for {len(model)} models; give one per --model, in order")
    tables = [_scores(p) for p in scores] if scores else None  # read before the pass: a bad file fails at once
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create the atlas folder {str(out)!r} ({err.strerror})") from None
    check_writable(out / "index.html", (".html",), what="the atlas")
    config = AtlasConfig(corpus=corpus, n_windows=n_windows, seq_len=seq_len, k=k, batch_size=batch_size, seed=seed)
    rank = current()
    atlases = []
    for i, ref in enumerate(model):
        loaded = load(ref, device=rank.device(device))
        with progress(f"atlas of {ref}: reading the corpus", quiet=quiet or not rank.is_main) as bar:
            atlases.append(build_atlas(loaded, config, progress=lambda d, t: bar.update(d, t),
                                       resume=resume if resume is None or len(model) == 1 else resume / str(i),
                                       stage=lambda name, ref=ref: bar.update(0, None, description=f"atlas of {ref}: "
                                                                                                  f"{name}"),
                                       subst_windows=subst_windows, subst=subst, subst_exact=subst_exact))
        del loaded
    if atlases[0] is None:  # a rank other than 0 under torchrun: rank 0 writes
        return
    with progress("atlas: writing the site", total=len(atlases), quiet=quiet) as bar:
        bar.update(0, len(atlases))
        index = atomic_folder(out, lambda tmp: write_sites(atlases, tmp, tables)) / "index.html"  # whole, or the old one kept
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
                line += f"; {sub.sentence()}"
            Console(stderr=True).print(line)
        Console(stderr=True).print(f"wrote {index} (open it from disk)")


def _scores(path: Path) -> Any:
    """The scores table at ``path``, or one line saying why it cannot be read."""
    from headlens.scoring.table import read_scores

    try:
        return read_scores(path)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"--scores {str(path)!r} is not a readable headlens scores table ({err})") from None
