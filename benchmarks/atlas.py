"""The atlas's exemplar pass against plain forwards over the same tokens, and what it says of SmolLM2's heads.

Side by side on one model and one set of corpus windows:

1. plain forwards (``model(tokens)``, no hooks) over the pass's windows, batch by batch;
2. the exemplar pass (:func:`headlens.atlas.shards.sharded_pass`, as ``headlens atlas`` runs it) over the
   same windows: patterns, DLA to the next token and every head's write, the running top-k merge, and the
   promoted/suppressed tokens of the surviving exemplars;
3. the descriptions (mixtures fit on pass windows, scored on the held-out ones), the substitution test
   (:mod:`headlens.atlas.substitute`) and the site (:func:`headlens.atlas.site.write_site`), timed apart,
   as :func:`headlens.atlas.build.build_atlas` runs them (its ``stage`` callback marks each phase); the
   whole against plain forwards over every window the atlas reads (pass and held out).

Then the roles of the known heads (SmolLM2: L18H6 and L17H4 induction, L16H0 previous token,
L23H3 and L24H4 copy suppression), how many heads get each role and carry a tested description, the loss with
every described head substituted at once against the clean loss, and the median share kept over the heads
whose mean ablation moves the loss by more than its own bootstrap interval.
Times are CPU seconds of this process (steadier than wall time on a shared machine). Peak memory: two
child processes, each loading the model and running one thing, their whole resident high-water marks
(``VmHWM``): the exemplar pass over the same windows, and a plain ``classify`` of the same model, the same
number of windows, length and batch size. Goals: pass <= 1.3x the forwards, peak <= 1.2x
the classify. Nothing asserts.

Run: ``flock /tmp/heavy.lock python benchmarks/atlas.py --model smollm2 --n-windows 96 --seq-len 128``.

``--describe-only`` times the descriptions alone on the held-out windows of that config (the exemplars their
OV readout reads come from a pass over the first ``--pass-windows`` pass windows only: the readout's cost is
per head, not per window), then prints each named head's agreement and CI width. ``--heldout N``: score the
first N held-out windows only (to time the same windows on two versions of the code); ``--max-heldout N``:
hold out up to N windows (the atlas holds out at most :data:`headlens.atlas.corpus.MAX_HELDOUT`).
``--no-key-pref``: the descriptions without key weights (:mod:`headlens.atlas.keypref`), as before them;
``--no-query-sink``: without the query factors (:mod:`headlens.atlas.querysink`). With ``--subst-windows``, the
write error of each description put back on those windows (``|W_O (z_subst - z)|^2 / |W_O z|^2``), its medians;
``--report FILE --write-error`` measures it for a saved run.

``--subst estimate|exact`` and ``--subst-exact N``: how each head's share kept is obtained (as ``headlens atlas``);
the report then sets the first-order estimates against the exact values over the heads run exactly (all of them
with ``--subst exact``). ``--report FILE``: print the report of a pickle ``--save`` wrote, nothing else.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import torch

import headlens
from headlens.atlas.build import build_atlas
from headlens.atlas.corpus import MAX_HELDOUT, corpus_windows, split
from headlens.atlas.describe import describe
from headlens.atlas.exemplars import AtlasConfig
from headlens.atlas.shards import sharded_pass
from headlens.atlas.site import write_site
from headlens.models.token_text import readable_tokens

NAMED = {"smollm2": {(18, 6): "induction", (17, 4): "induction", (16, 0): "previous_token",
                     (23, 3): "copy suppression", (24, 4): "copy suppression"}}


def _plain(model, windows, batch_size):
    with torch.inference_mode():
        for i in range(0, len(windows), batch_size):
            chunk = windows[i:i + batch_size]
            T = max(len(w) for w in chunk)
            ids = torch.zeros(len(chunk), T, dtype=torch.long)
            mask = torch.zeros(len(chunk), T, dtype=torch.long)
            for b, w in enumerate(chunk):
                ids[b, : len(w)], mask[b, : len(w)] = w, 1
            model(ids, attention_mask=mask)


def _peak() -> int:
    """This process's peak resident memory so far, in bytes (VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def _child_peak(args: argparse.Namespace, kind: str) -> int:
    """``kind`` (``"pass"`` or ``"classify"``) alone in a child process that loads the model: its VmHWM in bytes."""
    cmd = [sys.executable, __file__, "--child", kind, "--model", args.model, "--corpus", args.corpus,
           "--n-windows", str(args.n_windows), "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(json.loads(res.stdout.strip().splitlines()[-1])["peak"])


def _child(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    model = headlens.load(args.model)
    config = AtlasConfig(corpus=args.corpus, n_windows=args.n_windows, seq_len=args.seq_len,
                         batch_size=args.batch_size)
    seen, _ = split(corpus_windows(model, config.corpus, config.n_windows, config.seq_len, config.seed).prompts)
    if args.child == "pass":
        sharded_pass(model, seen, config)
    else:
        headlens.classify(model, n_prompts=len(seen), seq_len=args.seq_len, batch_size=args.batch_size)
    print(json.dumps({"peak": _peak()}))


def _describe_only(args: argparse.Namespace) -> None:
    from headlens.atlas.build import FIT_WINDOWS
    from headlens.atlas.describe import _classes
    from headlens.atlas.rules import candidate_rules
    from headlens.atlas.substitute import substitute

    torch.set_num_threads(1)
    model = headlens.load(args.model)
    config = AtlasConfig(corpus=args.corpus, n_windows=args.n_windows, seq_len=args.seq_len,
                         batch_size=args.batch_size)
    windows = corpus_windows(model, config.corpus, config.n_windows, config.seq_len, config.seed).prompts
    seen, held = split(windows, max_heldout=args.max_heldout)
    held = held[: args.heldout]
    ex = sharded_pass(model, seen[: args.pass_windows], config)
    strings = readable_tokens(model, torch.arange(int(model.cfg.d_vocab)))
    n_fit = min(len(seen), FIT_WINDOWS)
    fit = [seen[(j * len(seen)) // n_fit] for j in range(n_fit)]
    t = time.process_time()
    descriptions = describe(model, ex, held, config.batch_size, fit, strings)
    mixtures = time.process_time() - t
    if not args.no_key_pref:
        from headlens.atlas.keypref import key_preferences

        descriptions = key_preferences(model, descriptions, fit, held, config.batch_size, _classes(model, strings),
                                       strings, query=not args.no_query_sink)
    described = time.process_time() - t
    print(f"mixtures {mixtures:.1f} s, key weights and query factors {described - mixtures:.1f} s (CPU)")
    print(f"{args.model}: descriptions of {len(descriptions)} heads on {len(held)} held-out windows "
          f"({sum(len(w) for w in held)} tokens; fit on {n_fit} of {len(seen)} pass windows, exemplars from the "
          f"first {args.pass_windows}), 1 thread: {described:.1f} s ({described / (len(held) + n_fit):.3f} s a window)")
    sub = None
    if args.subst_windows:
        t = time.process_time()
        descriptions, sub = substitute(model, descriptions, held, candidate_rules(), _classes(model, strings),
                                       args.subst_windows, subst=args.subst, n_exact=args.subst_exact)
        print(f"substitution on {args.subst_windows} held-out windows: {time.process_time() - t:.1f} s")
    if args.save:
        import pickle

        with open(args.save, "wb") as f:
            pickle.dump({"descriptions": descriptions, "substitution": sub}, f)
    _report(args.model, descriptions, sub)
    if args.subst_windows:
        _write_report(model, descriptions, held[: args.subst_windows], config.batch_size, _classes(model, strings))


def _write_report(model, descriptions: list, windows: list, batch_size: int, classes: dict) -> None:
    """The write error of each description put back, ``|W_O (z_subst - z)|^2 / |W_O z|^2`` over the rows it
    predicts on ``windows`` (the substitution's), its median over every head with a mixture and over the described
    ones, and by what each carries (key weights, query factors)."""
    err = _write_errors(model, descriptions, windows, batch_size, classes)
    heads = [d for d in descriptions if d.mixture]
    med = lambda xs: float(torch.tensor(xs, dtype=torch.float64).median()) if xs else float("nan")  # noqa: E731
    e = {(d.layer, d.head): float(v) for d, v in zip(heads, err, strict=True)}
    groups = [("every head with a mixture", heads), ("described", [d for d in heads if d.described]),
              ("with query factors", [d for d in heads if getattr(d, "query_sink", None)]),
              ("with key weights", [d for d in heads if d.key_pref])]
    print(f"write error put back on {len(windows)} held-out windows, median: " + "; ".join(
        f"{name} {med([e[(d.layer, d.head)] for d in group]):.3f} ({len(group)})" for name, group in groups))


def _write_errors(model, descriptions: list, windows: list, batch_size: int, classes: dict) -> torch.Tensor:
    """``(N,)`` per head with a mixture: ``|W_O (z_subst - z)|^2 / |W_O z|^2`` summed over the rows its description
    predicts (``z = pattern @ v``, the real pattern or the one put back, values as they are)."""
    from headlens.atlas.keypref import _passes
    from headlens.atlas.substitute import simulated_patterns
    from headlens.readout.write import write_path

    heads = [d for d in descriptions if d.mixture]
    path = write_path(model)
    w_o = {la: path.w_o(la).float().cpu() for la in sorted({d.layer for d in heads})}  # (H, d_head, D)
    values: dict[int, torch.Tensor] = {}
    sums = torch.zeros(len(heads), 2, dtype=torch.float64)
    for tok, preds, ok, kept in _passes(model, heads, windows, batch_size, classes, lambda n: None, values):
        rows = ok.bool().any(-1)  # (B, Q)
        sim = simulated_patterns(heads, preds, rows, tok)
        for j, d in enumerate(heads):
            v = values[d.layer]
            vh = v[:, :, d.head // (kept[d.layer].shape[1] // v.shape[2])]  # (B, T, d_head)
            z = kept[d.layer][:, d.head] @ vh  # (B, Q, d_head)
            dz = sim[(d.layer, d.head)] @ vh - z
            w = w_o[d.layer][d.head]  # (d_head, D)
            sums[j, 0] += float(((dz @ w)[rows] ** 2).sum())
            sums[j, 1] += float(((z @ w)[rows] ** 2).sum())
    return sums[:, 0] / sums[:, 1].clamp(min=1e-300)


def _report(name: str, descriptions: list, sub=None) -> None:
    by = {(d.layer, d.head): d for d in descriptions}
    for at, expected in NAMED.get(name, {}).items():
        d = by[at]
        print(f"L{at[0]}H{at[1]} (expected {expected}): {d.role}, best rule {d.rule} r = {d.agreement:.3f} "
              f"[{d.ci[0]:.3f}, {d.ci[1]:.3f}] (CI width {d.ci[1] - d.ci[0]:.3f})\n    {d.text}")
        ev = d.evidence
        print(f"    off-rest attention on predicted tokens {ev['pred_share']:.3f} [{ev['pred_lo']:.3f}, "
              f"{ev['pred_hi']:.3f}], spread evenly {ev['pred_null']:.3f}; OV self-suppression {ev['ov_score']:.2f} "
              f"[{ev['ov_lo']:.2f}, {ev['ov_hi']:.2f}] (label {ev['ov_label']:.0f}); at exemplar keys suppresses "
              f"{ev['suppresses']:.2f}, copies {ev['copies']:.2f} of {int(ev['n_keys'])}; candidates "
              + " ".join(f"{k} {v:.3f}" for k, v in sorted(d.candidates.items(), key=lambda kv: -kv[1])))
        if d.share_kept is not None and d.share_ci is None:
            print(f"    share kept {d.share_kept:.2f}, mean ablation {d.ablation_delta:+.4f} (first-order estimates)")
        elif d.share_kept is not None:
            print(f"    share kept {d.share_kept:.2f} [{d.share_ci[0]:.2f}, {d.share_ci[1]:.2f}], mean ablation "
                  f"{d.ablation_delta:+.4f} [{ev['abl_lo']:+.4f}, {ev['abl_hi']:+.4f}]")
    roles: dict[str, int] = {}
    for d in descriptions:
        roles[d.role] = roles.get(d.role, 0) + 1
    print("roles:", ", ".join(f"{r} {n}" for r, n in sorted(roles.items())))
    tested = [d for d in descriptions if d.described]
    print(f"tested descriptions: {len(tested)} of {len(descriptions)} heads ({len(tested) / len(descriptions):.1%}): "
          f"{sum(d.agreement >= 0.5 for d in tested)} at agreement >= 0.5, "
          f"{sum(d.agreement < 0.5 and d.role == 'resting' for d in tested)} resting by their own statistic, "
          f"{sum(d.role == 'copy_suppression' and d.agreement < 0.5 for d in tested)} copy suppression by its two "
          f"claims; {sum(d.conditional for d in tested)} conditional; "
          f"{sum(len(d.mixture) > 1 for d in tested)} mixtures of 2-3 rules")
    if sub is not None:
        print(f"all {sub.n_heads} described heads substituted at once, {sub.windows} held-out windows: loss "
              f"{sub.all_heads:.4f} [{sub.all_ci[0]:.4f}, {sub.all_ci[1]:.4f}] against {sub.clean:.4f} clean "
              f"({100 * (sub.all_heads - sub.clean) / sub.clean:+.1f} %)")
        print(sub.sentence())
        print("per layer (heads, change % substituted / mean-ablated at once; ~ marks a line ESTIMATED to first "
              "order, the sum of the heads' estimates): " + " ".join(
                  f"{'~' if getattr(sub, 'layer_how', {}).get(la, sub.how) != 'exact' else ''}L{la}({n}, "
                  f"{100 * (v - sub.clean) / sub.clean:+.1f} / "
                  f"{100 * (sub.per_layer_mean.get(la, float('nan')) - sub.clean) / sub.clean:+.1f})"
                  for la, (n, v) in sorted(sub.per_layer.items())))
        none = [d for d in descriptions if d.evidence.get("share_how") == "no_effect"]
        print(f"heads run exactly whose mean ablation moves the loss by no more than its interval (not put back): "
              f"{len(none)}: " + " ".join(f"L{d.layer}H{d.head}" for d in none))
        withheld = [d for d in descriptions if d.evidence.get("withheld")]
        print(f"roles withheld by the substitution test: {len(withheld)}: " + " ".join(
            f"L{d.layer}H{d.head}({d.evidence['withheld']})" for d in withheld))
        moved = [d for d in descriptions if d.share_kept is not None  # every head run exactly, withheld ones too
                 and (d.evidence.get("abl_lo", 0) > 0 or d.evidence.get("abl_hi", 0) < 0)]
        shares = torch.tensor([d.share_kept for d in moved], dtype=torch.float64)
        if len(moved):
            print(f"share kept over the {len(moved)} heads run exactly whose mean ablation moves the loss beyond its CI: median "
                  f"{float(shares.median()):.3f}, quartiles {float(shares.quantile(0.25)):.3f} "
                  f"{float(shares.quantile(0.75)):.3f}; >= 0.8 for {int((shares >= 0.8).sum())}")
        _estimate_quality(descriptions)
    unclear = [d for d in descriptions if d.role == "no clear role"]
    if unclear:
        best = max(unclear, key=lambda d: d.agreement)
        print(f"no clear role: {len(unclear)} heads; best candidate among them L{best.layer}H{best.head} "
              f"{best.rule} r = {best.agreement:.2f}")
    for role in sorted(roles):
        heads = [f"L{d.layer}H{d.head}({d.agreement:.2f})" for d in descriptions if d.role == role]
        if role not in ("resting", "no clear role"):
            print(f"{role}: {' '.join(heads)}")


def _estimate_quality(descriptions: list) -> None:
    """The first-order estimates against the exact values, over the heads run exactly (all of them with
    ``--subst exact``): Spearman, the share of heads whose estimated share kept is within 0.1 of the exact one,
    the worst cases, by kind of head."""
    import math

    import numpy as np

    from headlens.interventions.attribution import spearman

    exact = [d for d in descriptions if d.evidence.get("share_how") == "exact"]
    if not exact:
        return
    ev = [d.evidence for d in exact]
    print(f"first-order estimates against the exact values over the {len(exact)} heads run exactly: Spearman "
          f"substituted {spearman(np.array([e['est_subst'] for e in ev]), np.array([e['subst_delta'] for e in ev])):.3f}, "
          f"mean-ablated {spearman(np.array([e['est_abl'] for e in ev]), np.array([d.ablation_delta for d in exact])):.3f}")
    both = [d for d in exact if d.share_kept is not None and not math.isnan(d.evidence["est_share"])]
    moved = [d for d in both if d.evidence["abl_lo"] > 0 or d.evidence["abl_hi"] < 0]
    sink = lambda d: max(d.mixture, key=d.mixture.get) == "first_token"  # noqa: E731
    for name, group in [("with a share", both), ("whose mean ablation moves the loss beyond its CI", moved),
                        ("moved, layer 0", [d for d in moved if d.layer == 0]),
                        ("moved, led by first_token", [d for d in moved if sink(d)]),
                        ("moved, the rest", [d for d in moved if d.layer and not sink(d)])]:
        if len(group) < 2:
            continue
        est = np.array([d.evidence["est_share"] for d in group])
        ex = np.array([d.share_kept for d in group])
        within = np.abs(est - ex) <= 0.1
        print(f"  share kept, {len(group)} heads {name}: Spearman {spearman(est, ex):.3f}, within 0.1 of exact "
              f"{within.mean():.1%}, median |error| {np.median(np.abs(est - ex)):.3f}")
    for pick in ("top", "random"):
        group = [d for d in both if d.evidence.get("exact_pick") == pick]
        if len(group) >= 2:
            est = np.array([d.evidence["est_share"] for d in group])
            ex = np.array([d.share_kept for d in group])
            print(f"  share kept, the {len(group)} heads run exactly as '{pick}': Spearman {spearman(est, ex):.3f}, "
                  f"within 0.1 of exact {(np.abs(est - ex) <= 0.1).mean():.1%}")
    worst = sorted(moved, key=lambda d: -abs(d.evidence["est_share"] - d.share_kept))[:8]
    print("  worst (moved): " + " ".join(
        f"L{d.layer}H{d.head}[{max(d.mixture, key=d.mixture.get)}] est {d.evidence['est_share']:.2f} exact "
        f"{d.share_kept:.2f} (abl est {d.evidence['est_abl']:+.3f} exact {d.ablation_delta:+.3f})" for d in worst))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", default="prose")
    ap.add_argument("--n-windows", type=int, default=96)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", default=None, help="also write the site here")
    ap.add_argument("--describe-only", action="store_true", help="time the descriptions alone")
    ap.add_argument("--pass-windows", type=int, default=16, help="with --describe-only: windows for the exemplars")
    ap.add_argument("--heldout", type=int, default=None, help="with --describe-only: the first N held-out windows")
    ap.add_argument("--max-heldout", type=int, default=MAX_HELDOUT, help="with --describe-only: the split's cap")
    ap.add_argument("--subst-windows", type=int, default=8, help="held-out windows of the substitution test")
    ap.add_argument("--subst", choices=("estimate", "exact"), default="estimate",
                    help="each head's share kept: first-order estimates checked exactly on a sample, or all exact")
    ap.add_argument("--subst-exact", type=int, default=None, help="heads run exactly under --subst estimate")
    ap.add_argument("--no-peak", action="store_true", help="skip the two child processes' peak memory")
    ap.add_argument("--no-key-pref", action="store_true", help="--describe-only: no key weights (as before them)")
    ap.add_argument("--no-query-sink", action="store_true", help="--describe-only: no query factors (as before them)")
    ap.add_argument("--write-error", action="store_true", help="with --report: the write errors too (loads the model)")
    ap.add_argument("--save", default=None, help="pickle the descriptions and the substitution here (to study them)")
    ap.add_argument("--report", default=None, help="print the report of a pickle --save wrote, and nothing else")
    ap.add_argument("--child", choices=("pass", "classify"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args)
    if args.report:
        import pickle

        with open(args.report, "rb") as f:
            saved = pickle.load(f)
        _report(args.model, saved["descriptions"], saved["substitution"])
        if args.write_error:  # on the substitution's windows, as --describe-only picks them
            from headlens.atlas.describe import _classes

            torch.set_num_threads(1)
            model = headlens.load(args.model)
            windows = corpus_windows(model, args.corpus, args.n_windows, args.seq_len, 0).prompts
            held = split(windows, max_heldout=args.max_heldout)[1][: args.subst_windows]
            strings = readable_tokens(model, torch.arange(int(model.cfg.d_vocab)))
            _write_report(model, saved["descriptions"], held, args.batch_size, _classes(model, strings))
        return None
    if args.describe_only:
        return _describe_only(args)
    torch.set_num_threads(1)
    model = headlens.load(args.model)
    config = AtlasConfig(corpus=args.corpus, n_windows=args.n_windows, seq_len=args.seq_len,
                         batch_size=args.batch_size)
    windows = corpus_windows(model, config.corpus, config.n_windows, config.seq_len, config.seed).prompts
    seen, held = split(windows)
    n_tokens = sum(len(w) for w in seen)
    t = time.process_time()
    _plain(model, seen, config.batch_size)
    plain = time.process_time() - t
    t = time.process_time()
    _plain(model, held, config.batch_size)
    plain_all = plain + time.process_time() - t
    marks: list[tuple[str, float]] = []
    t0 = time.process_time()
    atlas = build_atlas(model, config, windows=windows, stage=lambda name: marks.append((name, time.process_time())),
                        subst_windows=args.subst_windows, subst=args.subst, subst_exact=args.subst_exact)
    marks.append(("end", time.process_time()))
    took = {name: marks[i + 1][1] - at for i, (name, at) in enumerate(marks[:-1])}
    t = time.process_time()
    write_site(atlas, args.out or tempfile.mkdtemp())
    site = time.process_time() - t
    total = time.process_time() - t0
    passed = took["reading the corpus"]
    print(f"{args.model}: {n_tokens} tokens in {len(seen)} windows (+{len(held)} held out), 1 thread")
    print(f"substitution: {atlas.substitution.exact_heads if atlas.substitution else 0} heads run exactly "
          f"(--subst {args.subst})")
    print(f"plain forwards {plain:.1f} s ({plain_all:.1f} s with the held-out windows); exemplar pass {passed:.1f} s "
          f"({passed / plain:.2f}x); descriptions {took.get('describing the heads', 0):.1f} s; key weights {took.get('weighing the keys', 0):.1f} s; substitution "
          f"{took.get('substituting the descriptions', 0):.1f} s; site {site:.1f} s; end to end {total:.1f} s "
          f"({total / plain_all:.2f}x the plain forwards over every window it reads)")
    if args.save:
        import pickle

        with open(args.save, "wb") as f:
            pickle.dump({"descriptions": atlas.descriptions, "substitution": atlas.substitution}, f)
    if args.no_peak:
        return _report(args.model, atlas.descriptions, atlas.substitution)
    peak_pass, classify = _child_peak(args, "pass"), _child_peak(args, "classify")
    print(f"peak RSS (each alone in a child process, model loaded): the exemplar pass {peak_pass / 2**30:.2f} GiB, "
          f"a plain classify of {len(seen)} windows x {args.seq_len} tokens (batch {args.batch_size}) "
          f"{classify / 2**30:.2f} GiB ({peak_pass / classify:.2f}x)")
    _report(args.model, atlas.descriptions, atlas.substitution)


if __name__ == "__main__":
    main()
