"""Resumable work: finished shards on disk, keyed by a fingerprint of everything that made them.

Why it looks like this:

* **A shard is the unit a kill may lose.** A block of prompts of one probe (classify), one
  checkpoint of a series (trajectory), a block of head groups (sweep). Each is written to a temporary
  file in the same folder and moved into place with ``os.replace`` (atomic on POSIX), so a process
  killed with SIGKILL leaves either the whole shard or none of it.
* **Fingerprint, not file names, decides reuse.** The fingerprint hashes the model's weights, the
  probe's tokens and settings, the detectors, the seed and the headlens version. A stored shard with
  another fingerprint (the same folder reused for other settings) is ignored with a warning and
  recomputed, never mixed in.
* **safetensors, no pickle.** Tensors go in as they are; the fingerprint and the shard's own facts
  sit in the header metadata.
* Works the same with and without torchrun: every rank reads and writes only its own shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

from headlens.errors import OutputError
from headlens.models import files


def digest(*parts: Any) -> str:
    """A stable sha256 of JSON-able ``parts`` (dict keys sorted)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def tensor_hash(tensors: Any) -> str:
    """sha256 over ``(name, dtype, shape, bytes)`` of named tensors (a model's ``state_dict()`` items)."""
    import torch

    h = hashlib.sha256()
    for name, t in tensors:
        t = t.detach()
        if t.device.type == "meta":  # offloaded weights: their names and shapes are all we have here
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:meta".encode())
            continue
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def weights_hash(model: Any) -> str:
    """sha256 of a loaded model's weights (native ``GPT`` or a bridge's underlying module).

    Weights a device map left on disk are not in memory (``meta`` tensors): their checkpoint files
    (the Hugging Face directory the model was loaded from) are hashed instead.
    """
    module = getattr(model, "bridge", model)
    items = sorted(module.state_dict().items())
    if not any(t.device.type == "meta" for _, t in items):
        return tensor_hash(items)
    source = Path(str(getattr(getattr(module, "original_model", None), "name_or_path", "") or ""))
    files = sorted(p for pattern in ("*.safetensors", "*.bin") for p in source.glob(pattern)) if source.is_dir() else []
    if not files:
        warnings.warn("the weights are offloaded and their files were not found: resume shards are keyed by "
                      "the weights' names and shapes only", stacklevel=2)
    return digest(tensor_hash(items), [(p.name, file_hash(p)) for p in files])


def file_hash(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (a checkpoint: cheaper than loading it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(path: Path, write: Any) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then ``os.replace`` it into place
    (:func:`headlens.models.files.atomic_write`: the umask's mode)."""
    files.atomic_write(path, write)


class ShardStore:
    """Shards of one kind of work under ``root/kind``, all made with one ``fingerprint``.

    >>> import tempfile, torch
    >>> store = ShardStore(tempfile.mkdtemp(), "demo", fingerprint="abc")
    >>> store.save("block-0-4", {"x": torch.zeros(4)}, rows=4)
    >>> tensors, facts = store.load("block-0-4")
    >>> tensors["x"].shape, facts
    (torch.Size([4]), {'rows': 4})
    """

    def __init__(self, root: str | os.PathLike, kind: str, fingerprint: str) -> None:
        self.dir = Path(root).expanduser() / kind
        self.fingerprint = fingerprint
        self.n_ignored = 0
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OutputError(f"cannot use resume folder {str(root)!r}: {err.strerror or err}") from None

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.safetensors"

    def load(self, key: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The shard's tensors and facts, or None when it is missing or was made with another fingerprint."""
        from safetensors import SafetensorError, safe_open

        p = self.path(key)
        if not p.is_file():
            return None
        try:
            with safe_open(str(p), framework="pt") as f:
                if (f.metadata() or {}).get("fingerprint") != self.fingerprint:
                    self._ignore(p, "it was made with other settings or weights")
                    return None
                meta = {k: json.loads(v) for k, v in f.metadata().items() if k != "fingerprint"}
                return {k: f.get_tensor(k) for k in f.keys()}, meta
        except (SafetensorError, OSError, ValueError) as err:
            self._ignore(p, f"it cannot be read ({err})")
            return None

    def save(self, key: str, tensors: dict[str, Any], **meta: Any) -> None:
        """Write the shard atomically (a kill leaves the whole shard or none of it)."""
        from safetensors.torch import save_file

        info = {"fingerprint": self.fingerprint, **{k: json.dumps(v) for k, v in meta.items()}}
        clean = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        atomic_write(self.path(key), lambda tmp: save_file(clean, tmp, metadata=info))

    def _ignore(self, path: Path, why: str) -> None:
        self.n_ignored += 1
        warnings.warn(f"ignoring resume shard {str(path)!r}: {why}; recomputing it", stacklevel=3)


def probe_hash(probe: Any) -> str:
    """sha256 of a probe's prompts and annotations (what a scan of it reads)."""
    return tensor_hash([(f"{probe.name}.{i}", t) for i, t in enumerate(probe.prompts)]
                       + [(f"{name}.{i}", t) for name, ts in sorted(probe.annotations.items())
                          for i, t in enumerate(ts)])


def scan_store(root: str | os.PathLike, model: Any, probes: Any, detectors: Any, **settings: Any) -> ShardStore:
    """The store for a classify run: fingerprint = weights, probes, detectors, settings, version."""
    from headlens import __version__

    fp = digest(weights_hash(model), [probe_hash(p) for p, _ in probes], [p.settings for p, _ in probes],
                [d.name for d in detectors], settings, __version__)
    return ShardStore(root, "classify", fp)


def sweep_store(root: str | os.PathLike, model: Any, tasks: dict[str, Any], groups: Any, reference: Any,
                **settings: Any) -> ShardStore:
    """The store for an ablation sweep: weights, task prompts, the head groups, settings and version."""
    from headlens import __version__

    task_hashes = {m: tensor_hash([("tokens", t.tokens), ("positions", t.positions)]) for m, t in tasks.items()}
    ref = None if reference is None else tensor_hash([("reference", reference)])
    fp = digest(weights_hash(model), task_hashes, [list(g) for g in groups], ref, settings, __version__)
    return ShardStore(root, "sweep", fp)
