"""Scale-out (TESTING.md "Distributed scans"): torchrun ranks equal one process, errors end every rank,
a SIGKILLed ``--resume`` run resumes to the identical table.

Each torchrun start costs seconds of imports, so one 2-rank gloo job (``torchrun --standalone``: no
fixed port) runs classify (through the CLI, with ``--resume``), a sweep and a trajectory, and the tests
compare its files with the same calls made here in one process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import headlens
from headlens.scoring.distributed import Rank
from headlens.scoring.table import read_table
from headlens.zoo import weights_dir

ROOT = Path(__file__).resolve().parents[2]
SNAPS = sorted((weights_dir() / "induction-2l-snapshots").glob("*.safetensors"))
SERIES = [str(SNAPS[i]) for i in (0, 4, 6)]  # steps 700, 3500, 4900: before, during, after the phase change
CLASSIFY = ["-m", "induction-2l", "-d", "previous_token,induction", "--n-prompts", "10", "--batch-size", "3",
            "--seq-len", "32"]
SWEEP = dict(n_prompts=6, n_control=2, n_boot=50, seed=0)
TRAJ = dict(detectors="induction,previous_token", n_prompts=10, seq_len=64, n_boot=50)

JOB = """
import json, sys
import headlens
from headlens.cli import app
from headlens.scoring.distributed import current
from headlens.interventions.sweep import sweep
from headlens.scoring.table import write_table

out, classify_args, sweep_kw, series, traj_kw = sys.argv[1], *map(json.loads, sys.argv[2:])
app(["classify", *classify_args, "-o", f"{out}/classify.csv", "--resume", f"{out}/resume"], standalone_mode=False)
swept = sweep(headlens.load("induction-2l"), **sweep_kw)
traj = headlens.trajectory(series, **traj_kw)
if current().is_main:
    swept.to_json(f"{out}/sweep.json")
    write_table(traj, f"{out}/trajectory.csv")
else:
    assert swept is None and traj is None
"""

FAILING_JOB = """
import os
import headlens.scoring.scan
from headlens.errors import ProbeError

def boom(*args, **kwargs):
    raise ProbeError("planted failure on rank 1")

if os.environ["RANK"] == "1":
    headlens.scoring.scan.scan = boom
from headlens.cli import main
main()
"""


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", **extra}
    if sys.platform == "linux":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _torchrun(script: Path, *args: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(**env), cwd=script.parent)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    (out / "job.py").write_text(textwrap.dedent(JOB))
    res = _torchrun(out / "job.py", str(out), json.dumps(CLASSIFY), json.dumps(SWEEP), json.dumps(SERIES),
                    json.dumps(TRAJ))
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res


def test_blocks_cover_the_rows_in_order():
    for n, bs, world in [(10, 3, 2), (3, 4, 2), (17, 2, 3), (0, 2, 2)]:
        blocks = [Rank(r, world).batch_block(n, bs) for r in range(world)]
        assert [i for b in blocks for i in b] == list(range(n))
        assert all(b.start % bs == 0 for b in blocks if len(b))  # every batch whole, on one rank
        assert [i for r in range(world) for i in Rank(r, world).block(n)] == list(range(n))
    assert Rank(3, 4, local_rank=1).device("cuda") == "cuda:1"  # each GPU rank on its own device
    assert Rank(0, 1).device("cuda") == "cuda" and Rank(1, 2, 1).device("cpu") == "cpu"


def test_classify_on_two_ranks_equals_one_process(two_ranks):
    out, res = two_ranks
    args = dict(detectors="previous_token,induction", n_prompts=10, batch_size=3, seq_len=32)
    one = headlens.classify("induction-2l", **args)
    two = read_table(out / "classify.csv")
    assert one.attrs["world_size"] == 1 and two.attrs["world_size"] == 2
    for col in ("score", "ci_low", "ci_high", "baseline"):
        np.testing.assert_allclose(two[col], one[col], atol=1e-9, rtol=0)
    assert (two["label"] == one["label"]).all() and (two["n_positions"] == one["n_positions"]).all()
    assert res.stdout.count("labelled heads") == 1  # results printed by rank 0 only
    # progress from rank 0 only: off a terminal it prints lines once the scan takes over 2 s (a loaded
    # machine), never a second rank's copy of them
    scans = [ln for ln in res.stderr.splitlines() if "scanning" in ln]
    assert len(scans) == len(set(scans)) and all(ln.startswith("headlens: scanning") for ln in scans), scans
    # the shards written under torchrun serve a one-process rerun
    again = headlens.classify("induction-2l", **args, resume=out / "resume")
    np.testing.assert_allclose(again["score"], one["score"], atol=1e-9, rtol=0)


def test_sweep_on_two_ranks_equals_one_process(two_ranks):
    out, _ = two_ranks
    from headlens.interventions.sweep import sweep

    one = sweep(headlens.load("induction-2l"), **SWEEP)
    two = pd.read_json(out / "sweep.json")
    assert list(two["heads"]) == list(one["heads"])
    num = one.select_dtypes("number").columns
    np.testing.assert_allclose(two[num].to_numpy(float), one[num].to_numpy(float), atol=1e-9, rtol=0)


def test_trajectory_on_two_ranks_equals_one_process(two_ranks):
    out, _ = two_ranks
    one = headlens.trajectory(SERIES, **TRAJ)
    two = read_table(out / "trajectory.csv")
    assert two.attrs["world_size"] == 2 and [c["step"] for c in two.attrs["checkpoints"]] == [700, 3500, 4900]
    assert list(two["step"]) == list(one["step"]) and list(two["checkpoint"]) == list(one["checkpoint"])
    np.testing.assert_allclose(two["score"], one["score"], atol=1e-9, rtol=0)
    np.testing.assert_allclose(two["ci_low"], one["ci_low"], atol=1e-9, rtol=0)
    # the phase change: L1H1 is no induction head at step 700 and is one, clearly, at step 4900
    l1h1 = two[(two["layer"] == 1) & (two["head"] == 1) & (two["detector"] == "induction")].set_index("step")
    assert l1h1.loc[700, "score"] < 0.1 and not l1h1.loc[700, "label"]
    assert l1h1.loc[4900, "score"] > 0.4 and l1h1.loc[4900, "label"]
    assert l1h1["loss"].is_monotonic_decreasing  # the snapshots carry their training loss


def test_dashboard_training_view_reads_a_trajectory_table(two_ranks, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from headlens.app import helpers as hd

    out, _ = two_ranks
    monkeypatch.setenv(hd.MODEL_ENV, str(ROOT / "headlens" / "zoo" / "weights" / "dyck.safetensors"))
    at = AppTest.from_file(str(ROOT / "apps" / "dashboard.py"), default_timeout=300)
    at.run()
    at.segmented_control(key="view").set_value("Training").run()
    at.text_input(key="trajectory_table").set_value(str(out / "trajectory.csv")).run()
    assert not at.exception and not at.error
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    (fig,) = [f for f in figs if f["data"] and f["data"][0].get("name") == "loss"]
    steps = [700, 3500, 4900]
    assert _values(fig["data"][0]["x"]) == steps  # the snapshots' own losses
    assert {t["name"] for t in fig["data"][1:]} == {f"L{la}H{h}" for la in range(2) for h in range(4)}


def _values(v):
    if isinstance(v, dict) and "bdata" in v:
        import base64

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)


def test_an_error_on_one_rank_ends_every_rank(tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent(FAILING_JOB))
    # the collective timeout (60 s) is a backstop far inside the subprocess limit (300 s): a hang shows as
    # a failed job with the timeout named, never as a killed test
    res = _torchrun(tmp_path / "job.py", "classify", *CLASSIFY, "-q", timeout=300, HEADLENS_DIST_TIMEOUT="60")
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("headlens: error:")]
    assert len(lines) == 2 and all("planted failure on rank 1" in ln for ln in lines), res.stderr[-2000:]


KILLER = """
import os, signal, sys
import headlens.scoring.resume

calls = 0
_replace = os.replace

def replace_then_die(src, dst):  # SIGKILL half-way through the 5th shard: its temp file is written, not moved
    global calls
    calls += 1
    if calls == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    _replace(src, dst)

headlens.scoring.resume.os.replace = replace_then_die
sys.argv[0] = "headlens"
from headlens.cli import main
main()
"""


def test_sigkilled_resume_run_resumes_to_the_identical_table(tmp_path, monkeypatch):
    (tmp_path / "kill.py").write_text(textwrap.dedent(KILLER))
    args = ["classify", "-m", "induction-2l", "-d", "previous_token,induction", "--n-prompts", "12",
            "--batch-size", "2", "--seq-len", "32", "-q", "--resume", str(tmp_path / "shards")]
    res = subprocess.run([sys.executable, str(tmp_path / "kill.py"), *args], capture_output=True, text=True,
                         timeout=120, env=_env())
    assert res.returncode == -9, res.stderr[-2000:]
    done = sorted(p.name for p in (tmp_path / "shards" / "classify").glob("*.safetensors"))
    assert len(done) == 4, done  # the 5th shard, in flight, is lost; nothing else is
    import headlens.scoring.scan

    scans = []
    real_scan = headlens.scoring.scan.scan
    monkeypatch.setattr(headlens.scoring.scan, "scan", lambda *a, **k: scans.append(1) or real_scan(*a, **k))
    kw = dict(detectors="previous_token,induction", n_prompts=12, batch_size=2, seq_len=32)
    resumed = headlens.classify("induction-2l", **kw, resume=tmp_path / "shards")
    assert len(scans) == 12 - 4  # 2 probes x 6 batches, 4 read back
    monkeypatch.setattr(headlens.scoring.scan, "scan", real_scan)
    fresh = headlens.classify("induction-2l", **kw)
    pd.testing.assert_frame_equal(resumed, fresh)
    # the same folder with other settings: every shard is ignored with a warning, none mixed in
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other = headlens.classify("induction-2l", **{**kw, "seed": 1}, resume=tmp_path / "shards")
    assert any("ignoring resume shard" in str(w.message) for w in caught)
    pd.testing.assert_frame_equal(other, headlens.classify("induction-2l", **{**kw, "seed": 1}))


def test_device_map_split_over_cpu_and_disk_scores_like_the_whole_model(tmp_path):
    pytest.importorskip("accelerate")
    from conftest import make_gpt

    from headlens.models.export import export_hf

    hf = export_hf(make_gpt(n_layers=4, n_heads=4, d_model=64, n_ctx=64, d_vocab=257), tmp_path / "hf")
    kw = dict(detectors="previous_token,induction", n_prompts=10, seq_len=32, n_boot=50)
    whole = headlens.classify(f"hf:{hf}", **kw)
    # 500KB of "CPU" holds the embeddings and one of the four layers: accelerate puts the rest on disk
    split = headlens.load(f"hf:{hf}", device_map="auto", max_memory={"cpu": "500KB"}, offload_folder=tmp_path / "off")
    placed = split.bridge.original_model.hf_device_map
    assert set(placed.values()) == {"cpu", "disk"} and placed["transformer.h.3"] == "disk", placed
    got = headlens.classify(split, **kw)
    from headlens.scoring.resume import file_hash, weights_hash

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the offloaded weights are fingerprinted by their files, silently
        assert file_hash(hf / "model.safetensors") != weights_hash(split) != weights_hash(headlens.load(f"hf:{hf}"))
    for col in ("score", "ci_low", "ci_high"):
        np.testing.assert_allclose(got[col], whole[col], atol=1e-9, rtol=0)


def test_device_map_options_are_checked():
    from typer.testing import CliRunner

    from headlens.cli import app
    from headlens.cli.options import parse_max_memory

    assert parse_max_memory("0=20GiB,1=20GiB, cpu=64GiB") == {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}
    runner = CliRunner()
    res = runner.invoke(app, ["classify", "-m", "induction-2l", "--max-memory", "cpu=1GiB"])
    assert res.exit_code == 2 and "need --device-map" in res.stderr
    res = runner.invoke(app, ["classify", "-m", "induction-2l", "--device-map", "auto"])
    assert res.exit_code == 2 and "need an 'hf:' model" in res.stderr
    res = runner.invoke(app, ["classify", "--device-map", "auto", "--max-memory", "cpu"])
    assert res.exit_code == 2 and "'cpu' is not DEVICE=SIZE" in res.stderr


def test_trajectory_cli_writes_table_and_figure(tmp_path):
    from typer.testing import CliRunner

    from headlens.cli import app
    from headlens.scoring.series import checkpoints

    folder = str(SNAPS[0].parent)
    assert [c.step for c in checkpoints(folder)] == [700 * (i + 1) for i in range(20)]
    assert [c.step for c in checkpoints(f"{folder}/step_0[0-1]*.safetensors")] == [700, 1400]
    assert [(c.name, c.step) for c in checkpoints("hf:EleutherAI/pythia-70m@step3000,step1000")] == [
        ("step1000", 1000), ("step3000", 3000)]
    series = checkpoints([SERIES[2], SERIES[0]])  # sorted by step, losses from each file's metadata
    assert [c.step for c in series] == [700, 4900]
    assert [c.loss for c in series] == [4.10634, 2.57144]  # the training loss recorded in the two files
    from safetensors import safe_open

    for c, path in zip(series, (SERIES[0], SERIES[2]), strict=True):  # read back independently
        with safe_open(path, "pt") as f:
            assert json.loads(f.metadata()["metadata"])["loss"] == c.loss
    res = CliRunner().invoke(app, ["trajectory", "--models", SERIES[0], "--models", SERIES[2], "-d", "induction",
                                   "--n-prompts", "10", "-q", "-o", str(tmp_path / "t.csv"),
                                   "--figure", str(tmp_path / "t.html")])
    assert res.exit_code == 0, res.output
    assert re.search(r"L1H1 +│ induction", res.stdout) and "4900" in res.stdout and "4.106" in res.stdout  # per head
    table = read_table(tmp_path / "t.csv")
    assert sorted(set(table["step"])) == [700, 4900] and len(table) == 2 * 8
    html = (tmp_path / "t.html").read_text()
    assert "plotly" in html and "induction score per head" in html and "training loss" in html
    res = CliRunner().invoke(app, ["trajectory", "--models", str(tmp_path / "nothing_*.safetensors")])
    assert res.exit_code == 4 and "no checkpoints match" in res.stderr


def test_sweep_and_trajectory_resume_from_their_shards(tmp_path, monkeypatch):
    import headlens.interventions.sweep as sw

    model = headlens.load("induction-2l")
    kw = dict(n_prompts=6, n_control=2, n_boot=50)
    fresh = sw.sweep(model, **kw)
    first = sw.sweep(model, **kw, resume=tmp_path)
    assert len(list((tmp_path / "sweep").glob("*.safetensors"))) >= 1
    monkeypatch.setattr(sw.ResumeRunner, "run_unit", lambda *a: pytest.fail("a stored unit was recomputed"))
    again = sw.sweep(model, **kw, resume=tmp_path)
    monkeypatch.undo()
    pd.testing.assert_frame_equal(first, fresh)
    pd.testing.assert_frame_equal(again, fresh)

    tkw = dict(detectors="induction", n_prompts=10, n_boot=50)
    series = headlens.trajectory(SERIES[:2], **tkw, resume=tmp_path)
    assert len(list((tmp_path / "trajectory").glob("*.json"))) == 2
    from headlens.scoring import classification

    monkeypatch.setattr(classification, "classify", lambda *a, **k: pytest.fail("a checkpoint was rescored"))
    again = headlens.trajectory(SERIES[:2], **tkw, resume=tmp_path)
    pd.testing.assert_frame_equal(again, series, check_dtype=False)
