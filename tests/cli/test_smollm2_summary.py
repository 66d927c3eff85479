"""On the real SmolLM2-135M: ``headlens classify``'s default summary fits a screen and names the induction,
previous-token and duplicate-token heads that an independent census finds.

The census is plain ``transformers`` with eager attention (``output_attentions=True``) on probes drawn
here, not headlens' numbers read back. Probes are small (CI time): 10 prompts of 32 tokens per probe.
"""

from __future__ import annotations

import io
import re
import warnings

import torch
from rich.console import Console

import headlens

SEG = 20  # census repeats: BOS + r + r, |r| = 20
DEFAULT_BUT_BRACKETS = ("previous_token,current_token,first_token,duplicate_token,induction,ov_copying,coreference,"
                        "name_mover,negative_name_mover")


def _census(model) -> dict[str, torch.Tensor]:
    """``(L, H)`` mean attention on each type's target, from transformers' own eager attentions."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model.source["cache"], attn_implementation="eager",
                                              torch_dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(7)
    r = torch.stack([1000 + torch.randperm(30000, generator=gen)[:SEG] for _ in range(8)])  # (8, SEG) ordinary ids
    bos = torch.full((8, 1), model.bos_token_id)
    with torch.no_grad():
        rep = torch.stack(hf(torch.cat([bos, r, r], 1), output_attentions=True).attentions)  # (L, B, H, T, T)
        rnd = torch.stack(hf(torch.cat([bos, r], 1), output_attentions=True).attentions)  # (L, B, H, T', T')
    q = torch.arange(SEG + 2, 2 * SEG + 1)  # rows of the second copy that have an earlier copy to read
    t = torch.arange(1, SEG + 1)  # every row after BOS
    return {"induction": rep[..., q, q - SEG + 1].mean((1, 3)),  # the token after the earlier copy
            "duplicate_token": rep[..., q, q - SEG].mean((1, 3)),  # the earlier copy itself
            "previous_token": rnd[..., t, t - 1].mean((1, 3))}


def _listed(summary: str) -> dict[str, list[tuple[int, int]]]:
    """The summary's heads per type (a type's row, then its continuation rows), up to the grid."""
    out: dict[str, list[tuple[int, int]]] = {}
    current = None
    for line in summary.splitlines():
        if re.match(r"\s*L\d+\s", line):
            break
        if m := re.match(r"\s*([a-z_]+)\b", line):
            current = m.group(1)
        if current and (h := re.search(r"\bL(\d+)H(\d+)\b", line)):
            out.setdefault(current, []).append((int(h.group(1)), int(h.group(2))))
    return out


def test_the_default_summary_fits_a_screen_and_names_the_real_heads(smollm2):
    from headlens.cli.summary import print_summary

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dequantized-model note
        # the default detectors that have targets here (brackets and streaming find none: skipped by default)
        table = headlens.classify(smollm2, detectors=DEFAULT_BUT_BRACKETS, n_prompts=10, seq_len=32, n_boot=200)
    assert table.attrs["skipped"] == {}
    buf = io.StringIO()
    print_summary(table, Console(file=buf, width=200))
    summary = buf.getvalue()
    assert len(summary.splitlines()) <= 60, summary
    listed = _listed(summary)
    census = _census(smollm2)
    for det in ("induction", "previous_token", "duplicate_token"):
        H = census[det].shape[1]
        top = [divmod(int(i), H) for i in census[det].flatten().argsort(descending=True)[:3]]
        assert listed[det][0] in top, (det, listed[det], top, summary)  # the summary's best: a census top-3 head
        assert top[0] in listed[det], (det, listed[det], top, summary)  # the census' best: in the summary
        rest = table[(table.detector == det)].set_index(["layer", "head"]).loc[listed[det][0], "rest"]
        assert 0 <= rest <= 1  # shown beside it
