"""The atlas: planted heads get their roles, the streamed top-k equals a brute-force one, the CLI writes the site."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from headlens.atlas.build import build_atlas
from headlens.atlas.exemplars import AtlasConfig, exemplar_pass
from headlens.atlas.topk import RunningTopK
from tests.atlas.planted import planted_gpt, repeat_windows
from tests.conftest import make_gpt, run_cli


@pytest.fixture(scope="module")
def planted_atlas():
    model = planted_gpt()
    return build_atlas(model, AtlasConfig(k=5, batch_size=8), windows=repeat_windows(model, 32))


def test_planted_heads_get_the_role_they_were_built_with(planted_atlas):
    roles = {(d.layer, d.head): d for d in planted_atlas.descriptions}
    assert {at: d.role for at, d in roles.items()} == {
        (0, 0): "previous_token", (0, 1): "uniform", (1, 0): "induction", (1, 1): "resting"}
    assert roles[(0, 0)].agreement > 0.95 and roles[(1, 0)].agreement > 0.95
    assert roles[(1, 0)].ci[0] > 0.9  # the rule's held-out agreement, with its interval
    assert "writes the token it attends to" in roles[(1, 0)].text  # its OV copies into the logits
    assert "writes" not in roles[(0, 0)].text  # it writes into a subspace the unembedding does not read
    flat = roles[(0, 1)]  # zero W_Q and W_K: even attention over every key so far is what it does
    assert flat.mixture == {"uniform": 1.0} and flat.agreement > 0.99
    rest = roles[(1, 1)]  # described by the rule first_token, not by an exception
    assert rest.text.startswith("Rests on the first token: 1.00") and rest.mixture == {"first_token": 1.0}
    assert rest.agreement > 0.99 and f"r = {rest.agreement:.2f}" in rest.text
    assert 0.5 < roles[(1, 0)].coverage < 0.95  # induction has a target on the repeated part only


def test_planted_exemplars_mark_the_key_the_rule_predicts(planted_atlas):
    for e in planted_atlas.exemplars.top["attention"][0]:  # L0H0: the previous token
        assert e.key == e.query - 1 and e.attention[e.key] > 0.99
    for e in planted_atlas.exemplars.top["attention"][2]:  # L1H0: after the earlier copy of the query's token
        assert e.tokens[e.key - 1] == e.tokens[e.query]


def _reference(model, windows, k):
    """Per head, the k best (score, window, position) under off-rest attention and the write norm, from the
    model's own forward (hooks on the pattern and z) and its c_proj weight, over the whole corpus at once."""
    H, L = model.cfg.n_heads, model.cfg.n_layers
    att, wri = [[] for _ in range(L * H)], [[] for _ in range(L * H)]
    for w, ids in enumerate(windows):
        with torch.no_grad():
            _, cache = model.run_with_cache(ids[None])
        for layer in range(L):
            pat = cache[f"blocks.{layer}.attn.hook_pattern"][0].clone()  # (H, Q, K)
            T = pat.shape[-1]
            pat[:, :, 0] = 0
            pat[:, torch.arange(T), torch.arange(T)] = 0
            z = cache[f"blocks.{layer}.attn.hook_z"][0]  # (T, H, d_head)
            w_o = model.transformer.h[layer].attn.c_proj.weight.detach().T.reshape(H, model.cfg.d_head, -1)  # (H, d_head, D)
            for h in range(H):
                best = pat[h].amax(-1)  # (Q,)
                norm = (z[:, h] @ w_o[h]).norm(dim=-1)  # (Q,)
                att[layer * H + h] += [(float(best[q]), w, q) for q in range(2, T)]  # rows with an off-rest key
                wri[layer * H + h] += [(float(norm[q]), w, q) for q in range(1, T)]  # the first row is every window's
    top = lambda rows: [sorted(r, key=lambda x: -x[0])[:k] for r in rows]  # noqa: E731
    return {"attention": top(att), "write": top(wri)}


def test_streamed_topk_equals_brute_force_over_the_corpus():
    model = make_gpt(seed=3, attn_only=True, normalization="none")
    gen = torch.Generator().manual_seed(0)
    windows = [torch.cat([torch.tensor([256]), torch.randint(97, 123, (int(n),), generator=gen)])
               for n in torch.randint(12, 30, (10,), generator=gen)]
    streamed = exemplar_pass(model, windows, AtlasConfig(k=4, batch_size=3))
    whole = exemplar_pass(model, windows, AtlasConfig(k=4, batch_size=len(windows)))
    ref = _reference(model, windows, 4)
    for ranking in ("attention", "write"):
        for got, want in zip(streamed.top[ranking], ref[ranking], strict=True):
            assert [(e.window, e.position) for e in got] == [(w, q) for _, w, q in want]
            assert [e.score for e in got] == pytest.approx([s for s, _, _ in want], abs=1e-5)
    for ranking in ("dla_pos", "dla_neg"):  # batching changes nothing: same exemplars, same scores
        for got, want in zip(streamed.top[ranking], whole.top[ranking], strict=True):
            assert [(e.window, e.position) for e in got] == [(e.window, e.position) for e in want]
            assert [e.score for e in got] == pytest.approx([e.score for e in want], abs=1e-5)


def test_running_topk_keeps_the_k_largest_of_a_stream_with_their_payloads():
    gen = torch.Generator().manual_seed(1)
    data = torch.randn(3, 50, generator=gen, dtype=torch.float64)
    top = RunningTopK(3, 5)
    for start in range(0, 50, 7):
        top.merge(data[:, start:start + 7], lambda row, j, s=start: s + j)
    want = data.topk(5, dim=1)
    assert torch.equal(top.scores, want.values)
    assert top.payloads == want.indices.tolist()


def test_cli_writes_the_site_the_parquet_and_the_descriptions(monkeypatch, capsys, tmp_path):
    corpus = tmp_path / "letters.txt"
    gen = torch.Generator().manual_seed(0)
    letters = "abcdefghijklmnop"
    lines = []
    for _ in range(8):
        seg = "".join(letters[i] for i in torch.randperm(16, generator=gen)[:6].tolist())
        lines.append("xyz" + seg * 6)
    corpus.write_text("\n".join(lines))
    out = tmp_path / "site"
    code, _, err = run_cli(monkeypatch, capsys, "atlas", "--model", "induction-2l", "--out", str(out), "--corpus",
                           str(corpus), "--n-windows", "8", "--k", "3", "--quiet")
    assert code == 0, err
    frame = pd.read_parquet(out / "exemplars.parquet")
    assert set(frame["ranking"]) == {"attention", "write", "dla_pos", "dla_neg", "sample"}
    assert frame.groupby(["layer", "head", "ranking"]).size().max() == 3
    table = pd.read_csv(out / "descriptions.csv")
    assert len(table) == 8
    assert list(table.columns) == ["model", "layer", "head", "role", "rule", "agreement", "ci_low", "ci_high",
                                   "mixture", "coverage", "share_kept", "share_low", "share_high", "ablation_delta",
                                   "share_how", "subst_windows", "description"]
    assert (table.subst_windows[table.role != "no clear role"] > 0).all()
    line = pd.read_csv(out / "substitution.csv")
    assert list(line.scope) == ["all", "best", "best", "best"] + ["layer"] * (len(line) - 4)
    assert line.windows.iloc[0] > 0
    index = (out / "index.html").read_text()
    assert all(f"heads/L{layer}H{h}.html" in index for layer in range(2) for h in range(4))
    assert (out / "heads" / "L1H3.html").read_text().count("class='ex'") == 15  # 4 rankings and the sample x 3


def test_cli_bad_corpus_is_one_line(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "atlas", "--model", "induction-2l", "--out", str(tmp_path / "s"),
                           "--corpus", str(tmp_path / "missing.txt"))
    assert code == 5 and err.count("\n") == 1 and "missing.txt" in err


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_a_bridged_family_gets_its_planted_previous_token_head(family, tmp_path):
    """GQA (Qwen2) and post-attention norms (Gemma 3): the bridge path reads patterns, writes and DLA; the
    planted offset-1 head is named, the random heads are not given a role they do not have (even attention
    over the keys so far, ``uniform``, or over its sliding window, is what a random head does)."""
    import transformers
    from hf_families import FAMILIES, JOINING, build, plant_offset_heads, save_tokenizer

    import headlens

    path = build(family, tmp_path / family, tokenizer=False)
    fam = {**FAMILIES, **JOINING}[family]
    hf = getattr(transformers, fam.model).from_pretrained(path).eval()
    if family == "qwen2":
        plant_offset_heads(hf, {(0, 0): 1})
    hf.save_pretrained(path)
    save_tokenizer(path)
    atlas = build_atlas(headlens.load(f"hf:{path}"), AtlasConfig(n_windows=8, seq_len=48, k=3, batch_size=4))
    roles = {(d.layer, d.head): d.role for d in atlas.descriptions}
    even = ("no clear role", "resting", "uniform", "recent_16")  # Gemma 3's layer 0 attends in a sliding window
    named = {at for at, role in roles.items() if role not in even}
    assert named == ({(0, 0)} if family == "qwen2" else set())  # random heads attend about evenly: no more
    assert all(len(kept) == 3 for heads in atlas.exemplars.top.values() for kept in heads)


def test_the_predicted_token_rule_marks_earlier_copies_of_what_the_model_predicts():
    from headlens.atlas.rules import N_PREDICTED, predicted
    from headlens.probes.base import ProbeBatch

    t = torch.tensor([[9, 1, 2, 3, 2]])
    pred = torch.full((1, 5), 7)
    pred[0, 4] = 2  # at the last query the model predicts token 2, which sits at keys 2 and 4 (itself)
    batch = ProbeBatch(t, torch.tensor([5]), torch.ones(1, 5, dtype=torch.bool), t == 9, True,
                       {f"pred{i}": pred for i in range(N_PREDICTED)})
    hit = predicted(batch, torch.arange(5)[:, None], torch.arange(5)[None, :])  # (1, Q, K)
    assert hit[0].nonzero().tolist() == [[4, 2]]  # the earlier copy only, never the query itself


def test_several_models_get_a_cross_model_index_on_relative_depth(monkeypatch, capsys, tmp_path):
    from headlens.models.checkpoint import save_checkpoint

    ckpt = save_checkpoint(planted_gpt(), tmp_path / "planted.safetensors")
    corpus = tmp_path / "letters.txt"
    corpus.write_text("\n".join("abc" + "defghijk"[i:] + "dhkbe" * 5 for i in range(8)))
    out = tmp_path / "two"
    code, _, err = run_cli(monkeypatch, capsys, "atlas", "-m", "induction-2l", "-m", str(ckpt), "--out", str(out),
                           "--corpus", str(corpus), "--n-windows", "8", "--k", "2", "--quiet")
    assert code == 0, err
    index = (out / "index.html").read_text()
    assert "Atlas of 2 models" in index and "0-induction-2l/index.html" in index
    assert (out / "0-induction-2l" / "heads" / "L1H3.html").is_file()
    assert len(list(out.glob("1-*/heads/*.html"))) == 4  # the planted model's four heads
    assert "<circle" in index  # named heads drawn on relative depth


def test_readout_extremes_by_blocks_and_slices_equal_a_full_sort():
    """The promoted / suppressed tokens: the blocks holding a row's extremes, slice by slice, give exactly
    ``topk`` of the whole row (values with a planted runaway and a planted block of ties to the max)."""
    from headlens.atlas.exemplars import _extremes, _merge

    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 20000, generator=gen)
    logits[0, 17] = 50.0  # one token far above the rest
    logits[1, 300:310] = -40.0  # ten tokens tied at the bottom, more than the 5 listed
    found = []
    for start in range(0, logits.shape[1], 8192):  # a ragged last slice, as with a real vocabulary
        part = logits[:, start:start + 8192]
        for sign, ids in zip((1.0, -1.0), _extremes(part, 5), strict=True):
            found.append((sign * part.gather(1, ids), ids + start))
    assert _merge(found[0::2], 5) == logits.topk(5, -1).indices.tolist()
    down = _merge(found[1::2], 5)
    assert down[2:] == (-logits).topk(5, -1).indices.tolist()[2:]
    assert set(down[1]) <= set(range(300, 310)) and down[0] == (-logits[0]).topk(5).indices.tolist()
