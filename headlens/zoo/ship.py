"""Ship a finished training run into the package: weights, snapshots and model card.

``python -m headlens.zoo.ship RUN_DIR [--notes TEXT]`` copies the run's checkpoint into
``headlens/zoo/weights/`` as float16 (after checking that every head score moves by
less than 0.01), its snapshots into ``weights/<name>-snapshots/``, and writes
``cards/<name>.json`` and ``cards/<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from headlens.checkpoint import load_checkpoint, load_metadata, save_checkpoint
from headlens.zoo import weights_dir
from headlens.zoo.evaluate import EVALUATORS
from headlens.zoo.recipes import get_recipe

CARDS_DIR = Path(__file__).parent / "cards"
HALF_TOLERANCE = 0.01


def _max_score_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest absolute difference between two nested score dicts."""
    if isinstance(a, dict):
        return max((_max_score_diff(a[k], b[k]) for k in a), default=0.0)
    return abs(float(a) - float(b))


def ship(run_dir: str | Path, notes: str = "") -> dict[str, Any]:
    """Copy a run into the package and write its card; returns the card dict."""
    run = Path(run_dir)
    log = json.loads((run / "log.json").read_text())
    name = log["recipe"]
    recipe = get_recipe(name)
    ckpt = run / f"{name}.safetensors"
    evaluate = EVALUATORS[name]
    full = evaluate(load_checkpoint(ckpt))
    dest = weights_dir() / f"{name}.safetensors"
    save_checkpoint(load_checkpoint(ckpt, name=name), dest, metadata=load_metadata(ckpt), half=True)
    half = evaluate(load_checkpoint(dest))
    diff = _max_score_diff(full["scores"], half["scores"])
    if diff >= HALF_TOLERANCE:  # keep float32 when half precision moves a score
        save_checkpoint(load_checkpoint(ckpt, name=name), dest, metadata=load_metadata(ckpt), half=False)
        half = full
    snaps = sorted((run / "snapshots").glob("step_*.safetensors"))
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
        "reproduce": f"headlens train {name} --seed {log['seed']} --steps {log['steps']}",
        "config": log["config"],
        "tokenizer": recipe.tokenizer.to_spec(),
        "seed": log["seed"],
        "steps": log["steps"],
        "batch_size": log["batch_size"],
        "seq_len": log["seq_len"],
        "lr": log["lr"],
        "tokens_seen": log["log"][-1]["tokens"],
        "wall_time_s": log["wall_time_s"],
        "threads": log["threads"],
        "final_train_loss": log["final_train_loss"],
        "weights": {"file": dest.name, "dtype": "float32" if half is full else "float16",
                    "bytes": dest.stat().st_size, "max_score_change_vs_float32": round(diff, 5)},
        "snapshots": [s.name for s in snaps],
        "evaluation": half,
        "notes": notes,
    }
    CARDS_DIR.mkdir(exist_ok=True)
    (CARDS_DIR / f"{name}.json").write_text(json.dumps(card, indent=1) + "\n")
    (CARDS_DIR / f"{name}.md").write_text(render_markdown(card))
    return card


def render_markdown(card: dict[str, Any]) -> str:
    """A human-readable model card."""
    ev = card["evaluation"]
    cfg = card["config"]
    lines = [
        f"# `{card['name']}` model card", "",
        card["summary"], "",
        f"Reproduce: `{card['reproduce']}` (single thread: `--threads 1`, the default).", "",
        "## Training", "",
        f"- config: {cfg['n_layers']} layers, {cfg['n_heads']} heads, d_model {cfg['d_model']}, "
        f"n_ctx {cfg['n_ctx']}, d_vocab {cfg['d_vocab']}, attn_only={cfg['attn_only']}, "
        f"normalization={cfg['normalization']}",
        f"- tokenizer: {card['tokenizer']['kind']}"
        + (f" over {card['tokenizer']['alphabet']!r}" if card["tokenizer"]["alphabet"] else ""),
        f"- seed {card['seed']}, {card['steps']} steps x batch {card['batch_size']} x {card['seq_len']} tokens "
        f"({card['tokens_seen']:,} tokens), AdamW lr {card['lr']}",
        f"- wall time {card['wall_time_s']:.0f} s on {card['threads']} thread(s) of a shared 2-core CPU",
        f"- final training loss (mean of last 50 steps): {card['final_train_loss']:.4f}",
        f"- weights: `{card['weights']['file']}` ({card['weights']['dtype']}, "
        f"{card['weights']['bytes'] / 1e6:.2f} MB; largest head-score change vs float32 "
        f"{card['weights']['max_score_change_vs_float32']})",
        f"- snapshots: {len(card['snapshots'])}", "",
        "## Evaluation", "",
        f"Probe: {ev['probe']}", "",
    ]
    for key, value in ev.items():
        if key not in ("scores", "heads", "probe"):
            lines.append(f"- {key}: {value}")
    lines += ["", "## Heads found (direct pattern measurement)", ""]
    for det, heads in ev["heads"].items():
        key = det if det in ev["scores"] else f"{det}_min_over_lengths"
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
    args = parser.parse_args()
    card = ship(args.run_dir, args.notes)
    print(json.dumps({k: card[k] for k in ("name", "weights", "wall_time_s")}, indent=1))
    print(json.dumps(card["evaluation"]["heads"], indent=1))


if __name__ == "__main__":
    main()
