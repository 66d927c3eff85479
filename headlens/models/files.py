"""Every file headlens writes goes through here: checked before any work, written atomically, with the
permissions the user's umask asks for.

Why it looks like this:

- **Atomic.** A file is written to a temporary name beside its destination and ``os.replace``-d into
  place, so an interrupted run never leaves half a table or half a checkpoint behind.
- **The umask.** ``tempfile.mkstemp`` creates its file with mode 0600 on purpose (a private scratch
  file); renamed into place, that mode would stay, so every score table, report and checkpoint would
  be unreadable to the user's group whatever their umask. The temporary file gets ``0o666 & ~umask``
  before the rename, the mode ``open(path, "w")`` would have given it.
- **Checked first.** :func:`check_writable` creates (and removes) a probe file in the destination's
  folder, so a folder that cannot be written fails in a second, before a long scan, also where
  ``os.access`` says yes but the write fails (root on a read-only mount, ``/sys``, network shares).

It lives in ``models/`` because checkpoints are the first files the pipeline writes; the table writer
with provenance (:mod:`headlens.scoring.output`) builds on it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from headlens.errors import OutputError


def current_umask() -> int:
    """The process's umask, read without changing it where the OS allows (Linux), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets from ``open(path, "w")`` under the current umask (0o644 under 022)."""
    return 0o666 & ~current_umask()


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def check_writable(path: str | os.PathLike, suffixes: Sequence[str] | None = None, what: str = "") -> Path:
    """Refuse, with an ``OutputError`` naming the path, a destination that cannot be written.

    Args:
        path: the file to be written.
        suffixes: the accepted suffixes (lower case, with the dot); None accepts any.
        what: what is written, for the message (``"the report"``); default the path alone.

    Returns:
        ``path`` as a ``Path``.

    >>> check_writable("/no/such/folder/scores.csv", (".csv",))
    Traceback (most recent call last):
    headlens.errors.OutputError: cannot write '/no/such/folder/scores.csv': folder '/no/such/folder' does not exist
    """
    p = Path(path)
    label = f"{what} to {str(path)!r}" if what else repr(str(path))
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise OutputError(f"unknown output suffix {p.suffix or '(none)'!r} in {str(path)!r}; expected one of "
                          f"{', '.join(suffixes)}")
    folder = _folder(p)
    if not folder.is_dir():
        why = "is a file" if folder.exists() else "does not exist"
        raise OutputError(f"cannot write {label}: folder {str(folder)!r} {why}")
    if p.is_dir():
        raise OutputError(f"cannot write {label}: it is a folder")
    try:  # the real test: os.access says yes to root on a read-only mount
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{p.name}.", suffix=".probe")
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise OutputError(f"cannot write {label}: folder {str(folder)!r} is not writable "
                          f"({err.strerror or err})") from None
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"cannot write {label}: the file is read-only")
    return p


def _failed(path: Path, err: OSError, existed: bool, what: str = "file") -> OutputError:
    """One line: what could not be written, why, and that nothing was lost (the temporary name never replaced it)."""
    kept = f"the previous {what} is kept unchanged" if existed else "nothing was written"
    return OutputError(f"cannot write {str(path)!r}: {err.strerror or err}; {kept}")


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, give it the umask's mode, move it into place.

    ``OSError`` from the write (a full disk: ``ENOSPC``) becomes an ``OutputError`` naming ``path`` and saying
    the previous file is kept; the temporary file never stays behind.

    >>> import tempfile, os, stat
    >>> p = atomic_write(os.path.join(tempfile.mkdtemp(), "x.txt"), lambda tmp: open(tmp, "w").write("hi"))
    >>> stat.S_IMODE(p.stat().st_mode) == file_mode()
    True
    """
    return atomic_writes({path: write})[0]


def atomic_writes(writes: dict[str | os.PathLike, Callable[[str], object]]) -> list[Path]:
    """:func:`atomic_write` for files that belong together (a table and its sidecar): every file is written
    to its temporary name first, and only when all are written are they moved into place, so a failure
    leaves every previous file as it was."""
    paths, tmps = [Path(p) for p in writes], []
    try:
        for p, write in zip(paths, writes.values(), strict=True):
            try:
                fd, tmp = tempfile.mkstemp(dir=_folder(p), prefix=f".{p.name}.", suffix=".tmp")
            except OSError as err:
                raise _failed(p, err, p.exists()) from None
            os.close(fd)
            tmps.append(tmp)
            try:
                write(tmp)
                os.chmod(tmp, file_mode())  # mkstemp's 0600 would otherwise stay (module docstring)
            except OSError as err:
                raise _failed(p, err, p.exists()) from None
        for p, tmp in zip(paths, tmps, strict=True):
            try:
                os.replace(tmp, p)
            except OSError as err:
                raise _failed(p, err, p.exists()) from None
    finally:
        for tmp in tmps:
            if os.path.exists(tmp):
                os.remove(tmp)
    return paths


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically with the umask's mode."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_folder(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` on a temporary folder beside ``path``, then swap it into place: a failure (a full
    disk) leaves the previous folder as it was, with one ``OutputError`` line saying so. What the previous
    folder holds that the new one does not (the user's own files, resume shards) is moved into the new one."""
    import shutil

    p = Path(path)
    existed = p.is_dir() and any(p.iterdir())
    try:
        tmp = Path(tempfile.mkdtemp(dir=_folder(p), prefix=f".{p.name}.", suffix=".tmp"))
    except OSError as err:
        raise _failed(p, err, existed, "folder") from None
    old = tmp.with_suffix(".old")
    try:
        write(tmp)
        tmp.chmod(file_mode() | ((file_mode() & 0o444) >> 2))  # mkdtemp's 0700: rw -> rwx where readable
        if p.exists():
            os.replace(p, old)
        os.replace(tmp, p)
    except OSError as err:
        if old.exists() and not p.exists():
            os.replace(old, p)
        raise _failed(p, err, existed, "folder") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if old.exists():  # the previous folder, now aside: keep what the new one does not replace
        for entry in old.iterdir():
            if not (p / entry.name).exists():
                os.replace(entry, p / entry.name)
        shutil.rmtree(old, ignore_errors=True)
    return p
