"""``hf:ORG/NAME@REVISION`` through a fabricated Hugging Face cache; remote code refused; no downloads.

The cache is laid out as ``huggingface_hub`` leaves it after a download:
``$HF_HOME/hub/models--ORG--NAME/snapshots/<40-hex commit>/`` holding the files, and
``refs/main`` / ``refs/step3000`` holding commits. ``HF_HUB_OFFLINE=1`` makes every lookup a
cache lookup. huggingface_hub reads ``HF_HOME`` and ``HF_HUB_OFFLINE`` when it is imported, so
in-process tests patch its constants and the CLI tests run in a subprocess with the environment set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hf_families import build, hub_snapshot

from headlens.errors import ModelReferenceError
from headlens.models.hf.hub import HFSource, resolve, split_reference

REPO = "headlens-test/tiny-llama"
MAIN, STEP = "a" * 40, "b" * 40  # commits of refs/main and refs/step3000
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf_home")
    cache = root / "hub"
    hub_snapshot(cache, REPO, MAIN, build("llama", root / "src-main", seed=0), ("main",))
    hub_snapshot(cache, REPO, STEP, build("llama", root / "src-step", seed=1), ("step3000",))
    remote = build("gpt2", root / "src-remote")
    config = json.loads((remote / "config.json").read_text())
    config.update(model_type="headlens-custom", auto_map={"AutoConfig": "modeling_custom.CustomConfig",
                                                           "AutoModelForCausalLM": "modeling_custom.CustomModel"})
    (remote / "config.json").write_text(json.dumps(config))
    (remote / "modeling_custom.py").write_text("raise SystemExit('repository code ran')\n")
    hub_snapshot(cache, "headlens-test/custom", MAIN, remote, ("main",))
    return root


@pytest.fixture
def offline_cache(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hf_home / "hub"


def test_split_reference_prefers_existing_paths(tmp_path, monkeypatch):
    assert split_reference("ORG/NAME") == ("ORG/NAME", None, False)
    assert split_reference("EleutherAI/pythia-160m@step3000") == ("EleutherAI/pythia-160m", "step3000", False)
    assert split_reference(f"ORG/NAME@{MAIN}") == ("ORG/NAME", MAIN, False)
    assert split_reference("./ORG/NAME") == ("./ORG/NAME", None, True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ORG" / "NAME").mkdir(parents=True)
    assert split_reference("ORG/NAME") == ("ORG/NAME", None, True)  # an existing directory wins
    for bad in ("", "ORG/NAME@", "a b/c", "ORG/NAME@x y"):
        with pytest.raises(ModelReferenceError):
            split_reference(bad)


def test_revisions_resolve_from_the_cache(offline_cache):
    main = resolve(REPO)
    assert isinstance(main, HFSource) and main.is_hub and main.revision is None and main.name == REPO
    assert main.files == offline_cache / "models--headlens-test--tiny-llama" / "snapshots" / MAIN
    step = resolve(f"{REPO}@step3000")
    assert step.files.name == STEP and step.name == f"{REPO}@step3000" and "tokenizer.json" in step.tokenizer_files()
    assert resolve(f"{REPO}@{STEP}").files.name == STEP  # a commit works without a ref


@pytest.mark.parametrize(("spec", "expected"), [
    ("headlens-test/absent", r"'headlens-test/absent' is not in the Hugging Face cache .* HF_HUB_OFFLINE=1 is set"),
    (f"{REPO}@step9", r"revision 'step9' of 'headlens-test/tiny-llama' is not in the Hugging Face cache "
                      r"\(HF_HUB_OFFLINE=1 is set\); cached revisions: main, step3000"),
    (f"{REPO}@{'c' * 40}", r"cached snapshot of headlens-test/tiny-llama@c{40} has no config.json"),
    ("./no/such/dir", r"no such directory"),
])
def test_missing_repo_revision_or_cache_entry_is_one_line(offline_cache, spec, expected):
    with pytest.raises(ModelReferenceError, match=expected) as err:
        resolve(spec)
    assert "\n" not in str(err.value)


def test_remote_code_is_refused_unless_trusted(offline_cache, tmp_path):
    with pytest.raises(ModelReferenceError, match=r"needs its repository's own Python code .* --trust-remote-code "
                                                  r"\(API: trust_remote_code=True\)"):
        resolve("headlens-test/custom")
    assert resolve("headlens-test/custom", trust_remote_code=True).config["model_type"] == "headlens-custom"
    # auto_map on a model type transformers knows: its own classes load it, the repo's code never runs
    local = build("gpt2", tmp_path / "known")
    config = json.loads((local / "config.json").read_text())
    (local / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "x.Y"}}))
    assert resolve(str(local)).config["model_type"] == "gpt2"


def _cli(hf_home: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-m", "headlens", *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=hf_home)


def test_cli_classifies_a_hub_revision_from_the_cache(hf_home):
    res = _cli(hf_home, "classify", "--model", f"hf:{REPO}@step3000", "--n-prompts", "10", "--seq-len", "24",
               "--detectors", "previous_token,induction", "--quiet", "--out", "scores.json")
    assert res.returncode == 0, res.stderr
    assert f"{REPO}@step3000: 8 heads (2 layers x 4)" in res.stdout  # the summary's first line
    assert "Traceback" not in res.stderr
    saved = json.loads((hf_home / "scores.json").read_text())
    rows = saved["rows"]
    assert saved["provenance"]["dtype"] == "float32"
    assert {r["model"] for r in rows} == {f"{REPO}@step3000"} and len(rows) == 2 * 2 * 4


def test_cli_refuses_remote_code_in_one_line(hf_home):
    res = _cli(hf_home, "classify", "--model", "hf:headlens-test/custom", "--quiet")
    assert res.returncode == 4, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headlens: error: ") and "--trust-remote-code" in lines[0], lines
    assert "repository code ran" not in res.stderr + res.stdout


@pytest.fixture
def unreachable_hub(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HUB_OFFLINE unset, but the endpoint is a loopback port where nothing listens (no network)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    return hf_home / "hub"


def test_an_unreachable_hub_is_one_line_that_suggests_offline_mode_without_retrying(unreachable_hub, monkeypatch):
    import huggingface_hub

    from headlens.models.hf import hub

    calls = []
    real = huggingface_hub.hf_hub_download
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda *a, **kw: calls.append(kw.get("local_files_only", False)) or real(*a, **kw))
    with pytest.raises(ModelReferenceError, match=r"not in the Hugging Face cache .*set HF_HUB_OFFLINE=1") as err:
        resolve("headlens-test/absent")
    assert "\n" not in str(err.value) and "127.0.0.1:9 did not answer" in str(err.value)
    assert calls == [True]  # the cache only: never the network call that retries for ~25 s
    assert not hub.hub_reachable("http://127.0.0.1:9")


def test_an_unreachable_hub_still_loads_what_the_cache_holds(unreachable_hub):
    assert resolve(f"{REPO}@step3000").files.name == STEP


def test_cli_offline_miss_is_one_line_and_exit_4(hf_home):
    env = dict(os.environ, HF_HOME=str(hf_home), HF_ENDPOINT="http://127.0.0.1:9", PYTHONPATH=str(ROOT))
    for var in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "headlens", "classify", "-m", "hf:headlens-test/absent"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.count("\n") == 1 and "HF_HUB_OFFLINE=1" in proc.stderr and "Retry" not in proc.stderr
