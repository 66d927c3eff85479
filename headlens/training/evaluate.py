"""Model-card measurements for the zoo recipes: losses and which heads formed.

Every probe is drawn from a fixed generator, so a card's numbers are reproducible.
A card counts a head as formed when its point score passes a fixed level (pattern detectors 0.4, first-token
sinks 0.3), the cards' own convention on the recipes' probes, kept so cards of different recipes compare; the
labels of ``headlens classify`` use the strength rule of docs/scores.md ("the label rule") instead.
"""

from __future__ import annotations

import math
import string
from typing import Any

import torch

from headlens.probes import data
from headlens.training import measure as M

THRESHOLD = 0.4  # pattern detectors (previous-token, induction, bracket matching)
SINK_THRESHOLD = 0.3  # first-token sink (Gu et al. 2024)
PROBE_SEED = 1234  # probes never share a seed with training streams


def _r(x: float) -> float:
    return round(float(x), 4)


def evaluate_induction(model, seg_lens: tuple[int, ...] = (8, 16, 24, 30), n_prompts: int = 16) -> dict[str, Any]:
    """Repeated-half vs first-half loss and previous-token / induction heads on ``BOS + r + r``.

    Induction is scored at several repeat lengths; a head counts only if it passes at every
    length (its min over lengths), which rules out a fixed-offset head posing as induction.
    """
    gen = torch.Generator().manual_seed(PROBE_SEED)
    tok = getattr(model, "native_tokenizer", None) or model.tokenizer  # a bridged zoo model carries its own
    n_sym, bos = tok.n_symbols, model.bos_token_id
    first, second = [], []
    ind_by_len, shifted_by_len = [], []
    prev = []
    for L in seg_lens:
        toks = data.repeated_probe(gen, n_prompts, L, n_sym, bos)  # (N, 2L + 1)
        losses = M.token_losses(model, toks)  # (N, 2L): position t predicts token t + 1
        first.append(losses[:, 1:L].mean())  # predicting r[1:] in the first copy
        second.append(losses[:, L + 1 :].mean())  # predicting r[1:] in the second copy
        pats = M.all_patterns(model, toks)
        ind_by_len.append(M.target_scores(pats, M.induction_targets(toks, {bos})))
        shifted_by_len.append(M.target_scores(pats, M.shifted_induction_targets(toks, {bos})))
        prev.append(M.target_scores(pats, M.previous_token_targets(toks)))
    ind_min = torch.stack(ind_by_len).min(0).values  # (L, H)
    shifted_min = torch.stack(shifted_by_len).min(0).values  # (L, H)
    prev_mean = torch.stack(prev).mean(0)
    return {
        "first_half_loss": _r(torch.stack(first).mean()),
        "repeated_half_loss": _r(torch.stack(second).mean()),
        "uniform_loss": _r(math.log(n_sym)),
        "probe": f"BOS + r + r, r without replacement, |r| in {list(seg_lens)}, {n_prompts} prompts each",
        "scores": {
            "previous_token": M.score_dict(prev_mean),
            "induction_min_over_lengths": M.score_dict(ind_min),
            "induction_by_length": {str(L): M.score_dict(s) for L, s in zip(seg_lens, ind_by_len, strict=True)},
            "shifted_induction_min_over_lengths": M.score_dict(shifted_min),
        },
        "heads": {
            "previous_token": M.heads_above(prev_mean, THRESHOLD),
            "induction": M.heads_above(ind_min, THRESHOLD),
            "shifted_induction": M.heads_above(shifted_min, THRESHOLD),
        },
    }


def unigram_baseline(corpus: data.ByteCorpus) -> float:
    """Held-out cross-entropy (nats/byte) of the add-one-smoothed training byte unigram."""
    counts = torch.bincount(corpus.train.long(), minlength=256).double() + 1
    logp = (counts / counts.sum()).log()
    held = torch.bincount(corpus.heldout.long(), minlength=256).double()
    return float(-(held * logp).sum() / held.sum())


def evaluate_code(model, n_windows: int = 32, seq_len: int = 255, max_bytes: int = 0) -> dict[str, Any]:
    """Held-out loss vs unigram, and previous-token, induction, bracket and sink heads."""
    gen = torch.Generator().manual_seed(PROBE_SEED)
    corpus = data.stdlib_corpus(max_bytes)
    bos = model.bos_token_id
    toks = data.window_batch(gen, corpus.heldout, n_windows, seq_len, bos)  # (N, T + 1)
    heldout_loss = M.token_losses(model, toks).mean()
    pats = M.all_patterns(model, toks)
    prev = M.target_scores(pats, M.previous_token_targets(toks))
    sink = M.target_scores(pats, M.first_token_targets(toks))
    natural_ind = M.target_scores(pats, M.induction_targets(toks, {bos}))

    # synthetic repeats of printable ASCII at two lengths (min over lengths, as for induction-2l)
    printable = torch.tensor([ord(c) for c in string.ascii_letters + string.digits + "_"])
    ind_by_len = []
    rep_first, rep_second = [], []
    for L in (20, 50):
        rows = [torch.cat([torch.tensor([bos]), r, r]) for r in
                (printable[torch.randperm(len(printable), generator=gen)[:L]] for _ in range(16))]
        rep = torch.stack(rows)  # (16, 2L + 1)
        losses = M.token_losses(model, rep)
        rep_first.append(losses[:, 1:L].mean())
        rep_second.append(losses[:, L + 1 :].mean())
        ind_by_len.append(M.target_scores(M.all_patterns(model, rep), M.induction_targets(rep, {bos})))
    ind_min = torch.stack(ind_by_len).min(0).values

    # bracket matching on held-out code: all closers, per pair type, and the hard subset
    matches_all, matches_hard = [], []
    by_pair: dict[str, list[dict[int, int]]] = {p: [] for p in ("()", "[]", "{}")}
    for row in toks:
        text = bytes([int(t) if int(t) < 256 else 0 for t in row])
        m = data.match_brackets(text, ["()", "[]", "{}"])
        matches_all.append(m)
        matches_hard.append(_hard_subset(text.decode("latin-1"), m, "([{"))
        for p in by_pair:
            by_pair[p].append({q: k for q, k in m.items() if chr(text[q]) == p[1]})
    T = toks.shape[1]
    bracket = M.target_scores(pats, M.bracket_targets(matches_all, T))
    bracket_hard = M.target_scores(pats, M.bracket_targets(matches_hard, T))
    per_pair = {p: M.target_scores(pats, M.bracket_targets(ms, T)) for p, ms in by_pair.items()}
    # open_bracket: from the position that predicts the closer (not the opener itself) to the opener
    opens = [{q - 1: k for q, k in m.items() if q - 1 > k} for m in matches_all]
    opens_hard = [{q - 1: k for q, k in m.items()} for m in matches_hard]  # hard: q - 1 > k always
    open_all = M.target_scores(pats, M.bracket_targets(opens, T))
    open_hard = M.target_scores(pats, M.bracket_targets(opens_hard, T))
    return {
        "heldout_loss": _r(heldout_loss),
        "unigram_baseline_loss": _r(unigram_baseline(corpus)),
        "heldout_files": corpus.n_heldout_files,
        "train_files": corpus.n_train_files,
        "train_bytes": len(corpus.train),
        "repeat_first_half_loss": _r(torch.stack(rep_first).mean()),
        "repeat_second_half_loss": _r(torch.stack(rep_second).mean()),
        "n_closers": sum(len(m) for m in matches_all),
        "n_hard_closers": sum(len(m) for m in matches_hard),
        "probe": f"{n_windows} held-out windows of {seq_len} bytes; BOS + r + r over [A-Za-z0-9_], |r| in [20, 50]",
        "scores": {
            "previous_token": M.score_dict(prev),
            "first_token": M.score_dict(sink),
            "induction_min_over_lengths": M.score_dict(ind_min),
            "induction_natural_code": M.score_dict(natural_ind),
            "bracket_matching": M.score_dict(bracket),
            "bracket_matching_hard": M.score_dict(bracket_hard),
            **{f"bracket_matching_{p}": M.score_dict(s) for p, s in per_pair.items()},
            "open_bracket": M.score_dict(open_all),
            "open_bracket_hard": M.score_dict(open_hard),
        },
        "heads": {
            "previous_token": M.heads_above(prev, THRESHOLD),
            "induction": M.heads_above(ind_min, THRESHOLD),
            "bracket_matching": M.heads_above(bracket, THRESHOLD),
            "open_bracket": M.heads_above(open_all, THRESHOLD),
            "first_token": M.heads_above(sink, SINK_THRESHOLD),
        },
    }


def _hard_subset(text: str, matches: dict[int, int], openers: str) -> dict[int, int]:
    """Closers whose matching opener is not the nearest preceding opener."""
    hard = {}
    for q, k in matches.items():
        nearest = max((i for i in range(q) if text[i] in openers), default=-1)
        if nearest != k:
            hard[q] = k
    return hard


def evaluate_dyck(model, n_strings: int = 256, seq_len: int = 64, max_depth: int = 8) -> dict[str, Any]:
    """Closing-bracket type accuracy and matching-head scores (all closers and the hard subset)."""
    gen = torch.Generator().manual_seed(PROBE_SEED)
    bos = model.bos_token_id
    toks = data.dyck_batch(gen, n_strings, seq_len, bos, max_depth)  # (N, T + 1)
    with torch.no_grad():
        logits = model(toks[:, :-1])  # (N, T, V)
    closer_ids = torch.tensor([data.DYCK_ALPHABET.index(c) for c in data.DYCK_CLOSERS])
    target = toks[:, 1:]  # (N, T)
    is_closer = torch.isin(target, closer_ids)
    pred = closer_ids[logits[..., closer_ids].argmax(-1)]  # (N, T): best closer
    correct = (pred == target) & is_closer

    texts = [data.DYCK_ALPHABET and "".join(data.DYCK_ALPHABET[int(t)] for t in row[1:]) for row in toks]
    matches = [{q + 1: k + 1 for q, k in data.match_brackets(t).items()} for t in texts]  # +1 for BOS
    hard = [_hard_subset("." + t, m, data.DYCK_OPENERS) for t, m in zip(texts, matches, strict=True)]
    hard_q = torch.zeros_like(target, dtype=torch.bool)
    for b, m in enumerate(hard):
        for q in m:
            hard_q[b, q - 1] = True  # the closer at q is predicted from position q - 1
    pats = M.all_patterns(model, toks)
    T = toks.shape[1]
    bracket = M.target_scores(pats, M.bracket_targets(matches, T))
    bracket_hard = M.target_scores(pats, M.bracket_targets(hard, T))
    # the closer's type is predicted one position earlier: attention from there to the opener
    before = [{q - 1: k for q, k in m.items()} for m in hard]
    bracket_before = M.target_scores(pats, M.bracket_targets(before, T))
    return {
        "closer_accuracy": _r(correct.sum() / is_closer.sum()),
        "closer_accuracy_hard": _r((correct & hard_q).sum() / hard_q.sum()),
        "heldout_loss": _r(M.token_losses(model, toks).mean()),
        "n_closers": int(is_closer.sum()),
        "n_hard_closers": int(hard_q.sum()),
        "probe": f"{n_strings} held-out Dyck strings of length {seq_len}, depth <= {max_depth}",
        "scores": {
            "bracket_matching": M.score_dict(bracket),
            "bracket_matching_hard": M.score_dict(bracket_hard),
            "bracket_matching_hard_from_position_before": M.score_dict(bracket_before),
        },
        "heads": {
            "bracket_matching": M.heads_above(bracket_hard, THRESHOLD),
            "bracket_matching_from_position_before": M.heads_above(bracket_before, THRESHOLD),
        },
    }


def _causal_row(row: Any) -> str:
    return (f"{row['heads']}: {row['clean']:.3f} -> {row['delta']:+.3f} (95% CI {row['ci_low']:+.3f}..{row['ci_high']:+.3f}); "
            f"random heads anywhere else: {row['control_delta']:+.3f} ({row['control_ci_low']:+.3f}.."
            f"{row['control_ci_high']:+.3f}); excess {row['excess_ci_low']:+.3f}..{row['excess_ci_high']:+.3f}, "
            f"beats control: {bool(row['beats_control'])}")


def evaluate_needle(model, n_prompts: int = 20, lengths: tuple[int, ...] = (256, 1024, 2048),
                    causal: bool = True) -> dict[str, Any]:
    """Needle recall by context length, classify's retrieval labels, and the causal check.

    The causal check (Wu et al. 2024's): make the labelled retrieval heads attend uniformly
    (``uniform`` ablation), together and one at a time, and measure needle recall at 2,048
    tokens, against random groups of as many heads drawn anywhere else in the model
    (``sweep(control="model")``: Wu et al.'s random heads); deltas with 95 % bootstrap CIs over
    prompts. ``causal=False`` skips it (the scores alone, for the tests that re-measure a card).
    """
    from headlens.interventions.metrics import needle_task, repeated_task
    from headlens.interventions.sweep import sweep, task_metric
    from headlens.scoring.classification import classify

    tok = getattr(model, "native_tokenizer", None) or model.tokenizer  # a bridged zoo model carries its own
    recall = {}
    for T in lengths:
        task = needle_task(model, n_prompts, seq_len=T, seed=PROBE_SEED)
        with torch.no_grad():
            recall[T] = _r(task_metric(model, task, "needle_recall").mean())  # chunked: 2k-token patterns
    rep = repeated_task(model, 16, seed=PROBE_SEED)
    with torch.no_grad():
        rep_loss = task_metric(model, rep, "repeated_loss").mean()
    detectors = ("retrieval", "previous_token", "induction")
    df = classify(model, detectors=list(detectors), n_prompts=n_prompts, seq_len=model.cfg.n_ctx, seed=PROBE_SEED)
    scores = {det: {f"L{r.layer}H{r.head}": _r(r.score) for r in df[df.detector == det].itertuples()}
              for det in detectors}
    labelled = df[df.label].sort_values("lift", ascending=False)
    heads = {det: [f"L{r.layer}H{r.head}" for r in labelled[labelled.detector == det].itertuples()]
             for det in detectors}
    ret = df[df.detector == "retrieval"].set_index(["layer", "head"])

    def described(h: str) -> str:
        r = ret.loc[(int(h[1]), int(h[3:]))]
        return f"{h} (score {r['score']:.3f}, CI low {r['ci_low']:.3f}, lift {r['lift']:.1f})"

    out: dict[str, Any] = {f"needle_recall_{T}": v for T, v in recall.items()}
    out.update({
        "repeated_half_loss": _r(rep_loss), "uniform_loss": _r(math.log(tok.n_symbols)),
        "retrieval_labelled": ", ".join(described(h) for h in heads["retrieval"]) or "none",
        "retrieval_wu_2024_heads (score > 0.1)": ", ".join(df.attrs["retrieval_wu_2024"]["heads"]) or "none",
        "retrieval_probe": df.attrs["probes"]["needle"]["built"],
    })
    if causal and heads["retrieval"]:
        groups = [",".join(heads["retrieval"])] + (heads["retrieval"] if len(heads["retrieval"]) > 1 else [])
        rows = sweep(model, groups=groups, method="uniform", metrics=["needle_recall"], n_prompts=n_prompts,
                     n_control=8, control="model", seed=PROBE_SEED, attribution=False)
        out["causal_check"] = [_causal_row(row) for _, row in rows.iterrows()]
    return {**out, "probe": f"needle-in-a-haystack, random haystacks, {n_prompts} prompts per length "
                            f"{list(lengths)}, needle of 16 distinct symbols at depths 0.1..0.9; BOS + r + r",
            "scores": scores, "heads": heads}


EVALUATORS = {"induction-2l": evaluate_induction, "llama-induction": evaluate_induction, "code": evaluate_code,
              "dyck": evaluate_dyck, "needle-2k": evaluate_needle}
