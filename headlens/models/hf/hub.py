"""Where an ``hf:`` reference points: a local directory, or a hub repository at a revision.

Why it looks like this:

* **An existing path wins.** ``hf:./dir``, ``hf:/abs/dir`` and ``hf:dir`` load a local
  directory whenever that path exists; otherwise ``ORG/NAME`` or ``ORG/NAME@REVISION`` is a
  hub repository (branch, tag or 40-hex commit; Pythia's ``@step3000``). A path that looks like
  one (``./``, ``/``, ``~``) never falls through to the hub.
* **The Hugging Face cache does the fetching.** Only ``config.json`` is fetched here, with
  ``huggingface_hub.hf_hub_download``: online it downloads, with ``HF_HUB_OFFLINE=1`` (the
  user's choice, never ours) it resolves ``refs/<revision>`` to a snapshot in the cache. The
  weights and the tokenizer follow through ``from_pretrained(..., revision=...)``. Each way of
  failing (no such repository, revision, or cache entry) is one line, a ``ModelReferenceError``.
* **No repository code runs unless asked.** A config whose ``auto_map`` points at the
  repository's own Python, for a ``model_type`` transformers does not know, is refused with a
  line that says how to allow it (``--trust-remote-code``). A known ``model_type`` loads with
  transformers' own classes and ``trust_remote_code=False``, whatever ``auto_map`` says, and
  :func:`remote_code_note` says so in one line (the user studies transformers' model, not the
  repository author's) that goes to the user and into the table's provenance.

Imports ``huggingface_hub`` only (no torch, no transformers) so a bad reference fails fast.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlens.errors import ModelReferenceError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # NAME or ORG/NAME
_REVISION = re.compile(r"^[\w./-]+$")
_PATH_LIKE = ("/", "./", "../", "~", ".\\", "..\\")
# files a tokenizer is read from; a directory with none of them has no tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "vocab.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


@dataclass(frozen=True)
class HFSource:
    """A resolved ``hf:`` reference.

    Attributes:
        source: what ``from_pretrained`` is given: a local directory or a hub repo id.
        revision: the hub revision asked for (None: the default branch, or a local directory).
        files: the local directory holding ``config.json`` (for a hub repo: its cache snapshot).
        config: the parsed ``config.json``.
        name: display name (directory name, or ``ORG/NAME[@REVISION]``).
    """

    source: str
    revision: str | None
    files: Path
    config: dict[str, Any]
    name: str

    @property
    def is_hub(self) -> bool:
        return self.source != str(self.files)

    def tokenizer_files(self) -> list[str]:
        """The tokenizer files present next to ``config.json`` (for a hub repo: in the cache so far)."""
        return [f for f in TOKENIZER_FILES if (self.files / f).is_file()]


def split_reference(spec: str) -> tuple[str, str | None, bool]:
    """``spec`` (the text after ``hf:``) as ``(path or repo id, revision, is_local)``.

    >>> split_reference("EleutherAI/pythia-160m@step3000")
    ('EleutherAI/pythia-160m', 'step3000', False)
    >>> split_reference("./runs/model")
    ('./runs/model', None, True)
    """
    spec = spec.strip()
    if not spec:
        raise ModelReferenceError("empty 'hf:' reference; expected hf:<dir> or hf:ORG/NAME[@REVISION]")
    if Path(spec).expanduser().exists() or spec.startswith(_PATH_LIKE) or spec.count("/") > 1:
        return spec, None, True
    repo, _, revision = spec.partition("@")
    if not _REPO_ID.match(repo) or (revision and not _REVISION.match(revision)) or spec.endswith("@"):
        raise ModelReferenceError(
            f"'hf:{spec}' is neither an existing directory nor a hub name; expected hf:<dir> or "
            f"hf:ORG/NAME[@REVISION] (a branch, tag or commit)"
        )
    return repo, revision or None, False


def resolve(spec: str, trust_remote_code: bool = False) -> HFSource:
    """Find ``config.json`` for an ``hf:`` reference (downloading it when online) and read it."""
    target, revision, local = split_reference(spec)
    if local:
        path = Path(target).expanduser()
        if not path.exists():
            raise ModelReferenceError(f"'hf:{spec}': no such directory {str(path)!r}")
        if not (path / "config.json").is_file():
            raise ModelReferenceError(
                f"{target!r} is not a Hugging Face model directory (no config.json); expected hf:<dir> "
                f"with config.json and weights, or hf:ORG/NAME[@REVISION] from the hub"
            )
        src = HFSource(str(path.resolve()), None, path.resolve(), _read(path / "config.json"), path.resolve().name)
    else:
        config_path = _hub_config(target, revision)
        name = f"{target}@{revision}" if revision else target
        src = HFSource(target, revision, config_path.parent, _read(config_path), name)
    check_remote_code(src, trust_remote_code)
    return src


def _read(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelReferenceError(f"{str(path)!r}: unreadable config.json ({err})") from None
    if not isinstance(config, dict):
        raise ModelReferenceError(f"{str(path)!r}: config.json is not a JSON object")
    return config


def _hub_config(repo: str, revision: str | None) -> Path:
    """``config.json`` of ``repo`` at ``revision`` through the Hugging Face cache; one-line errors."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"@{revision}" if revision else ""
    offline = bool(constants.HF_HUB_OFFLINE)
    if not offline and not hub_reachable(constants.ENDPOINT):  # no network: the cache or one line, not retries
        try:
            return Path(hf_hub_download(repo, "config.json", revision=revision, local_files_only=True))
        except (LocalEntryNotFoundError, EntryNotFoundError, OSError, ValueError):
            raise ModelReferenceError(
                _cache_miss(repo, revision, constants.HF_HUB_CACHE, False)
                + f" ({constants.ENDPOINT} did not answer within {REACH_TIMEOUT_S:g} s; set HF_HUB_OFFLINE=1 to "
                "use only the local cache)") from None
    try:
        return Path(hf_hub_download(repo, "config.json", revision=revision))
    except GatedRepoError:
        raise ModelReferenceError(
            f"hub repository {repo!r} is gated: accept its terms on huggingface.co and log in (hf auth login)"
        ) from None
    except RepositoryNotFoundError:
        raise ModelReferenceError(
            f"hub repository {repo!r} not found (a private one needs a login: hf auth login), "
            f"and there is no local directory {repo!r}"
        ) from None
    except RevisionNotFoundError:
        raise ModelReferenceError(f"hub repository {repo!r} has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        raise ModelReferenceError(_cache_miss(repo, revision, constants.HF_HUB_CACHE,
                                              bool(constants.HF_HUB_OFFLINE))) from None
    except EntryNotFoundError:
        raise ModelReferenceError(f"hub repository {repo + at!r} has no config.json: not a transformers model") from None
    except (HfHubHTTPError, OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelReferenceError(f"cannot fetch {repo + at!r} from the hub: {first}") from None


REACH_TIMEOUT_S = 2.0  # how long the hub gets to accept a connection before we call it offline


def hub_reachable(endpoint: str, timeout: float = REACH_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub (or the HTTPS proxy in the environment) opens within ``timeout``.

    huggingface_hub retries a refused or silent connection five times with growing waits (~25 s and a
    dozen log lines); one short connection attempt tells "no network" apart at once.

    >>> hub_reachable("http://127.0.0.1:9", timeout=0.5)  # the discard port: nothing listens
    False
    """
    import os
    import socket
    from urllib.parse import urlsplit

    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or os.environ.get("ALL_PROXY")
    url = urlsplit(proxy if proxy and urlsplit(endpoint).scheme == "https" else endpoint)
    if not url.hostname:
        return True  # cannot tell: let huggingface_hub try
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _cache_miss(repo: str, revision: str | None, cache: str, offline: bool) -> str:
    """Which part of ``repo@revision`` the local cache lacks, in one line."""
    folder = Path(cache) / ("models--" + repo.replace("/", "--"))
    why = "HF_HUB_OFFLINE=1 is set" if offline else "the hub cannot be reached"
    rev = revision or "main"
    if not folder.is_dir():
        return (f"hub model {repo!r} is not in the Hugging Face cache ({cache}) and {why}; "
                f"there is no local directory {repo!r} either")
    known = sorted(p.name for p in (folder / "refs").glob("*")) if (folder / "refs").is_dir() else []
    if not re.fullmatch(r"[0-9a-f]{40}", rev) and rev not in known:
        return (f"revision {rev!r} of {repo!r} is not in the Hugging Face cache ({why}); "
                f"cached revisions: {', '.join(known) or 'none'}")
    return f"the cached snapshot of {repo}@{rev} has no config.json ({why}); it was never fully downloaded"


def check_remote_code(src: HFSource, trust_remote_code: bool) -> None:
    """Refuse a model that only loads by running its repository's own code, unless trusted."""
    if trust_remote_code or not src.config.get("auto_map"):
        return
    model_type = src.config.get("model_type")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type in CONFIG_MAPPING_NAMES:
        return  # transformers' own classes load it; the repository's code is never run
    raise ModelReferenceError(
        f"{src.name!r} needs its repository's own Python code (config auto_map, model_type={model_type!r}); "
        f"headlens never runs it unless you pass --trust-remote-code (API: trust_remote_code=True)"
    )


def _auto_map(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text()).get("auto_map") if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def remote_code_note(src: HFSource, trust_remote_code: bool) -> str | None:
    """One line when ``src`` asks for its own code (``auto_map`` in ``config.json`` or ``tokenizer_config.json``)
    and a built-in transformers class runs instead (``trust_remote_code`` not given); else None.

    :func:`check_remote_code` has already refused the case where no built-in class exists.
    """
    if trust_remote_code:
        return None
    asked = {**_auto_map(src.files / "tokenizer_config.json"), **(src.config.get("auto_map") or {})}
    if not asked:
        return None
    code = sorted({str(v if isinstance(v, str) else next((x for x in v if x), "")).split(".")[0].split("--")[-1]
                   for v in asked.values()} - {""})
    return (f"{src.name!r} asks for its own code ({', '.join(f'{c}.py' for c in code) or 'auto_map'}); "
            f"without --trust-remote-code transformers' built-in model_type={src.config.get('model_type')!r} "
            f"classes run instead, so this is not the repository author's model (pass --trust-remote-code "
            f"to run its code)")
