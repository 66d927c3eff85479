"""The classic silent bug: a checkpoint loaded into a model configured with another head count.

Takes a model (a zoo model, or the doctor's tiny shifted-copy model trained on the spot), saves
it with a *lying* ``n_heads`` in its header, and shows that

1. it loads and runs without a word of complaint (same weight shapes),
2. its loss is much worse,
3. its attention patterns are scrambled (interactive figure: true split vs wrong split),
4. ``headlens doctor`` catches it: exit code 8 and the true head count.

    python analyses/wrong_n_heads.py [--model induction-2l] [--wrong-n-heads 8] [--out artifacts/wrong_n_heads]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch


def subject(model_ref: str | None):
    """(model, evaluation texts or None for the doctor's defaults, checkpoint path or None)."""
    from headlens.models.checkpoint import load_checkpoint
    from headlens.zoo import ZOO, weights_dir

    candidates = [Path(model_ref)] if model_ref else []
    if model_ref in ZOO:
        candidates.append(ZOO[model_ref].path)
    if model_ref:
        candidates.append(weights_dir() / f"{model_ref}.safetensors")
    for path in candidates:
        if path.is_file():
            return load_checkpoint(path, name=model_ref), None, path
    from headlens.doctor.demo import shifted_copy_texts, train_shifted_copy

    print(f"zoo model {model_ref!r} not installed; training the tiny shifted-copy model (~10 s)")
    return train_shifted_copy(), shifted_copy_texts(), None


def pattern_grid(models: dict[str, object], tokens: torch.Tensor, layer: int):
    """One row of per-head attention heatmaps per model (same prompt, same layer)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    patterns = {}
    for label, model in models.items():
        _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.attn.hook_pattern")
        patterns[label] = cache[f"blocks.{layer}.attn.hook_pattern"][0]  # (H, Q, K)
    n_cols = max(p.shape[0] for p in patterns.values())
    titles = [f"{label}: L{layer}H{h}" if h < p.shape[0] else "" for label, p in patterns.items() for h in range(n_cols)]
    fig = make_subplots(rows=len(models), cols=n_cols, subplot_titles=titles, horizontal_spacing=0.01,
                        vertical_spacing=0.08)
    for r, p in enumerate(patterns.values(), start=1):
        for h in range(p.shape[0]):
            fig.add_trace(go.Heatmap(z=p[h].numpy(), colorscale="Blues", zmin=0, zmax=1, showscale=False),
                          row=r, col=h + 1)
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(title=f"attention patterns, layer {layer}: trained split (top) vs wrong split (bottom)",
                      height=260 * len(models), width=max(700, 140 * n_cols))
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="induction-2l", help="zoo name or .safetensors path")
    parser.add_argument("--wrong-n-heads", type=int, default=0, help="head count to lie with (default 2x)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/wrong_n_heads"))
    args = parser.parse_args()
    torch.set_num_threads(1)

    from headlens.doctor import check_checkpoint
    from headlens.doctor.checkpoint import evaluation_tokens, loss_with_heads, read_weights, text_tokens
    from headlens.doctor.demo import save_with_claimed_heads
    from headlens.models.checkpoint import load_checkpoint, load_metadata, save_checkpoint

    model, texts, source = subject(args.model)
    true_h, d_model = model.cfg.n_heads, model.cfg.d_model
    wrong_h = args.wrong_n_heads or (2 * true_h if d_model % (2 * true_h) == 0 else true_h // 2)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = load_metadata(source) if source else {}  # keeps the recipe name: the doctor evaluates on its data
    honest = save_checkpoint(model, args.out / "honest.safetensors", metadata=meta)
    lying = save_with_claimed_heads(model, args.out / "lying.safetensors", wrong_h, metadata=meta)

    # 1. it loads and runs
    broken = load_checkpoint(lying)
    weights = read_weights(honest)
    rows = text_tokens(weights, texts) if texts else [evaluation_tokens(weights)[0]]
    with torch.inference_mode():
        logits = broken(rows[0][:, :-1])
    print(f"loaded {lying.name} with n_heads={broken.cfg.n_heads} (trained with {true_h}): "
          f"no error, logits {tuple(logits.shape)}, all finite: {bool(torch.isfinite(logits).all())}")

    # 2. how much worse
    loss_true, loss_wrong = loss_with_heads(weights, true_h, rows), loss_with_heads(weights, wrong_h, rows)
    print(f"loss with the trained split ({true_h} heads): {loss_true:.3f} nats; "
          f"with the lying config ({wrong_h} heads): {loss_wrong:.3f} nats (+{loss_wrong - loss_true:.3f})")

    # 3. scrambled patterns
    prompt = rows[0][:1, : min(rows[0].shape[1], 40)]
    fig = pattern_grid({f"{true_h} heads": model, f"{wrong_h} heads": broken}, prompt, layer=model.cfg.n_layers - 1)
    fig.write_html(args.out / "patterns.html", include_plotlyjs=True)  # viewable offline

    # 4. the doctor catches it (library call, then the real command line)
    results = {}
    for name, path in (("honest", honest), ("lying", lying)):
        t0 = time.perf_counter()
        report = check_checkpoint(path, texts=texts)
        results[name] = {**report.to_dict(), "wall_s": round(time.perf_counter() - t0, 2)}
        print(report)
    cmd = [sys.executable, "-m", "headlens", "doctor", str(lying), "--json"]
    if texts:
        (args.out / "eval.txt").write_text("\n".join(texts) + "\n")
        cmd += ["--text", str(args.out / "eval.txt")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(f"$ headlens doctor {lying} --json  -> exit code {proc.returncode}")
    summary = {"model": getattr(model, "name", "model"), "true_n_heads": true_h, "wrong_n_heads": wrong_h,
               "loss_true": loss_true, "loss_wrong": loss_wrong, "cli_exit_code": proc.returncode,
               "doctor": results}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.out}/patterns.html and summary.json")


if __name__ == "__main__":
    main()
