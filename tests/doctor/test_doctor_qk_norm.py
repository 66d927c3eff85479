"""The doctor on QK-norm and wide-head families (heads wider than d_model / n_heads): the weight shapes fix the layout.

A per-head q/k norm (Qwen3, Gemma 3) has ``head_dim`` entries, so the weights say how ``q_proj``'s rows split
into heads. The subjects are tiny random Qwen3 directories (4 query heads of width 32 on 2 key/value heads,
d_model 64: heads wider than d_model / n_heads) and Gemma 3 GGUF files (4 heads of width 32 on one), honest and
with a config or header that lies. Random weights are enough: no text is read. That no forward pass ran is
checked by a global forward hook on every ``torch.nn.Module``, and that no model was built by making
``families.build`` fail.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from headlens.cli import app
from headlens.doctor.families import HeadLayout
from headlens.doctor.shapes import implied_layout
from headlens.doctor.verdict import Source, TextFit, Verdict, inconclusive_reason
from tests.gguf_files import tiny_model, write_gguf
from tests.hf_families import build

runner = CliRunner()
COUNT_LIE = {"num_attention_heads": 8}  # q_proj's 128 rows would be 8 heads of width 16, but head_dim says 32
WIDTH_LIE = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}  # every projection still fits


@pytest.fixture(scope="module")
def subjects(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qk_norm")
    honest = build("qwen3", root / "qwen3")
    out = {"hf": honest}
    for name, fields in (("hf-count-lie", COUNT_LIE), ("hf-width-lie", WIDTH_LIE)):
        out[name] = shutil.copytree(honest, root / name)
        config = json.loads((out[name] / "config.json").read_text())
        (out[name] / "config.json").write_text(json.dumps({**config, **fields}))
    model, tok = tiny_model("gemma3", head_dim=32)  # q/k norms, heads 32 wide at d_model 64
    out["gguf"] = write_gguf(model, tok, root / "gemma3.gguf", qtype="Q8_0")
    model.config.num_attention_heads = 8  # the header says 8 heads of width 32: 256 query rows, the file has 128
    out["gguf-count-lie"] = write_gguf(model, tok, root / "gemma3-lie.gguf", qtype="Q8_0")
    return out


def _doctor(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, int]:
    """``headlens doctor PATH`` in-process: exit code, everything printed, and how many module forwards ran."""
    import headlens.doctor.families as families

    def no_build(*args, **kwargs):
        raise AssertionError("the doctor built a model: the weight shapes should have decided")

    monkeypatch.setattr(families, "build", no_build)
    forwards = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: forwards.append(type(m)))
    try:
        result = runner.invoke(app, ["doctor", str(path)])
    finally:
        handle.remove()
    return result.exit_code, result.output + (result.stderr or ""), len(forwards)


@pytest.mark.parametrize("name", ["hf", "gguf"])
def test_an_honest_qk_norm_model_passes_on_its_weight_shapes(subjects, monkeypatch, name):
    code, out, forwards = _doctor(subjects[name], monkeypatch)
    assert code == 0 and "checkpoint check: PASSED" in out, out
    norm = "model.layers.0.self_attn.q_norm.weight" if name == "hf" else "blk.0.attn_q_norm.weight"
    assert f"{norm} has 32 entries: heads are 32 wide" in out and "from the weight shapes" in out
    assert forwards == 0 and "Reinit" not in out and "LOAD REPORT" not in out


@pytest.mark.parametrize("name,said", [("hf-count-lie", "the config's 8 heads of width 32"),
                                       ("hf-width-lie", "the config's 2 heads of width 64"),
                                       ("gguf-count-lie", "the file's header's 8 heads of width 32")])
def test_a_config_that_lies_is_a_finding_naming_the_tensor_before_any_forward(subjects, monkeypatch, name, said):
    code, out, forwards = _doctor(subjects[name], monkeypatch)
    assert code == 8 and "checkpoint check: FAILED" in out, out
    rows = "attn_q's 128 rows are 4 heads" if name.startswith("gguf") else "q_proj's 128 rows are 4 heads"
    assert "q_norm.weight has 32 entries: heads are 32 wide" in out and rows in out and f"not {said}" in out
    assert forwards == 0 and "Reinit" not in out and "do not load" not in out


def test_transformers_alone_cannot_hold_the_lying_width(subjects):
    """The reference without the doctor: the width lie fits every projection, and only q_norm gives it away."""
    import transformers

    with pytest.raises(RuntimeError, match=r"size mismatch|ignore_mismatched_sizes"):
        transformers.AutoModelForCausalLM.from_pretrained(subjects["hf-width-lie"])


def test_a_layout_that_cannot_hold_the_weights_is_refused_silently(subjects, capfd):
    from headlens.doctor.families import build as build_layout
    from headlens.doctor.families import read_config

    cfg = read_config(subjects["hf"])
    assert build_layout(subjects["hf"], cfg, HeadLayout(4, 2, 32)) is not None
    for wrong in (HeadLayout(2, 1, 64), HeadLayout(8, 4, 16), HeadLayout(8, 2, 32)):  # reinit q_norm, or q_proj
        assert build_layout(subjects["hf"], cfg, wrong) is None
    printed = "".join(capfd.readouterr())
    assert "Reinit" not in printed and "LOAD REPORT" not in printed and "Loading weights" not in printed, printed


def _layer(**shapes: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    return {f"model.layers.0.self_attn.{k.replace('__', '.')}": v for k, v in shapes.items()}


@pytest.mark.parametrize("shapes,layout", [
    (_layer(q_proj__weight=(2048, 1024), k_proj__weight=(1024, 1024), q_norm__weight=(128,)), (16, 8, 128)),
    (_layer(q_proj__weight=(64, 64), k_proj__weight=(32, 64), q_norm__weight=(4, 16)), (4, 2, 16)),  # Cohere
    ({**_layer(q_proj__weight=(64, 64), k_proj__weight=(32, 64)),  # StableLM: one norm per head
      **{f"model.layers.0.self_attn.q_layernorm.norms.{h}.weight": (16,) for h in range(4)}}, (4, 2, 16)),
    (_layer(q_proj__weight=(64, 64), k_proj__weight=(16, 64), sinks=(8,)), (8, 2, 8)),  # attention sinks
    (_layer(q_proj__weight=(64, 64), k_proj__weight=(32, 64), q_norm__weight=(64,), k_norm__weight=(32,)), None),
    (_layer(q_proj__weight=(64, 64), k_proj__weight=(32, 64)), None),  # Llama: only the products are fixed
])
def test_which_shapes_fix_the_layout(shapes, layout):
    ev = implied_layout(shapes)
    assert (None if ev is None else (ev.layout.n_heads, ev.layout.n_kv_heads, ev.layout.d_head)) == layout


def test_the_findings_line_names_the_tensor_and_the_implied_layout():
    ev = implied_layout(_layer(q_proj__weight=(2048, 1024), k_proj__weight=(1024, 1024), q_norm__weight=(128,)))
    assert ev.finding(HeadLayout(8, 8, 128)).startswith(
        "model.layers.0.self_attn.q_norm.weight has 128 entries: heads are 128 wide, so q_proj's 2048 rows are "
        "16 heads and k_proj's 1024 rows 8 key/value heads, not the config's 8 heads of width 128")


def _source(losses: dict[int, float], plausible: list[int], fits: bool, margin: float = 0.1) -> Source:
    gaps = {h: loss - min(losses.values()) for h, loss in losses.items()}
    v = Verdict(losses, dict.fromkeys(losses, 1.0), min(losses, key=losses.get), plausible, plausible[0], gaps,
                dict.fromkeys(losses, 8))
    fit = TextFit(0.0, 200, 3.76, 6.2, [] if fits else ["the model predicts it no better than chance"])
    return Source("text", "prose", v, "inconclusive", 0.0, fit, "", margin)


def test_inconclusive_advice_follows_from_the_reason():
    alone = inconclusive_reason([_source({4: 3.76}, [4], fits=True)])
    assert "nothing to compare" in alone and "--text" not in alone
    close = inconclusive_reason([_source({4: 3.76, 2: 3.80}, [2, 4], fits=True)])
    assert "predicts the text (3.760 vs 6.200" in close and "--text" not in close and "--rows" not in close
    noisy = inconclusive_reason([_source({4: 3.76, 2: 4.26}, [2, 4], fits=True)])  # 0.5 nats, within the noise
    assert "--rows" in noisy and "--text" not in noisy
    assert "--text" in inconclusive_reason([_source({4: 5.0, 2: 5.01}, [2, 4], fits=False)])


def test_progress_lines_say_the_fraction_done_and_the_time_left(monkeypatch):
    import headlens.cli.progress as progress

    monkeypatch.setattr(progress, "QUIET_START_S", 0.0)  # the tiny run ends within the quiet start otherwise
    copier = Path(__file__).parents[1] / "data" / "doctor" / "copier"
    result = runner.invoke(app, ["doctor", str(copier), "--rows", "8", "--seq-len", "32"])
    lines = [ln for ln in (result.stderr or result.output).splitlines()
             if ln.startswith("headlens: doctor (")]  # the layouts' lines (before them: loading)
    assert result.exit_code in (0, 8, 9) and len(lines) >= 2, result.output
    assert all("%" in ln and " s elapsed" in ln for ln in lines), lines
    # the totals are bounds: a time left, where a line has one (a fast run may print each phase's first report
    # only, before any pace is known), is "at most"
    assert all(re.search(r"elapsed, at most [^,]+ left$", ln) for ln in lines if " left" in ln), lines
    assert not any("about" in ln for ln in lines), lines


def test_a_width_no_tensor_fixes_that_cannot_load_names_the_projection(tmp_path):
    """A Llama (no per-head tensor) whose config says heads of width 32 where q_proj holds 4 heads of 16: the
    shapes fix no layout, the config's cannot load, and the one line says which rows it lacks."""
    out = shutil.copytree(Path(__file__).parents[1] / "data" / "doctor" / "llama", tmp_path / "llama-wide")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "head_dim": 32}))
    result = runner.invoke(app, ["doctor", str(out)])
    assert result.exit_code == 3 and "LOAD REPORT" not in result.output, result.output
    assert "q_proj.weight has 64 rows, where 4 heads of width 32 need 128" in result.stderr
