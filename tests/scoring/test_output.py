"""The one output writer: destinations checked before any work, the umask respected, provenance kept in
every format, for classify, ablate (sweep), trajectory and reports alike."""

from __future__ import annotations

import json
import os
import stat

import pandas as pd
import pytest
from typer.testing import CliRunner

from headlens.cli import app
from headlens.errors import OutputError
from headlens.models.checkpoint import save_checkpoint
from headlens.models.files import atomic_write, check_writable, file_mode
from headlens.scoring.output import read_frame, sidecar_path, write_frame
from headlens.testing import planted_model

runner = CliRunner()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(save_checkpoint(planted_model(), tmp_path_factory.mktemp("m") / "planted.safetensors"))


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o640
    os.umask(old)


def _unwritable(tmp_path) -> str:
    if os.geteuid() == 0:  # root writes through permission bits; /sys refuses even root
        return "/sys"
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return str(folder)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_get_the_umask_mode_not_0600(tmp_path, umask_027):
    assert file_mode() == umask_027
    p = atomic_write(tmp_path / "x.txt", lambda tmp: open(tmp, "w").write("x"))
    assert _mode(p) == 0o640
    os.umask(0o022)
    assert _mode(atomic_write(tmp_path / "y.txt", lambda tmp: open(tmp, "w").write("y"))) == 0o644


def test_every_output_of_a_classify_run_and_a_checkpoint_respects_the_umask(ckpt, tmp_path, umask_027):
    out, report = tmp_path / "scores.csv", tmp_path / "report.html"
    result = runner.invoke(app, ["classify", "-m", ckpt, "--n-prompts", "8", "--seq-len", "24", "-q", "-o", str(out),
                                 "--report", str(report)])
    assert result.exit_code == 0, result.output
    for path in (out, sidecar_path(out), report):
        assert _mode(path) == 0o640, path
    weights = save_checkpoint(planted_model(), tmp_path / "w.safetensors")
    assert _mode(weights) == 0o640  # exported / trained weights too


def test_an_unwritable_folder_fails_before_the_scan(ckpt, tmp_path, monkeypatch):
    import headlens.scoring.classification as classification

    def no_scan(*args, **kwargs):
        raise AssertionError("the scan ran before the destination was checked")

    monkeypatch.setattr(classification, "classify", no_scan)
    target = _unwritable(tmp_path)
    for args in (["-o", f"{target}/scores.csv"], ["--report", f"{target}/report.html"]):
        result = runner.invoke(app, ["classify", "-m", ckpt, *args])
        assert result.exit_code == 7, result.output
        assert result.stderr.count("\n") == 1 and "not writable" in result.stderr
        assert "Traceback" not in result.output
    with pytest.raises(OutputError, match="not writable"):
        check_writable(f"{target}/x.csv", (".csv",))


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_provenance_survives_every_format(tmp_path, suffix):
    df = pd.DataFrame({"model": ["m"], "heads": ["L0H1"], "delta": [0.25]})
    df.attrs.update({"headlens_version": "9", "seed": 3, "metrics": ["kl"]})
    path = write_frame(df, tmp_path / f"t{suffix}")
    back = read_frame(path)
    assert back.to_dict("records") == df.to_dict("records")
    assert back.attrs == {"headlens_version": "9", "seed": 3, "metrics": ["kl"]}
    if suffix == ".json":
        assert set(json.loads(path.read_text())) == {"provenance", "rows"}
    if suffix == ".csv":
        assert json.loads(sidecar_path(path).read_text())["headlens"]["seed"] == 3
        assert path.read_text().splitlines()[0] == "model,heads,delta"  # the CSV itself stays plain


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_ablate_writes_a_model_column_and_provenance(ckpt, tmp_path, suffix):
    out = tmp_path / f"ablate{suffix}"
    result = runner.invoke(app, ["ablate", "-m", ckpt, "--heads", "L1H0", "--n-prompts", "4", "--n-control", "2",
                                 "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    back = read_frame(out)
    assert list(back.columns)[:2] == ["model", "heads"] and set(back["model"]) == {"planted"}
    prov = back.attrs
    assert prov["model"] == "planted" and prov["method"] == "zero" and prov["metrics"] == ["repeated_loss"]
    assert prov["n_prompts"] == 4 and prov["seed"] == 0 and "headlens_version" in prov


def test_sweep_and_trajectory_tables_carry_provenance(ckpt, tmp_path):
    import headlens

    table = headlens.sweep(headlens.load(ckpt), groups=["L0H0"], n_prompts=4, n_control=1, n_boot=50)
    assert table.attrs["model"] == "planted" and table.attrs["table"] == "ablation sweep"
    out = tmp_path / "series.parquet"
    result = runner.invoke(app, ["trajectory", "--models", ckpt, "-d", "previous_token", "--n-prompts", "4",
                                 "--seq-len", "16", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    back = read_frame(out)
    assert back.attrs["model"] == "planted" and back.attrs["checkpoints"][0]["ref"] == ckpt


def test_the_report_embeds_machine_readable_provenance(ckpt, tmp_path):
    from headlens.viz.report import PROVENANCE_TAG

    report = tmp_path / "r.html"
    result = runner.invoke(app, ["classify", "-m", ckpt, "--n-prompts", "8", "--seq-len", "24", "-q", "--report",
                                 str(report)])
    assert result.exit_code == 0, result.output
    page = report.read_text()
    prov = json.loads(page.split(PROVENANCE_TAG)[1].split("</script>")[0])
    assert prov["model"] == "planted" and prov["seed"] == 0 and prov["probes"]
