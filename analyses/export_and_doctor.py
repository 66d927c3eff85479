"""Two checks on every zoo model: export-hf parity of every zoo model, doctor verdicts per family.

    python analyses/export_and_doctor.py            # both tables (about a minute on one core)
    python analyses/export_and_doctor.py export     # only the export parity
    python analyses/export_and_doctor.py doctor     # only the doctor verdicts

Export: each zoo model is written with ``headlens export-hf``'s function, booted through
TransformerBridge (``headlens.load("hf:<dir>")``) and compared with headlens' own model on 2 x 48
random tokens: max |logit diff| and max |hook_pattern diff| over every layer (tests require <= 1e-4
and <= 1e-5). Doctor: ``check_checkpoint`` on each trained fixture of ``tests/data/doctor/`` and on a
copy whose config.json claims each lie of ``tests/doctor/test_doctor_families.py`` (48 rows of 64 tokens).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch

import headlens

ROOT = Path(__file__).resolve().parents[1]


def export_parity(name: str, out: Path) -> tuple[float, float, float]:
    from headlens.models.export import export_hf

    model = headlens.load(name)
    bridge = headlens.load(f"hf:{export_hf(model, out / name)}")
    tokens = torch.randint(0, model.tokenizer.d_vocab - 1, (2, min(48, model.cfg.n_ctx)),
                           generator=torch.Generator().manual_seed(1))  # (2, T)
    tokens[:, 0] = model.bos_token_id
    wanted = lambda n: n.endswith("attn.hook_pattern")  # noqa: E731
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=wanted)
        ref_logits, ref_cache = bridge.run_with_cache(tokens, names_filter=wanted)
    pattern = max(float((ref_cache[n] - cache[n]).abs().max()) for n in cache)
    return float((ref_logits - logits).abs().max()), float(logits.abs().max()), pattern


def doctor_rows(out: Path) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from headlens.doctor import check_checkpoint
    from tests.doctor.test_doctor_families import DATA, LIES

    rows = []
    for family, lies in LIES.items():
        cases = [("honest", DATA / family)]
        for fields in lies:
            path = out / f"{family}-{fields['num_attention_heads']}"
            shutil.copytree(DATA / family, path)
            config = json.loads((path / "config.json").read_text())
            (path / "config.json").write_text(json.dumps({**config, **fields}))
            cases.append(("lie " + "/".join(str(v) for v in fields.values()), path))
        for what, path in cases:
            r = check_checkpoint(path, n_rows=48, seq_len=64)
            ev = {e.n_heads: e for e in r.evidence}
            c, i = ev[r.config_n_heads], ev[r.inferred_n_heads]
            rows.append(f"| {family} | {what} | ({c.n_heads},{c.n_kv_heads},{c.d_head}) {c.loss:.3f} | "
                        f"({i.n_heads},{i.n_kv_heads},{i.d_head}) {i.loss:.3f} | "
                        f"{ {'passed': 'PASS (exit 0)', 'failed': 'FAIL (exit 8)'}.get(r.verdict, 'INCONCLUSIVE (exit 9)')} |")
    return rows


def main() -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    which = sys.argv[1:] or ["export", "doctor"]
    with tempfile.TemporaryDirectory() as tmp:
        if "export" in which:
            print("| zoo model | max abs logit diff (max abs logit) | max abs hook_pattern diff |\n|---|---|---|")
            for name in ("induction-2l", "dyck", "code"):
                d_logit, scale, d_pattern = export_parity(name, Path(tmp))
                print(f"| {name} | {d_logit:.2e} ({scale:.1f}) | {d_pattern:.2e} |", flush=True)
        if "doctor" in which:
            print("| family | config | config layout (H, H_kv, dh) loss | inferred layout loss | verdict |\n"
                  "|---|---|---|---|---|")
            for row in doctor_rows(Path(tmp)):
                print(row, flush=True)


if __name__ == "__main__":
    main()
