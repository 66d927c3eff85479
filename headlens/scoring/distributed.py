"""Data-parallel scans on ``torch.distributed``: which rank am I, which rows are mine, put them back.

Why it looks like this:

* **torchrun decides.** ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` (set by ``torchrun``, also under
  Slurm's ``srun torchrun``) select the rank; without them everything runs in one process and
  ``torch.distributed`` is never initialised. A group the caller initialised (a file
  ``init_method`` in tests, say) is used as it is.
* **Contiguous blocks.** Rank ``r`` of ``W`` owns items ``[n*r//W, n*(r+1)//W)``: batches of a probe
  (each prompt stays in the batch it has in one process, so the float32 kernels see the same shapes
  and return the same bits), checkpoints of a series, head groups of a sweep. Concatenating the
  blocks in rank order gives the single-process order, so the per-prompt float64 rows, and every
  statistic computed from them, are the single-process ones (summing partial totals in another
  order would not be).
* **One gather after the loop.** A per-batch collective deadlocks when blocks differ by a batch.
  gloo gathers only equal shapes: each rank pads its rows to the longest block, and the counts
  travel first so rank 0 can cut the padding off.
* **One rank's error ends every rank.** Before a gather every rank reports ok or its error
  (:func:`run_everywhere`); a failure is raised on every rank with the failing rank's message, so no
  rank waits in a collective for a peer that will never come. A crashed process (SIGKILL, OOM) is
  torchrun's to handle: it stops the other workers.
* **Long timeout.** Ranks meet only at the end of a probe, which can take hours on a big model:
  the process-group timeout is ``HEADLENS_DIST_TIMEOUT`` seconds (default 6 h), not torch's 30 min.
* **Backends.** Statistics are small float64 CPU tensors and travel over gloo; when CUDA is present
  the group is ``cpu:gloo,cuda:nccl`` so GPU tensors go over NCCL, and each GPU rank runs on
  ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import datetime
import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from headlens.errors import HeadlensError

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 6 * 3600
_single = contextvars.ContextVar("headlens_single_process", default=False)


@dataclass(frozen=True)
class Rank:
    """This process's place in the job (one process: rank 0 of 1).

    Attributes:
        rank: global rank, 0 .. world_size - 1.
        world_size: number of processes in the job.
        local_rank: rank on this machine (picks the GPU).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 computes the statistics, writes files and talks to the user."""
        return self.rank == 0

    def block(self, n: int) -> range:
        """This rank's contiguous share of ``n`` rows (blocks differ in size by at most one).

        >>> Rank(1, 3).block(10)
        range(3, 6)
        """
        return range(n * self.rank // self.world_size, n * (self.rank + 1) // self.world_size)

    def batch_block(self, n: int, batch_size: int) -> range:
        """This rank's rows when whole batches of ``batch_size`` rows are dealt out in blocks.

        Every row stays in the batch it has in a single process, so float32 kernels see the same
        shapes and return the same bits.

        >>> Rank(1, 2).batch_block(12, 4)
        range(4, 12)
        """
        first = self.block(-(-n // batch_size))  # this rank's batches
        return range(min(first.start * batch_size, n), min(first.stop * batch_size, n))

    def device(self, device: str) -> str:
        """``cuda`` (and ``auto`` on a CUDA machine) means this rank's own GPU, ``cuda:LOCAL_RANK``,
        when there are several ranks."""
        name = str(device)
        if self.world_size > 1 and name == "auto":
            import torch

            name = "cuda" if torch.cuda.is_available() else name
        return f"cuda:{self.local_rank}" if self.world_size > 1 and name == "cuda" else name


def _timeout() -> datetime.timedelta:
    raw = os.environ.get("HEADLENS_DIST_TIMEOUT", str(DEFAULT_TIMEOUT_S))
    try:
        return datetime.timedelta(seconds=float(raw))
    except ValueError:
        raise HeadlensError(f"HEADLENS_DIST_TIMEOUT={raw!r} is not a number of seconds") from None


def _init_from_env(world_size: int) -> None:
    import torch
    import torch.distributed as dist

    backend = "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, init_method="env://", timeout=_timeout())
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())


def current() -> Rank:
    """This process's :class:`Rank`, initialising the process group from torchrun's environment once.

    Inside :func:`single_process` (a rank working alone, e.g. on its own checkpoint) it is rank 0 of 1.
    """
    if _single.get():
        return Rank()
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        return Rank(rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)))
    if world <= 1:
        return Rank()
    if not dist.is_available():
        raise HeadlensError(f"WORLD_SIZE={world} but this torch build has no torch.distributed")
    _init_from_env(world)
    return Rank(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def is_main() -> bool:
    """Whether this process talks to the user: rank 0, or any process not under torchrun.

    Reads the environment only (no process group is started), so the CLI can ask it first.
    """
    return _single.get() or int(os.environ.get("RANK", "0") or 0) == 0


@contextlib.contextmanager
def single_process() -> Iterator[None]:
    """Run the body as if alone: :func:`current` is rank 0 of 1, nothing is sharded or gathered."""
    token = _single.set(True)
    try:
        yield
    finally:
        _single.reset(token)


def _peer_error(status: tuple[str, str, str, int]) -> Exception:
    """Rebuild a peer's error: the same ``HeadlensError`` class and message where possible."""
    module, qualname, message, rank = status
    try:
        cls = getattr(importlib.import_module(module), qualname)
        if isinstance(cls, type) and issubclass(cls, HeadlensError):
            err = cls(message)
            err.peer_rank = rank  # type: ignore[attr-defined]
            return err
    except (ImportError, AttributeError, TypeError):
        pass
    return HeadlensError(f"rank {rank} failed: {qualname}: {message}")


def settle_before_exit(timeout_s: float = 10.0) -> None:
    """Before a rank exits on an error, wait briefly until every rank has got there too.

    torchrun ends the other workers as soon as one exits non-zero; without this, a loaded machine
    can kill a peer before it has printed the same error. A gloo barrier with a timeout, so a
    rank whose peers never arrive still exits; a no-op outside a process group.
    """
    import sys

    if "torch.distributed" not in sys.modules:  # never import torch just to exit
        return
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        if dist.is_initialized() and "gloo" in str(dist.get_backend()):
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))


def run_everywhere(rank: Rank, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on every rank; if it raises on any rank, raise on every rank.

    The failing rank re-raises its own exception; the others raise the same ``HeadlensError``
    class with the same message (or a ``HeadlensError`` naming the rank and error type).
    """
    try:
        out, err = fn(*args), None
    except Exception as e:
        out, err = None, e
    if rank.world_size == 1:
        if err is not None:
            raise err
        return out  # type: ignore[return-value]
    import torch.distributed as dist

    mine = None if err is None else (type(err).__module__, type(err).__qualname__, str(err), rank.rank)
    statuses: list[Any] = [None] * rank.world_size
    dist.all_gather_object(statuses, mine)
    if err is not None:
        raise err
    failed = [s for s in statuses if s is not None]
    if failed:
        raise _peer_error(failed[0])
    return out  # type: ignore[return-value]


def gather_rows(rank: Rank, rows: Any) -> Any:
    """Concatenate every rank's ``rows`` ``(n_r, ...)`` in rank order on rank 0; None on the others.

    Shapes past the first must agree; ``n_r`` may differ (padded for the transfer, cut after).
    """
    if rank.world_size == 1:
        return rows
    import torch
    import torch.distributed as dist

    n = torch.tensor([rows.shape[0]], dtype=torch.long)
    counts = [torch.zeros_like(n) for _ in range(rank.world_size)]
    dist.all_gather(counts, n)
    longest = int(max(counts))
    padded = rows.new_zeros(longest, *rows.shape[1:])  # (longest, ...): this rank's rows, then zeros
    padded[: rows.shape[0]] = rows
    bufs = [torch.empty_like(padded) for _ in range(rank.world_size)] if rank.is_main else None
    dist.gather(padded, bufs, dst=0)
    if not rank.is_main:
        return None
    return torch.cat([b[: int(c)] for b, c in zip(bufs, counts, strict=True)])


def gather_objects(rank: Rank, items: list[Any]) -> list[Any] | None:
    """Every rank's list of picklable ``items`` joined in rank order on rank 0; None on the others."""
    if rank.world_size == 1:
        return list(items)
    import torch.distributed as dist

    out: list[Any] | None = [None] * rank.world_size if rank.is_main else None
    dist.gather_object(list(items), out, dst=0)
    return None if out is None else [x for part in out for x in part]


# -- the data-parallel scan -------------------------------------------------------------------------
def _sub_probe(probe: Any, rows: range) -> Any:
    from headlens.probes.base import Probe

    return Probe(probe.name, probe.prompts[rows.start:rows.stop],
                 {k: v[rows.start:rows.stop] for k, v in probe.annotations.items()}, probe.settings)


def _scan_rows(model: Any, probe: Any, detectors: Any, rows: range, batch_size: int, progress: Any,
               store: Any, path: str) -> tuple[Any, set[str]]:
    """``(n, D, L*H + 2)`` float64 for ``rows`` (per detector its sums, then count and baseline), and the
    scan paths the batches took.

    With a ``store``, each batch is one shard: read when it is there, else scanned and written.
    """
    import torch

    from headlens.scoring.scan import scan

    chunk = batch_size if store is not None else max(len(rows), 1)
    parts, paths = [], set()
    for start in range(rows.start, rows.stop, chunk):
        part = range(start, min(start + chunk, rows.stop))
        key = f"{probe.name}-{part.start}-{part.stop}"
        stored = store.load(key) if store is not None else None
        if stored is not None:
            tensors, meta = stored
            packed = tensors["rows"]
            paths.add(meta.get("scan_path", "none"))
            if progress is not None:
                progress(len(part))
        else:
            info: dict[str, Any] = {}
            stats = scan(model, _sub_probe(probe, part), detectors, batch_size, progress, path=path, info=info)
            packed = torch.stack([torch.cat([s.sums.flatten(1), s.counts[:, None], s.baseline[:, None]], 1)
                                  for s in (stats[d.name] for d in detectors)], dim=1)  # (n, D, L*H + 2)
            paths.update(info["scan_path"].split("+"))
            if store is not None:
                store.save(key, {"rows": packed}, probe=probe.name, start=part.start, stop=part.stop,
                           scan_path=info["scan_path"])
        parts.append(packed)
    if not parts:
        return torch.zeros(0, len(detectors), model.n_layers * model.n_heads + 2, dtype=torch.float64), paths
    return torch.cat(parts), paths


def scan_blocks(model: Any, probe: Any, detectors: Any, batch_size: int = 32, progress: Any = None,
                rank: Rank | None = None, store: Any = None, path: str = "auto",
                info: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """:func:`headlens.scoring.scan.scan` of this rank's block of batches, gathered on rank 0.

    Args:
        model, probe, detectors, batch_size, progress, path, info: as for :func:`headlens.scoring.scan.scan`
            (``info["scan_path"]`` joins the paths every rank took).
        rank: this process's :class:`Rank` (default :func:`current`).
        store: a :class:`headlens.scoring.resume.ShardStore`: finished batches are read back, new ones written.

    Returns:
        detector name -> ``DetectorStats`` over every prompt (single-process order) on rank 0;
        None on the other ranks.
    """
    from headlens.scoring.engine import DetectorStats

    rank = rank or current()
    L, H = model.n_layers, model.n_heads
    rows = rank.batch_block(len(probe), batch_size)
    mine, paths = run_everywhere(rank, _scan_rows, model, probe, detectors, rows, batch_size, progress, store, path)
    every = gather_rows(rank, mine)  # (P, D, L*H + 2) on rank 0
    all_paths = gather_objects(rank, sorted(paths))
    if every is None:
        return None
    if info is not None:
        info["scan_path"] = "+".join(sorted(set(all_paths) - {"none"})) or "none"
    return {d.name: DetectorStats(every[:, i, : L * H].reshape(-1, L, H), every[:, i, L * H],
                                  every[:, i, L * H + 1]) for i, d in enumerate(detectors)}
