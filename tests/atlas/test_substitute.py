"""Descriptions put back into the model: planted heads keep their effect, a wrong description loses it; the
substituted loss equals the model's own forward with the pattern replaced at ``hook_pattern``; mixtures,
token classes and the templates' honesty."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from headlens.atlas.build import build_atlas
from headlens.atlas.exemplars import AtlasConfig
from headlens.atlas.rules import candidate_rules, token_classes
from headlens.atlas.substitute import _loss, substitute
from tests.atlas.planted import planted_atlas, planted_gpt, rare_repeat_windows, repeat_windows


@pytest.fixture(scope="module")
def mixed():
    return planted_atlas(mixture=True)


def test_planted_mixture_and_conditional_heads_get_their_built_descriptions(mixed):
    _, _, atlas = mixed
    by = {(d.layer, d.head): d for d in atlas.descriptions}
    mix = by[(1, 2)]  # built as half previous token, half first token
    assert mix.role == "previous_token" and set(mix.mixture) == {"previous_token", "first_token"}
    assert mix.mixture["previous_token"] == pytest.approx(0.5, abs=0.02) and mix.agreement > 0.99
    assert "previous_token 0.50 + first_token 0.50" in mix.text or "first_token 0.50 + previous_token 0.50" in mix.text
    cond = by[(1, 0)]  # induction where a repeat exists, the first token elsewhere
    assert cond.role == "induction" and cond.agreement > 0.95 and 0.5 < cond.coverage < 0.95
    assert f"{cond.coverage:.0%} of query rows" in cond.text


@pytest.fixture(scope="module")
def split():
    """Induction that keeps 0.4 or 0.65 of each row with a repeat on the first token, where repeats are rare."""
    model = planted_gpt(splits=(0.6, 0.35))
    windows = rare_repeat_windows(model, 48)
    return model, windows, build_atlas(model, AtlasConfig(k=3, batch_size=8), windows=windows, subst_windows=0)


def test_induction_that_keeps_a_share_on_the_first_token_is_named_with_its_coverage(split):
    from headlens.atlas.heldout import heldout_stats
    from headlens.atlas.mixture import conditional_sums, corr

    model, windows, atlas = split
    by = {(d.layer, d.head): d for d in atlas.descriptions}
    assert by[(1, 1)].role == "resting" and by[(1, 1)].mixture == {"first_token": 1.0}  # rests everywhere
    for h, p in [(2, 0.6), (3, 0.35)]:  # built: p on the induction target in a row with a repeat
        d = by[(1, h)]
        assert d.role == "induction" and d.evidence["cond_mass"] == pytest.approx(p, abs=0.01)
        assert 0.05 < d.coverage < 0.2 and f"{d.coverage:.0%} of" in d.text and d.text.endswith("Role: induction.")
    d = by[(1, 3)]  # its rows with a repeat are few, yet the fit of the attention itself finds the built mixture
    assert d.agreement > 0.95 and d.mixture == pytest.approx({"induction": 0.35, "first_token": 0.65}, abs=0.01)
    rules = {n: r for n, r in candidate_rules().items() if n != "predicted_token"}
    stats = heldout_stats(model, windows, rules, None, 8)
    i = stats["names"].index("induction")
    alone = corr(conditional_sums(stats, torch.ones(2, 4, len(rules))).sum(0))[1, 3, i]  # the rule without its pair
    assert alone < 0.5  # what once left it "resting"


def test_shares_kept_are_near_one_for_built_heads_and_the_whole_model_line(mixed):
    _, _, atlas = mixed
    by = {(d.layer, d.head): d for d in atlas.descriptions}
    for at in [(0, 0), (1, 0), (1, 2)]:  # the heads whose removal moves the loss
        d = by[at]
        assert abs(d.ablation_delta) > 0.05 and d.subst_windows == 8
        assert d.share_kept == pytest.approx(1.0, abs=0.03) and d.share_ci[0] <= d.share_kept <= d.share_ci[1]
    assert by[(1, 1)].share_kept is None  # it writes nothing: no effect to keep
    sub = atlas.substitution
    assert sub.n_heads == 6 and sub.windows == 8 and abs(sub.all_heads - sub.clean) / sub.clean < 0.02
    assert set(sub.per_layer) == {0, 1}
    frame = atlas.substitution_frame()
    assert list(frame.columns) == ["model", "scope", "layer", "heads", "fraction", "clean_loss", "loss", "change",
                                   "change_pct", "mean_ablated_loss", "windows", "how"]
    assert list(frame.scope) == ["all", "best", "best", "best", "layer", "layer"]
    assert list(frame.heads[:4]) == [6, 2, 3, 4] and list(frame.fraction[:4]) == [1.0, 0.25, 0.5, 0.75]


def test_a_wrong_description_keeps_little_of_the_head(mixed):
    model, windows, atlas = mixed
    right = next(d for d in atlas.descriptions if (d.layer, d.head) == (1, 0))
    wrong = replace(right, mixture={"previous_token": 1.0})  # the induction head called a previous-token head
    held = windows[3::4]
    got = [substitute(model, [d], held, candidate_rules(), None, 8)[0][0] for d in (right, wrong)]
    assert got[0].share_kept > 0.95 and got[1].share_kept < 0.3
    assert got[0].role == "induction" and got[1].share_ci[1] < 0  # worse than removing it: the role is withheld
    assert got[1].role == "no clear role" and "The substitution test argues against induction" in got[1].text


def test_the_substituted_loss_equals_the_models_forward_with_its_pattern_replaced(mixed):
    """The reference: the native model fires ``hook_pattern`` before it uses it, so a hook there replaces the
    pattern in its own forward; the substitution goes through ``hook_z`` and ``hook_v`` instead."""
    from headlens.atlas.heldout import _batch
    from headlens.atlas.substitute import rule_predictions, simulated_patterns

    model, windows, atlas = mixed
    held = windows[3::4][:4]
    described = [d for d in atlas.descriptions if d.described]
    out, sub = substitute(model, described, held, candidate_rules(), None, 4)
    batch = _batch(held, {model.tokenizer.bos_token_id})
    T = batch.tokens.shape[1]
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    cells = (k <= q) & batch.valid[:, None, :] & batch.query_ok[:, :, None]
    from headlens.atlas.rules import rule_targets

    rules = candidate_rules()
    hits = {r: rule_targets(rules[r], batch, T) * cells for d in described for r in d.mixture}
    pats = simulated_patterns(described, rule_predictions(batch, hits), batch.query_ok)

    def hooked(heads):
        def make(layer):
            def hook(p, hook):  # (B, H, Q, K)
                p = p.clone()
                for (la, h), sim in pats.items():
                    if la == layer and (la, h) in heads:
                        keep = sim.sum(-1, keepdim=True) > 0
                        p[:, h] = torch.where(keep, sim, p[:, h])
                return p
            return hook
        with torch.no_grad(), model.hooks([(f"blocks.{la}.attn.hook_pattern", make(la)) for la in range(2)]):
            return _loss(model(batch.tokens), batch.tokens, batch.valid)

    clean = hooked(set())
    assert sub.clean == pytest.approx(float(clean.mean()), abs=1e-6)
    assert sub.all_heads == pytest.approx(float(hooked(set(pats)).mean()), abs=1e-5)
    ranked = [(d.layer, d.head) for d in sorted(described, key=lambda d: -d.agreement)]
    for f, n, loss in sub.best:  # the best-described fraction at once
        assert n == max(1, round(f * len(ranked))) and loss == pytest.approx(float(hooked(set(ranked[:n])).mean()),
                                                                             abs=1e-5)
    for d in out:
        if d.share_kept is not None:
            assert d.evidence["subst_delta"] == pytest.approx(float((hooked({(d.layer, d.head)}) - clean).mean()),
                                                              abs=1e-5)


@pytest.mark.parametrize("planted", ["mixed", "split"])
def test_no_sentence_names_a_role_its_numbers_argue_against(planted, request):
    """A rule's role is named only with its agreement at 0.5 or more and a weight of a quarter or more in the
    mixture; copy suppression only with its two claims in the text."""
    _, _, atlas = request.getfixturevalue(planted)
    for d in atlas.descriptions:
        named = re.search(r"Role: ([a-z _0-9]+)\.$", d.text)
        if d.role in ("no clear role",) or (d.role == "resting" and d.agreement < 0.5):
            assert named is None or named.group(1) in ("resting",)
            continue
        assert named and named.group(1) == d.role.replace("_", " ")
        if d.role == "copy_suppression":
            assert "even" in d.text and "bottom 5" in d.text
        else:
            assert d.agreement >= 0.5 and f"r = {d.agreement:.2f}" in d.text
            assert d.role == "resting" or max(w for r, w in d.mixture.items() if r != "first_token") >= 0.25


def test_copy_suppression_names_its_two_claims_never_a_rules_numbers():
    """The page once read "0.10 of its attention ... 1x chance ... r = 0.17. Role: copy suppression"."""
    from headlens.atlas.describe import Description, _text

    ev = {"off_rest": 0.3, "first": 0.6, "first_lo": 0.5, "first_hi": 0.7, "off_lo": 0.2, "off_hi": 0.4, "mass": 0.10,
          "mass_lo": 0.08, "mass_hi": 0.11, "chance": 0.1, "copies": 0.0, "suppresses": 0.7, "n_keys": 10,
          "pred_share": 0.19, "pred_lo": 0.17, "pred_hi": 0.21, "pred_null": 0.08, "ov_score": 0.4, "ov_lo": 0.3,
          "ov_hi": 0.5, "ov_label": 1.0}
    d = Description(24, 4, "copy_suppression", "predicted_token", 0.17, (0.14, 0.21), "", mixture={"predicted_token": 1.0},
                    evidence=ev)
    text = _text(d, candidate_rules()["predicted_token"])
    assert "1x chance" not in text and "0.19 [0.17, 0.21]" in text and "against 0.08" in text
    assert text.endswith("Role: copy suppression.")


def test_token_classes_read_bpe_sentencepiece_and_wordpiece_vocabularies():
    bpe = token_classes([" The", "cat", "ty", ",", " 7", "\n", "(", "foo_bar"],
                        ["ĠThe", "cat", "ty", ",", "Ġ7", "Ċ", "(", "foo_bar"])
    assert bpe["word_start"].tolist() == [True, False, False, True, True, True, True, False]
    assert bpe["capital"].tolist()[0] and bpe["digit"].tolist()[4] and bpe["newline"].tolist()[5]
    assert bpe["comma"].tolist()[3] and bpe["open"].tolist()[6] and bpe["identifier"].tolist()[7]
    sp = token_classes([" Hello", "wor", "ld"], ["▁Hello", "wor", "ld"])
    assert sp["word_start"].tolist() == [True, False, False]
    wp = token_classes(["hello", "ing", "."], ["hello", "##ing", "."])  # BERT: ## continues a word
    assert wp["word_start"].tolist() == [True, False, True]


def test_word_and_delimiter_rules_mark_the_keys_they_name():
    from headlens.atlas.heldout import _batch
    from headlens.atlas.rules import rule_targets

    strings = ["<s>", " The", "cat", "s", ".", " A", " (", "x", " [", "y", "]", ","]
    raw = ["<s>", "ĠThe", "cat", "s", ".", "ĠA", "Ġ(", "x", "Ġ[", "y", "]", ","]
    classes = token_classes(strings, raw)
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 7])  # <s> The|cat|s . A ( x [ y ] , x
    batch = _batch([ids], {0}, classes)
    rules = candidate_rules()
    T = len(ids)
    keys = lambda name, q: rule_targets(rules[name], batch, T)[0, q].nonzero()[:, 0].tolist()  # noqa: E731
    assert keys("word_start", 3) == [1]  # "s" continues " The cat s": the word began at " The"
    assert keys("word_start", 5) == []  # " A" starts a word: no target
    assert keys("sentence_end", 6) == [4]
    assert keys("open_bracket", 9) == [8] and keys("open_bracket", 12) == [6]  # "[" closed by "]": "(" is open
    assert keys("last_comma", 12) == [11]
    assert keys("duplicate_last", 12) == [7] and keys("induction_last", 12) == [8]
    assert keys("first_token", 5) == [0] and keys("self", 5) == [5] and keys("position_1", 5) == [1]
    decay = rule_targets(rules["decay_1"], batch, T)[0, 4]  # halves each token back, from the query itself
    assert decay[1:5].tolist() == [0.125, 0.25, 0.5, 1.0] and decay[0] == 0


def test_every_phase_of_an_atlas_reports_its_progress():
    """The CLI's bar hears each phase begin and counts within it, to its total (never silent for a phase)."""
    import headlens
    from headlens.atlas.build import build_atlas

    heard: list[tuple[str, int, int]] = []
    phase = ["?"]

    def stage(name):
        phase[0] = name
        heard.append((name, 0, 0))

    build_atlas(headlens.load("induction-2l"), AtlasConfig(corpus="repeats", n_windows=16, seq_len=32, k=2),
                progress=lambda d, t: heard.append((phase[0], d, t)), stage=stage, subst_windows=2)
    names = ["reading the corpus", "describing the heads", "weighing the keys", "substituting the descriptions"]
    assert [n for n, d, t in heard if d == t == 0] == names
    for name in names:  # each phase counts up to its own total
        counts = [(d, t) for n, d, t in heard if n == name and t]
        assert counts and counts[-1][0] == counts[-1][1] and [d for d, _ in counts] == sorted(d for d, _ in counts)


def test_a_conditional_description_says_how_often_its_rule_applies():
    from headlens.atlas.describe import Description, _text

    ev = {"off_rest": 0.1, "first": 0.88, "first_lo": 0.86, "first_hi": 0.9, "off_lo": 0.09, "off_hi": 0.11,
          "copies": 0.9, "suppresses": 0.0, "n_keys": 20, "cond_mass": 0.41, "cond_chance": 0.02}
    d = Description(17, 4, "induction", "induction_longest", 0.62, (0.58, 0.66), "", evidence=ev,
                    mixture={"induction_longest": 0.45, "first_token": 0.55}, coverage=0.09, conditional=True)
    text = _text(d, candidate_rules()["induction_longest"])
    assert "on the 9% of held-out query rows where the rule 'induction_longest' has a target" in text
    assert "r = 0.62 [0.58, 0.66]" in text and "first_token 0.55 + induction_longest 0.45" in text
    assert "0.88 of its attention" in text and text.endswith("Role: induction.")


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_the_resumed_batched_substitution_equals_whole_hooked_forwards(family, tmp_path):
    """A bridged model (grouped-query Qwen2; Gemma 3's post-attention norms) runs every head of a layer as copies
    of the batch from its layer on; the reference is one whole forward per head and variant, the head's ``z``
    replaced by ``pattern @ v`` (or its mean over the windows) in a hook, no resumption, no copies."""
    import transformers
    from hf_families import FAMILIES, JOINING, build, plant_offset_heads, save_tokenizer

    import headlens
    from headlens.atlas.describe import _classes
    from headlens.atlas.heldout import _batch
    from headlens.atlas.rules import rule_targets
    from headlens.atlas.substitute import rule_predictions, simulated_patterns
    from headlens.models.vocab import vocab

    path = build(family, tmp_path / family, tokenizer=False)
    hf = getattr(transformers, {**FAMILIES, **JOINING}[family].model).from_pretrained(path).eval()
    if family == "qwen2":
        plant_offset_heads(hf, {(0, 0): 1})
    hf.save_pretrained(path)
    save_tokenizer(path)
    model = headlens.load(f"hf:{path}")
    from headlens.circuits.recorded import resumable

    assert resumable(model)
    windows = [torch.randint(3, 60, (24,)) for _ in range(6)]
    rules = candidate_rules()
    L, H = model.cfg.n_layers, model.cfg.n_heads
    from headlens.atlas.describe import Description

    mixes = [{"previous_token": 1.0}, {"first_token": 0.5, "recent_4": 0.5}, {"uniform": 1.0}]
    described = [Description(la, h, "previous_token", "previous_token", 0.9, (0.8, 1.0), "",
                             mixture=mixes[(la * H + h) % 3]) for la in range(L) for h in range(H)]
    classes = _classes(model, None)
    out, sub = substitute(model, described, windows, rules, classes, 4, max_rows=3 * 4 * 24,  # chunks of 3 copies
                          subst="exact", every_share=True)
    held = [windows[(j * 6) // 4] for j in range(4)]
    batch = _batch(held, vocab(model).special, classes)
    T = batch.tokens.shape[1]
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    cells = (k <= q) & batch.valid[:, None, :] & batch.query_ok[:, :, None]
    hits = {r: rule_targets(rules[r], batch, T) * cells for r in ("previous_token", "first_token", "recent_4",
                                                                   "uniform")}
    pats = simulated_patterns(described, rule_predictions(batch, hits), batch.query_ok)
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens)
    z_mean = {la: cache[f"blocks.{la}.attn.hook_z"].mean(0, keepdim=True) for la in range(L)}  # (1, T, H, d)

    def forward(replace_: dict[tuple[int, int], str]) -> torch.Tensor:
        kept = {}

        def keep(la):
            def hook(v, hook):
                kept[la] = v
            return hook

        def swap(la):
            def hook(z, hook):  # (B, T, H, d_head)
                z = z.clone()
                for (layer, h), how in replace_.items():
                    if layer != la:
                        continue
                    if how == "mean":
                        z[:, :, h] = z_mean[la][:, :, h].expand_as(z[:, :, h])
                        continue
                    v = kept[la][:, :, h // (H // kept[la].shape[2])]  # (B, T, d_head)
                    p = pats[(la, h)]
                    z[:, :, h] = torch.where(p.sum(-1, keepdim=True) > 0, p @ v, z[:, :, h])
                return z
            return hook
        hooks = [(f"blocks.{la}.attn.hook_v", keep(la)) for la in range(L)]
        hooks += [(f"blocks.{la}.attn.hook_z", swap(la)) for la in range(L)]
        with torch.no_grad(), model.hooks(hooks):
            return _loss(model(batch.tokens), batch.tokens, batch.valid)

    clean = forward({})
    assert sub.clean == pytest.approx(float(clean.mean()), abs=1e-5)
    for d in out:
        at = (d.layer, d.head)
        assert d.evidence["subst_delta"] == pytest.approx(float((forward({at: "p"}) - clean).mean()), abs=1e-5)
        assert d.ablation_delta == pytest.approx(float((forward({at: "mean"}) - clean).mean()), abs=1e-5)
    for la, (n, loss) in sub.per_layer.items():
        assert n == H and loss == pytest.approx(float(forward({(la, h): "p" for h in range(H)}).mean()), abs=1e-5)
    assert sub.all_heads == pytest.approx(float(forward({(d.layer, d.head): "p" for d in out}).mean()), abs=1e-5)


def test_a_role_the_substitution_test_contradicts_is_not_named():
    """induction-2l on repeated text: its layer-1 heads meet copy suppression's two claims (their OV pushes the
    token down, their off-rest attention finds predicted tokens), but removing them raises the loss, and not on
    the positions where a copy suppressor's removal would lower it: the page says so and names no role."""
    import headlens

    atlas = build_atlas(headlens.load("induction-2l"), AtlasConfig(corpus="repeats"))
    withheld = [d for d in atlas.descriptions if d.evidence.get("withheld")]
    assert {(d.layer, d.head) for d in withheld} >= {(1, 2)}
    for d in withheld:
        assert d.role == "no clear role" and d.layer == 1 and d.evidence["withheld"] == "copy suppression"
        assert "The substitution test argues against copy suppression" in d.text and d.text.endswith("No role is named.")
        assert d.evidence["abl_lo"] > 0 and d.evidence["cs_hi"] >= 0
    assert all(d.role != "copy_suppression" for d in atlas.descriptions)
    assert {d.role for d in atlas.descriptions if (d.layer, d.head) in [(0, 0)]} == {"previous_token"}


def test_a_head_whose_rest_changes_along_the_window_gets_its_share_on_the_first_token_per_position():
    """Previous token beside the first token, built with 0.9 on the first token before position 8 and 0.2 from
    there: its description sets the first token's weight per band of query positions, agrees, and put back
    keeps the head's effect; the same mixture with one weight in every row keeps less of it."""
    from headlens.atlas.sinkbands import band_names
    from tests.atlas.planted import BANDED

    model = planted_gpt(banded=True)
    windows = repeat_windows(model, 32)
    atlas = build_atlas(model, AtlasConfig(k=3, batch_size=8), windows=windows)
    d = next(d for d in atlas.descriptions if (d.layer, d.head) == (1, 2))
    assert d.role == "previous_token" and set(d.mixture) == {"previous_token", "first_token"} and d.agreement > 0.99
    bands = dict(zip(band_names(len(d.sink_bands)), d.sink_bands, strict=True))  # windows of 32: the last is 16+
    for band, start in (("2-3", 2), ("4-7", 4), ("8-15", 8), ("16+", 16)):  # built: a step at position 8
        assert bands[band] == pytest.approx([p for s, p in BANDED if start >= s][-1], abs=0.02), band
    assert "the first token's weight set by the query's position (0-1 " in d.text and "8-15 0.20" in d.text
    assert d.share_kept > 0.95
    flat = replace(d, mixture={r: w for r, w in d.mixture.items()}, sink_bands=())  # its mean weights in every row
    rules = candidate_rules()
    from headlens.atlas.corpus import split

    held = split(windows)[1]
    (got,), _ = substitute(model, [d], held, rules)
    (without,), _ = substitute(model, [flat], held, rules)
    assert got.share_kept > 0.95 and without.share_kept < got.share_kept - 0.1


def test_a_head_whose_ablation_moves_no_loss_is_not_put_back_and_the_others_are_unchanged(mixed):
    """Mean-ablated first: a head whose mean ablation stays within its interval has no effect for its description
    to keep (share None, ``no_effect``, its ablation and interval exact); every other head gets the same numbers
    as when every head is put back; the page says why the head has no share."""
    from headlens.atlas.views import card_html
    from headlens.scoring.card import head_card

    model, windows, atlas = mixed
    held = windows[3::4]
    quiet = replace(next(d for d in atlas.descriptions if (d.layer, d.head) == (1, 2)), layer=1, head=1)  # writes 0
    descs = [d for d in atlas.descriptions if (d.layer, d.head) != (1, 1)] + [quiet]
    out, line = substitute(model, descs, held, candidate_rules(), None, 8, subst="exact")
    full, full_line = substitute(model, descs, held, candidate_rules(), None, 8, subst="exact", every_share=True)
    by, by_full = {(d.layer, d.head): d for d in out}, {(d.layer, d.head): d for d in full}
    none = by[(1, 1)]  # the planted head that writes nothing, given a description
    assert none.share_kept is None and none.evidence["share_how"] == "no_effect" and "subst_delta" not in none.evidence
    assert none.ablation_delta == by_full[(1, 1)].ablation_delta
    assert none.evidence["abl_lo"] <= 0 <= none.evidence["abl_hi"]
    for at, d in by.items():
        if at != (1, 1) and d.share_kept is not None:
            assert (d.share_kept, d.share_ci, d.evidence["subst_delta"]) == (
                by_full[at].share_kept, by_full[at].share_ci, by_full[at].evidence["subst_delta"])
    assert sum(d.share_kept is not None for d in out) >= 3
    assert (line.all_heads, line.per_layer) == (full_line.all_heads, full_line.per_layer)
    assert "there is no effect for its description to keep" in card_html(head_card(1, 1, None, none))
