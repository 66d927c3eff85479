"""The user's prompts file, read without torch: one prompt per line, or JSONL with a ``"text"`` field.

Without torch so that a command refuses a bad file (UTF-16, invalid UTF-8, a binary file, a JSONL line
of the wrong type) in a second, before torch, transformers or the model are loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from headlens.errors import ProbeError


def read_prompts(path: str | Path) -> list[str]:
    """Texts from a file: one prompt per line, or JSONL objects with a ``"text"`` field.

    Lines end at ``\n`` (a ``\r`` before it is dropped: CRLF files read as LF ones; a form feed or a
    Unicode line separator inside a prompt stays in it). Blank lines are skipped. A file with no prompt
    at all, one that is not UTF-8 (UTF-16, a binary file), or a prompt holding a NUL byte is a
    ``ProbeError`` naming the file and the line.
    """
    p = Path(path)
    if not p.is_file():
        raise ProbeError(f"prompts file {str(path)!r} does not exist")
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise ProbeError(f"prompts file {str(path)!r} is unreadable ({err.strerror or err})") from None
    lines = utf8_lines(raw, str(path))
    texts = []
    jsonl = p.suffix == ".jsonl" or next((ln.lstrip().startswith("{") for ln in lines if ln.strip()), False)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if jsonl:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ProbeError(f"{str(path)!r} line {n} is not valid JSON ({err.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                got = type(obj.get("text")).__name__ if isinstance(obj, dict) and "text" in obj else \
                    ("no \"text\"" if isinstance(obj, dict) else f"a JSON {type(obj).__name__}")
                raise ProbeError(f'{str(path)!r} line {n}: expected an object with a string "text" field, got {got}')
            line = obj["text"]
        if "\x00" in line:
            raise ProbeError(f"{str(path)!r} line {n} holds a NUL byte (a binary file?); expected text, one "
                             f"prompt per line")
        if line.strip():
            texts.append(line)
    if not texts:
        raise ProbeError(f"prompts file {str(path)!r} has no prompts (empty or only blank lines)")
    return texts


def utf8_lines(raw: bytes, path: str) -> list[str]:
    """``raw`` as UTF-8 (a UTF-8 byte-order mark dropped) split at ``\n``, each line's trailing ``\r`` dropped."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ProbeError(f"prompts file {path!r} is UTF-16 (it starts with a byte-order mark); expected UTF-8: "
                         f"save it as UTF-8")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ProbeError(f"prompts file {path!r} is not UTF-8 text: byte {err.start:,} (line {line}) is "
                         f"0x{raw[err.start]:02x}; save it as UTF-8") from None
    if (nul := text.find("\x00")) >= 0:
        raise ProbeError(f"{path!r} line {text.count(chr(10), 0, nul) + 1} holds a NUL byte (a binary file?); "
                         f"expected text, one prompt per line")
    return [ln.removesuffix("\r") for ln in text.split("\n")]
