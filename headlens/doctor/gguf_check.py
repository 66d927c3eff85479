"""The doctor on a GGUF file (``smollm2``, ``gguf:PATH``, ``*.gguf``): first what its header and tensor table fix
(:mod:`headlens.doctor.shapes`: a per-head q/k norm decides with nothing dequantized), else the loss race on
the Hugging Face directory transformers dequantizes it into (cached), with every layout of a llama file tried
as if the header had said it (:func:`headlens.doctor.families.gguf_rows`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from headlens.doctor.report import CheckpointReport

GGUF_PERMUTED = ("llama",)  # GGUF architectures whose q/k rows transformers un-permutes with the header's heads


def check_gguf(gguf: Path, kw: dict[str, Any]) -> CheckpointReport:
    """The doctor on the Hugging Face directory transformers dequantized ``gguf`` into (cached); for a llama
    GGUF every layout is tried as if the file's header had said it (the header's head counts decide how
    the reader un-permuted the query/key rows: :func:`headlens.doctor.families.gguf_rows`)."""
    from headlens.doctor.families import FAMILY_MARGIN
    from headlens.doctor.family_check import check_family
    from headlens.models.hf.gguf import converted, dequantized_note

    if (shaped := shape_verdict(gguf, kw)) is not None:
        return shaped
    folder, info = converted(gguf)
    margin = FAMILY_MARGIN if kw["margin"] is None else kw["margin"]
    permuted = info.architecture in GGUF_PERMUTED
    report = check_family(folder, kw["n_heads"], kw["candidates"], margin, kw["z_min"], kw["n_rows"], kw["seq_len"],
                          kw["seed"], kw["texts"], time.perf_counter(), kw["progress"], kw["all_sources"], permuted,
                          info.path.name)
    report.path, report.format, report.file = str(info.path), "gguf", {**info.provenance(), "cache": str(folder)}
    report.notes = [dequantized_note(info.path.name, info), *report.notes]
    if permuted:
        report.notes.append("the config is the file's header: each other layout was tried with the query/key rows "
                            "a header saying it would have given (llama.cpp interleaves them per head)")
    return report


def shape_verdict(gguf: Path, kw: dict[str, Any]) -> CheckpointReport | None:
    """The verdict of a GGUF's tensor shapes and header (:mod:`headlens.doctor.shapes`), read before the file is
    converted; None when they do not decide (the converted model's losses do)."""
    from headlens.doctor.family_check import shape_report
    from headlens.doctor.shapes import gguf_header, header_evidence
    from headlens.models.hf.gguf import sha256_of
    from headlens.models.hf.gguf_file import check_magic, inspect_file, require_gguf

    t0 = time.perf_counter()
    require_gguf()
    check_magic(gguf)
    info = inspect_file(gguf, sha256_of(gguf))  # one-line refusals of a file that is not a usable GGUF
    header = gguf_header(gguf, info.architecture)
    ev = header_evidence(header) if header is not None else None
    if header is None or ev is None or (not ev.decisive and ev.layout == header.layout):
        return None
    report = shape_report(str(info.path), "gguf", info.architecture, header.d_model, header.layout, kw["n_heads"],
                          ev, t0, said_by="the file's header")
    report.file = info.provenance()
    report.notes = ["read from the file's header and tensor table: nothing was dequantized"]
    return report
