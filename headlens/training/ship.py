"""Ship a finished training run into the package: weights, snapshots and model card.

``python -m headlens.training.ship RUN_DIR [--notes TEXT]`` copies the run's checkpoint into
``headlens/zoo/weights/`` (a Hugging Face directory for HF recipes) as float16 (after checking that every head score moves by
less than 0.01), its snapshots into ``weights/<name>-snapshots/``, and writes
``cards/<name>.json`` and ``cards/<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from headlens.models.checkpoint import load_checkpoint, load_metadata, save_checkpoint
from headlens.training import llama
from headlens.training.evaluate import EVALUATORS
from headlens.training.recipes import Recipe, get_recipe
from headlens.training.train import load_trained
from headlens.zoo import cards_dir, weights_dir

CARDS_DIR = cards_dir()  # the cards ship with the zoo
HALF_TOLERANCE = 0.01


def _max_score_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest absolute difference between two nested score dicts."""
    if isinstance(a, dict):
        return max((_max_score_diff(a[k], b[k]) for k in a), default=0.0)
    return abs(float(a) - float(b))


def _read_metadata(ckpt: Path) -> dict[str, Any]:
    """Training metadata of a headlens checkpoint, or of an HF recipe's snapshot file or directory."""
    if ckpt.is_dir() or llama.is_snapshot(ckpt):
        return llama.read_metadata(ckpt)
    return load_metadata(ckpt)


def _write_weights(recipe: Recipe, ckpt: Path, meta: dict[str, Any], half: bool) -> Path:
    """Copy ``ckpt`` into ``weights/``: ``<name>.safetensors``, or the directory ``<name>/`` for HF recipes."""
    if recipe.is_hf:
        dest = weights_dir() / recipe.name
        shutil.rmtree(dest, ignore_errors=True)
        return llama.save_dir(llama.load_snapshot(ckpt), dest, metadata=meta, half=half)
    dest = weights_dir() / f"{recipe.name}.safetensors"
    save_checkpoint(load_checkpoint(ckpt, name=recipe.name), dest, metadata=meta, half=half)
    return dest


def ship(run_dir: str | Path, notes: str = "", snapshot: str = "", wall_time_s: float = 0.0,
         schedule_steps: int = 0, with_snapshots: bool = False) -> dict[str, Any]:
    """Copy a run into the package and write its card; returns the card dict.

    Args:
        run_dir: a ``headlens train`` output folder.
        notes: free text for the card.
        snapshot: ship this snapshot (``step_XXXXX.safetensors``) instead of the final checkpoint,
            e.g. when the run had to be stopped early; it is reproduced bit for bit by re-running
            the recipe with the same ``--steps`` (the schedule) and taking that snapshot.
        wall_time_s: wall time to report when the run left no ``log.json``.
        schedule_steps: the run's ``--steps`` when it left no ``log.json``.
        with_snapshots: also ship the run's training snapshots (for the phase-change view).
    """
    run = Path(run_dir)
    log_path = run / "log.json"
    if snapshot:
        ckpt = run / "snapshots" / snapshot
        meta = _read_metadata(ckpt)
        name = meta["recipe"]
    else:
        name = json.loads(log_path.read_text())["recipe"]
        ckpt = run / name if get_recipe(name).is_hf else run / f"{name}.safetensors"
    recipe = get_recipe(name)
    if log_path.is_file():
        log = json.loads(log_path.read_text())
    else:  # stopped run: rebuild what the card needs from the recipe
        log = {"seed": meta["seed"], "steps": schedule_steps or recipe.steps, "batch_size": recipe.batch_size,
               "seq_len": recipe.seq_len, "lr": recipe.lr, "config": recipe.config.to_dict(),
               "wall_time_s": wall_time_s, "threads": 1, "final_train_loss": meta["loss"], "log": []}
    trained_steps = meta["step"] if snapshot else log["steps"]
    tokens_seen = trained_steps * log["batch_size"] * log["seq_len"]
    final_loss = meta["loss"] if snapshot else log["final_train_loss"]
    reproduce = f"headlens train {name} --seed {log['seed']} --steps {log['steps']}"
    if log.get("threads", 1) != 1:  # bit for bit only on as many threads as the run had
        reproduce += f" --threads {log['threads']}"
    if snapshot:
        reproduce += f" (then take snapshots/{snapshot})"
    evaluate = EVALUATORS[name]
    src_meta = {**_read_metadata(ckpt), "shipped_from": snapshot or "final"}
    full = evaluate(load_trained(ckpt, name=name))
    dest = _write_weights(recipe, ckpt, src_meta, half=True)
    half = evaluate(load_trained(dest, name=name))
    diff = _max_score_diff(full["scores"], half["scores"])
    if diff >= HALF_TOLERANCE:  # keep float32 when half precision moves a score
        dest = _write_weights(recipe, ckpt, src_meta, half=False)
        half = full
    size = sum(f.stat().st_size for f in dest.iterdir()) if dest.is_dir() else dest.stat().st_size
    snaps = sorted((run / "snapshots").glob("step_*.safetensors"))
    if snapshot or not with_snapshots:
        snaps = []
    snap_dir = weights_dir() / f"{name}-snapshots"
    if snaps:
        shutil.rmtree(snap_dir, ignore_errors=True)
        snap_dir.mkdir(parents=True)
        for s in snaps:
            shutil.copy2(s, snap_dir / s.name)
    card = {
        "name": name,
        "recipe": name,
        "summary": recipe.summary,
        "reproduce": reproduce,
        "config": log["config"],
        "tokenizer": recipe.tokenizer.to_spec(),
        "seed": log["seed"],
        "steps": log["steps"],
        "trained_steps": trained_steps,
        "batch_size": log["batch_size"],
        "seq_len": log["seq_len"],
        "lr": log["lr"],
        "tokens_seen": tokens_seen,
        "wall_time_s": log["wall_time_s"],
        "threads": log["threads"],
        "final_train_loss": final_loss,
        "weights": {"file": dest.name, "format": "hf" if recipe.is_hf else "headlens",
                    "dtype": "float32" if half is full else "float16",
                    "bytes": size, "max_score_change_vs_float32": round(diff, 5)},
        "snapshots": [s.name for s in snaps],
        "evaluation": half,
        "notes": notes,
    }
    CARDS_DIR.mkdir(exist_ok=True)
    (CARDS_DIR / f"{name}.json").write_text(json.dumps(card, indent=1) + "\n")
    (CARDS_DIR / f"{name}.md").write_text(render_markdown(card))
    return card


def score_key(detector: str, scores: dict[str, Any]) -> str:
    """The score table a card's head list was thresholded on."""
    if detector == "bracket_matching" and "bracket_matching_hard" in scores and "first_token" not in scores:
        return "bracket_matching_hard"  # the dyck card thresholds on the hard subset
    if detector == "bracket_matching_from_position_before":
        return "bracket_matching_hard_from_position_before"
    return detector if detector in scores else f"{detector}_min_over_lengths"


def _config_line(cfg: dict[str, Any]) -> str:
    if cfg.get("architecture") == "llama":
        return (f"- config: LlamaForCausalLM, {cfg['n_layers']} layers, {cfg['n_heads']} query heads / "
                f"{cfg['n_kv_heads']} key-value heads (GQA), d_head {cfg['d_head']}, d_model {cfg['d_model']}, "
                f"SwiGLU d_mlp {cfg['d_mlp']}, RMSNorm, RoPE (theta {cfg['rope_theta']:g}), "
                f"n_ctx {cfg['n_ctx']}, d_vocab {cfg['d_vocab']}")
    return (f"- config: {cfg['n_layers']} layers, {cfg['n_heads']} heads, d_model {cfg['d_model']}, "
            f"n_ctx {cfg['n_ctx']}, d_vocab {cfg['d_vocab']}, attn_only={cfg['attn_only']}, "
            f"normalization={cfg['normalization']}")


def render_markdown(card: dict[str, Any]) -> str:
    """A human-readable model card."""
    ev = card["evaluation"]
    cfg = card["config"]
    lines = [
        f"# `{card['name']}` model card", "",
        card["summary"], "",
        f"Reproduce: `{card['reproduce']}`"
        + (" (single thread: `--threads 1`, the default)." if card["threads"] == 1 else
           f" ({card['threads']} threads; other thread counts reproduce it within float noise, not bit for bit)."),
        "",
        "## Training", "",
        _config_line(cfg),
        f"- tokenizer: {card['tokenizer']['kind']}"
        + (f" over {card['tokenizer']['alphabet']!r}" if card["tokenizer"]["alphabet"] else ""),
        f"- seed {card['seed']}, {card['trained_steps']} steps (of a {card['steps']}-step schedule) x batch {card['batch_size']} x {card['seq_len']} tokens "
        f"({card['tokens_seen']:,} tokens), AdamW lr {card['lr']}",
        f"- wall time {card['wall_time_s']:.0f} s on {card['threads']} thread(s) of a shared 2-core CPU",
        f"- final training loss (mean of last 50 steps): {card['final_train_loss']:.4f}",
        f"- weights: `{card['weights']['file']}`{'/ (Hugging Face directory)' if card['weights'].get('format') == 'hf' else ''} ({card['weights']['dtype']}, "
        f"{card['weights']['bytes'] / 1e6:.2f} MB; largest head-score change vs float32 "
        f"{card['weights']['max_score_change_vs_float32']})",
        f"- snapshots: {len(card['snapshots'])}", "",
        "## Evaluation", "",
        f"Probe: {ev['probe']}", "",
    ]
    for key, value in ev.items():
        if key not in ("scores", "heads", "probe"):
            lines += [f"- {key}:", *(f"  - {v}" for v in value)] if isinstance(value, list) else [f"- {key}: {value}"]
    lines += ["", "## Heads found (direct pattern measurement)", ""]
    for det, heads in ev["heads"].items():
        key = score_key(det, ev["scores"])
        if det == "bracket_matching" and "bracket_matching_hard" in ev["scores"]:
            scored = ", ".join(
                f"{h} ({ev['scores']['bracket_matching'][h]:.3f}, hard {ev['scores']['bracket_matching_hard'][h]:.3f})"
                for h in heads
            )
        else:
            scored = ", ".join(f"{h} ({ev['scores'][key][h]:.3f})" for h in heads)
        lines.append(f"- {det}: {scored or 'none above threshold'}")
    lines += ["", "## All scores", ""]
    for key, table in ev["scores"].items():
        if isinstance(next(iter(table.values())), dict):
            continue
        lines.append(f"- {key}: " + ", ".join(f"{h} {v:.3f}" for h, v in table.items()))
    if card["notes"]:
        lines += ["", "## Notes", "", card["notes"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("--notes", default="")
    parser.add_argument("--snapshot", default="")
    parser.add_argument("--wall-time-s", type=float, default=0.0)
    parser.add_argument("--schedule-steps", type=int, default=0)
    parser.add_argument("--with-snapshots", action="store_true")
    args = parser.parse_args()
    card = ship(args.run_dir, args.notes, args.snapshot, args.wall_time_s, args.schedule_steps, args.with_snapshots)
    print(json.dumps({k: card[k] for k in ("name", "weights", "wall_time_s")}, indent=1))
    print(json.dumps(card["evaluation"]["heads"], indent=1))


if __name__ == "__main__":
    main()
