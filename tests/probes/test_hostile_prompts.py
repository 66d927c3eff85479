"""Prompt files as users really have them: UTF-16 from a Windows editor, a binary file, invalid UTF-8,
one 10 MB line, CRLF endings, JSONL with the wrong types. Each is read right or refused in one line
naming the file (and the line), exit code 5, no traceback."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from headlens.cli import app
from headlens.errors import ProbeError
from headlens.models.checkpoint import save_checkpoint
from headlens.probes.text import read_prompts
from headlens.testing import planted_model

runner = CliRunner()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(save_checkpoint(planted_model(), tmp_path_factory.mktemp("hostile") / "planted.safetensors"))


BAD = [
    ("UTF-16", "hello there\n".encode("utf-16"), "is UTF-16 (it starts with a byte-order mark)"),
    ("invalid UTF-8", b"fine line\nbad \xff\xfe byte\n", "is not UTF-8 text: byte 14 (line 2) is 0xff"),
    ("a binary file", b"ab\x00\x01\x02cd\n", "line 1 holds a NUL byte"),
    ("JSONL text a number", b'{"text": "ok"}\n{"text": 5}\n', 'line 2: expected an object with a string "text" '
                                                              "field, got int"),
    ("JSONL a list", b'{"text": "ok"}\n[1, 2]\n', "got a JSON list"),
    ("JSONL no text", b'{"text": "ok"}\n{"body": "x"}\n', 'got no "text"'),
    ("JSONL NUL escaped", b'{"text": "a\\u0000b"}\n', "line 1 holds a NUL byte"),
]


@pytest.mark.parametrize(("what", "data", "said"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_prompts_file_is_one_line_and_exit_code_5(ckpt, tmp_path, what, data, said):
    path = tmp_path / ("p.jsonl" if what.startswith("JSONL") else "p.txt")
    path.write_bytes(data)
    result = runner.invoke(app, ["classify", "-m", ckpt, "-p", str(path), "-q"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 5 and len(lines) == 1 and "Traceback" not in result.output, (what, result.output)
    assert str(path) in lines[0] and said in lines[0], (what, lines[0])


def test_one_10_mb_line_is_refused_or_cut_without_tokenizing_it_all(ckpt, tmp_path):
    path = tmp_path / "huge.txt"
    path.write_text("abcd(ef)" * 1_250_000 + "\n")  # 10 MB in the planted model's alphabet
    result = runner.invoke(app, ["classify", "-m", ckpt, "-p", str(path), "-q"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 5 and len(lines) == 1 and "prompt 1 is over" in lines[0] and "--truncate" in lines[0]
    result = runner.invoke(app, ["classify", "-m", ckpt, "-p", str(path), "-q", "--truncate", "-o",
                                 str(tmp_path / "s.csv")])
    assert result.exit_code == 0 and (tmp_path / "s.csv").is_file(), result.output


def test_crlf_and_a_utf8_bom_read_as_plain_lines(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"\xef\xbb\xbfone two\r\n\r\nthree\x0cfour\r\n")
    assert read_prompts(path) == ["one two", "three\x0cfour"]  # a form feed is inside a prompt, not between two
    jl = tmp_path / "p.jsonl"
    jl.write_bytes(b'{"text": "a"}\r\n{"text": "b"}\r\n')
    assert read_prompts(jl) == ["a", "b"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_any_bytes_as_a_prompts_file_read_or_refuse_in_one_line(tmp_path, data):
    path = tmp_path / "p.txt"
    path.write_bytes(data)
    try:
        texts = read_prompts(path)
    except ProbeError as err:
        assert "\n" not in str(err) and str(path) in str(err)
    else:
        assert texts and all(isinstance(t, str) and t.strip() and "\n" not in t and "\x00" not in t for t in texts)
