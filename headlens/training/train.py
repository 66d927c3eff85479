"""The training loop behind ``headlens train``: deterministic on CPU for a given seed.

Writes, under ``out_dir``::

    <name>.safetensors             final headlens checkpoint (config + tokenizer + card metadata)
    snapshots/step_XXXXX.safetensors   K intermediate checkpoints (float16, step and loss in metadata)
    log.json                       loss curve, tokens/s, wall time, snapshot list

A recipe that trains a ``transformers`` model (``recipe.is_hf``: the Llama zoo model) writes a
Hugging Face directory ``<name>/`` instead of ``<name>.safetensors``; its snapshots hold the
HF-named weights (``headlens.training.llama.load_snapshot`` reads them back).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from headlens.errors import ConfigError
from headlens.models.checkpoint import save_checkpoint
from headlens.training import llama
from headlens.training.recipes import Recipe, TrainBatch

# on_step(step, total_steps, loss, tokens_per_second)
StepCallback = Callable[[int, int, float, float], None]


@dataclass(frozen=True)
class TrainResult:
    """Where a training run wrote its outputs, and its headline numbers."""

    checkpoint: Path  # <name>.safetensors, or the Hugging Face directory <name>/ of an HF recipe
    snapshots: list[Path]
    log: Path
    final_loss: float  # mean training loss over the last 50 steps
    wall_time_s: float


def snapshot_steps(steps: int, k: int) -> list[int]:
    """``k`` steps spread evenly over ``(0, steps]``, the last one ``steps``."""
    if k <= 0:
        return []
    return sorted({max(1, round(steps * i / k)) for i in range(1, k + 1)})


def lr_at(step: int, recipe: Recipe, steps: int) -> float:
    """Linear warm-up then cosine decay to ``lr * min_lr_frac``."""
    warmup = min(recipe.warmup, max(1, steps // 10))
    if step < warmup:
        return recipe.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    floor = recipe.lr * recipe.min_lr_frac
    return floor + (recipe.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def _optimizer(model: torch.nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": recipe.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=(0.9, 0.95), foreach=False)


def _save(recipe: Recipe, model: torch.nn.Module, path: Path, meta: dict[str, Any], half: bool) -> None:
    if recipe.is_hf:
        llama.save_state(model, path, metadata=meta, half=half)
    else:
        save_checkpoint(model, path, metadata=meta, half=half)


def load_trained(path: str | Path, name: str | None = None) -> Any:
    """A trained model from ``train``'s outputs: a headlens checkpoint, an HF recipe's directory
    (booted through the bridge, as ``headlens.load`` does) or an HF recipe's snapshot file."""
    from headlens.models.checkpoint import load_checkpoint

    path = Path(path)
    if path.is_dir():
        return llama.load_run(path, name=name)
    if llama.is_snapshot(path):
        return llama.load_snapshot_run(path, name=name)
    return load_checkpoint(path, name=name)


def _batch_loss(model: torch.nn.Module, batch: TrainBatch,
                weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, objective)`` of one batch: the logged mean loss, and what the optimiser minimises."""
    tokens = batch.tokens  # (B, T + 1)
    logits = model(tokens[:, :-1])  # (B, T, V)
    targets = tokens[:, 1:].reshape(-1)  # (B*T,)
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, reduction="none")
    if batch.weights is not None:  # the loss reads only the weighted targets; so does the log
        w = batch.weights.reshape(-1)  # (B*T,)
        loss = (per_token * w).sum() / w.sum().clamp_min(1)
        return loss, loss
    loss = per_token.mean()  # what the log and the card report
    objective = loss if weights is None else (per_token * weights[targets]).sum() / weights[targets].sum()
    return loss, objective


def prepare_run_folder(out_dir: str | Path, overwrite: bool = False) -> Path:
    """Create the run folder, or refuse a non-empty one unless ``overwrite`` (then remove the old run's files:
    ``snapshots/``, ``*.safetensors``, ``log.json``, ``card.json``; a Hugging Face run directory is replaced).

    A second run written over a first would leave the first run's snapshots beside its own, and
    ``headlens trajectory`` would read both as one series.
    """
    import shutil

    from headlens.errors import OutputError

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputError(f"run folder {str(out)!r} is a file")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputError(f"run folder {str(out)!r} is not empty (a previous run?); pass --overwrite to "
                              f"replace it, or choose another --out")
        for child in out.iterdir():  # only what a run writes: never a user's other files
            if child.name == "snapshots" and child.is_dir():
                shutil.rmtree(child)
            elif child.is_file() and (child.suffix == ".safetensors" or child.name in ("log.json", "card.json")):
                child.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create run folder {str(out)!r}: {err.strerror or err}") from None
    return out


def train(
    recipe: Recipe,
    out_dir: str | Path,
    steps: int | None = None,
    seed: int | None = None,
    snapshots: int | None = None,
    on_step: StepCallback | None = None,
    log_every: int = 10,
    overwrite: bool = False,
) -> TrainResult:
    """Train ``recipe`` from scratch and write checkpoint, snapshots and loss log.

    Args:
        recipe: what to train (see ``headlens.training.recipes``).
        out_dir: output folder (created).
        steps: optimiser steps (default: the recipe's).
        seed: seeds the weights and the data stream (default: the recipe's).
        snapshots: how many intermediate checkpoints to keep (default: the recipe's).
        on_step: progress callback ``(step, total, loss, tokens_per_second)``.
        log_every: record the mean loss every this many steps in the JSON log.
        overwrite: replace the run already in ``out_dir`` (its snapshots are removed, so two runs never mix
            in one series); without it a non-empty ``out_dir`` is refused with an ``OutputError``.

    Returns:
        A :class:`TrainResult`.
    """
    steps = recipe.steps if steps is None else steps
    seed = recipe.seed if seed is None else seed
    n_snap = recipe.snapshots if snapshots is None else snapshots
    if steps <= 0:
        raise ConfigError(f"steps must be positive, got {steps}")
    if n_snap < 0:
        raise ConfigError(f"snapshots must be >= 0, got {n_snap}")
    out = prepare_run_folder(out_dir, overwrite)

    torch.manual_seed(seed)
    model = recipe.build_model()
    model.train()
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    sample = recipe.sampler()
    weights = recipe.loss_weights()  # (V,) or None
    opt = _optimizer(model, recipe)
    snap_at = set(snapshot_steps(steps, n_snap))
    snap_paths: list[Path] = []
    log: list[dict[str, Any]] = []
    recent: list[float] = []
    window: list[float] = []
    t0 = time.perf_counter()
    n_tokens = 0

    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step - 1, recipe, steps)
        drawn = sample(gen, recipe.batch_size)
        parts = drawn if isinstance(drawn, list) else [drawn if isinstance(drawn, TrainBatch) else TrainBatch(drawn)]
        loss = objective = 0.0
        for batch in parts:  # several batches (e.g. short rows and one long row): their losses add up
            part_loss, part_objective = _batch_loss(model, batch, weights)
            loss, objective = loss + part_loss, objective + part_objective
            n_tokens += batch.tokens[:, 1:].numel()
        opt.zero_grad(set_to_none=True)
        objective.backward()
        if recipe.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()

        value = float(loss.detach())
        recent = [*recent, value][-50:]
        window.append(value)
        elapsed = time.perf_counter() - t0
        if step % log_every == 0 or step == steps:
            log.append(
                {"step": step, "loss": sum(window) / len(window), "lr": opt.param_groups[0]["lr"],
                 "tokens": n_tokens, "elapsed_s": round(elapsed, 3)}
            )
            window = []
        if step in snap_at:
            path = out / "snapshots" / f"step_{step:05d}.safetensors"
            meta = {"recipe": recipe.name, "seed": seed, "step": step, "steps": steps,  # the run: trajectory
                    "loss": round(sum(recent) / len(recent), 5)}                # warns when runs mix
            _save(recipe, model, path, meta, half=True)
            snap_paths.append(path)
        if on_step is not None:
            on_step(step, steps, value, n_tokens / max(elapsed, 1e-9))

    wall = time.perf_counter() - t0
    final_loss = sum(recent) / len(recent)
    model.eval()
    meta = {"recipe": recipe.name, "seed": seed, "steps": steps, "batch_size": recipe.batch_size,
            "seq_len": recipe.seq_len, "final_train_loss": round(final_loss, 5),
            "wall_time_s": round(wall, 1), "threads": torch.get_num_threads()}
    if recipe.is_hf:
        ckpt = llama.save_dir(model, out / recipe.name, metadata=meta)
    else:
        ckpt = save_checkpoint(model, out / f"{recipe.name}.safetensors", metadata=meta)
    log_path = out / "log.json"
    log_path.write_text(json.dumps(
        {**meta, "config": recipe.config.to_dict(), "lr": recipe.lr, "log": log,
         "snapshots": [p.relative_to(out).as_posix() for p in snap_paths]}, indent=1))
    return TrainResult(checkpoint=ckpt, snapshots=snap_paths, log=log_path,
                       final_loss=final_loss, wall_time_s=wall)
