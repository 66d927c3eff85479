"""Options shared by the commands that load models or scale out: precision, device, remote code, resume
folder, and device maps for big models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from headlens.errors import ConfigError

Resume = Annotated[Path | None, typer.Option(
    "--resume", help="folder for finished shards: a rerun with the same arguments computes only the missing ones")]
Device = Annotated[str, typer.Option(
    "--device", help="cpu, cuda (under torchrun: each rank's own cuda:LOCAL_RANK), cuda:1, mps, or auto "
    "(a GPU when there is one)")]
Dtype = Annotated[str, typer.Option(
    "--dtype", help="float32 | bfloat16 | float16: the precision the model runs in (statistics stay float64)")]
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
