"""Edges at named positions: equal to a naive hook patch at those positions on native models and
through the resumed bridge (GQA, soft-caps, windows, partial rotary), a planted position-specific circuit
found where it is and nowhere else, positions named by character span."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from headlens.circuits.api import circuit, setup
from headlens.circuits.edges import significant_mask
from headlens.circuits.engine import edge_values
from headlens.circuits.nodes import CircuitError, make_edges, parse_nodes
from headlens.circuits.positions import NamedPositions
from headlens.errors import ProbeError
from headlens.testing import PLANTED_ALPHABET, planted_circuit_model
from tests.conftest import make_gpt

TOL = 1e-5


def _named(task, seed: int = 0) -> NamedPositions:
    """Three named positions that differ per prompt; one prompt lacks C."""
    B, T = task.tokens.shape
    g = torch.Generator().manual_seed(seed)
    late = torch.randint(T // 2, T - 1, (B,), generator=g)
    early = torch.randint(1, T // 2, (B,), generator=g)
    c = torch.randint(T // 2, T - 1, (B,), generator=g)
    c[0] = -1
    return NamedPositions({"A": late, "B": early, "C": c}, (B, T))


def _compare(model, s, receivers: str, max_tokens: int = 2000) -> None:
    named = _named(s.task)
    edges = make_edges(model, parse_nodes(receivers, model), None, "qkv", positions=["A", "C", "all"],
                       sender_positions=["B", "all"])
    fast = edge_values(model, s.task, ["repeated_loss"], edges, s.deltas, True, max_tokens=max_tokens, named=named)
    naive = edge_values(model, s.task, ["repeated_loss"], edges, s.deltas, False, named=named)
    assert max(float(np.abs(fast[1][k] - naive[1][k]).max()) for k in naive[1]) < TOL
    moved = [e for e in edges if float(np.abs(naive[1][e, "repeated_loss"] - naive[0]["repeated_loss"]).max()) > 1e-4]
    assert len(moved) > len(edges) // 3  # the patches do something
    at = {e: float(np.abs(naive[1][e, "repeated_loss"] - naive[0]["repeated_loss"]).max()) for e in edges}
    for e in edges:  # a key or value read only at B is not the key read everywhere
        if e.input == "k" and e.pos == "A" and e.sender_pos == "B" and at[e.at("A", "all")] > 1e-3:
            assert abs(at[e] - at[e.at("A", "all")]) > 1e-7


def test_native_fast_equals_naive_at_positions():
    model = make_gpt(n_layers=3, init_range=0.2)
    s = setup(model, "repeated_loss", "mean", n_prompts=3, seed=1)
    _compare(model, s, "L1H0,L2H3,logits", max_tokens=500)


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_neox", "mistral", "gemma", "qwen3", "gemma3"])
def test_resumed_bridge_equals_one_forward_per_edge_at_positions(tmp_path, family):
    """GQA (Llama, Mistral with its sliding window shorter than the prompt), Gemma-2's soft-caps and
    post-attention norms, GPT-NeoX's parallel residual and partial rotary, Gemma's one key/value head (MQA),
    Qwen3's and Gemma-3's QK norms (Gemma-3's sliding and global layers): the resumed blocks (running only
    from the first patched query position on) equal a full forward per edge through the forks."""
    from hf_families import build

    import headlens

    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = headlens.load(f"hf:{build(family, tmp_path / family)}")
    s = setup(model, "repeated_loss", "mean", n_prompts=3, seed=2)
    from headlens.circuits.engine import make_patcher
    from headlens.circuits.resume import ResumePatcher

    assert isinstance(make_patcher(model, s.task), ResumePatcher)
    _compare(model, s, "L1H1,logits")


def _planted_rows(n: int = 16, seed: int = 0) -> list[dict]:
    """8 distinct letters, then one of them again (Q) and the letter that followed it: the induction head
    at Q reads the key K right after the earlier copy. Nothing else repeats."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        x = "".join(rng.permutation(list(PLANTED_ALPHABET[:16]))[:8])
        j = int(rng.integers(0, 7))
        rows.append({"text": x + x[j] + x[j + 1],
                     "positions": {"Q": [8, 9], "K": [j + 1, j + 2], "F": [0, 1], "L": [9, 10]}})
    return rows


def test_a_planted_position_specific_circuit_is_found_at_its_position_and_nowhere_else():
    """The planted induction circuit acts at one position of each prompt: its edges are significant at
    receiver Q (sender K for the key and value) and exactly zero at every other named position pair."""
    model = planted_circuit_model()
    df = circuit(model, receivers="L1H0", metric="lm_loss", method="zero", prompts=_planted_rows(),
                 positions="Q,F,L", sender_positions="K,F,Q", n_control=3)
    sig = df[significant_mask(df)]
    found = set(sig[["sender", "input", "receiver_pos", "sender_pos"]].itertuples(index=False, name=None))
    assert found == {("embed", "q", "Q", "Q"), ("embed", "v", "Q", "K"), ("L0H0", "k", "Q", "K")}
    key = df[(df.sender == "L0H0") & (df.input == "k")].set_index(["receiver_pos", "sender_pos"]).effect
    assert key[("Q", "K")] > 0.2
    assert all(v == 0.0 for k, v in key.items() if k != ("Q", "K"))  # the same edge elsewhere: nothing
    assert {"receiver_pos", "sender_pos"} <= set(df.columns)


def test_positions_named_by_character_span_are_the_span_s_last_token(tmp_path):
    from headlens.probes.named import named_positions

    model = planted_circuit_model()
    texts, index = named_positions(model, [{"text": "abcde", "positions": {"X": [1, 3]}}, "ab"])
    assert texts == ["abcde", "ab"] and index["X"].tolist() == [3, -1]  # 'c' is token 3 after BOS
    from hf_families import build

    import headlens

    bpe = headlens.load(f"hf:{build('llama', tmp_path / 'llama')}")
    text = "When Mary and John went to the store, John gave a drink to"
    spans = {"IO": [5, 9], "S2": [38, 42], "END": [56, 58]}
    _, index = named_positions(bpe, [{"text": text, "positions": spans}])
    ids = bpe.to_tokens(text)[0]
    for name, (a, b) in spans.items():  # the named token decodes to the span's last piece
        piece = bpe.tokenizer.decode(ids[int(index[name][0])]).strip()
        assert piece and text[a:b].endswith(piece), (name, piece)
    for bad, msg in (({"X": [3, 1]}, "character offsets"), ({"all": [0, 1]}, "not allowed"),
                     ({"X": [0, 99]}, "character offsets")):
        with pytest.raises(ProbeError, match=msg):
            named_positions(model, [{"text": "abcde", "positions": bad}])
    with pytest.raises(ProbeError, match="unknown field"):
        named_positions(model, [{"text": "abcde", "where": {}}])


def test_unknown_positions_are_one_line():
    model = planted_circuit_model()
    with pytest.raises(CircuitError, match="unknown position 'Z'; the prompts name Q, K, F, L, all"):
        circuit(model, receivers="L1H0", metric="lm_loss", prompts=_planted_rows(4), positions="Z")
    with pytest.raises(CircuitError, match="the prompts name none"):
        circuit(model, receivers="L1H0", n_prompts=2, positions="END")


def test_cli_positions_from_a_jsonl_file(tmp_path: Path, monkeypatch, capsys):
    import json

    import pandas as pd

    from headlens.models.checkpoint import save_checkpoint
    from tests.conftest import run_cli

    ckpt = save_checkpoint(planted_circuit_model(), tmp_path / "planted.safetensors")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in _planted_rows(8)) + "\n")
    out = tmp_path / "edges.csv"
    code, _, err = run_cli(monkeypatch, capsys, "circuit", "--model", str(ckpt), "--receivers", "L1H0",
                           "--senders", "L0H0", "--inputs", "k", "--metric", "lm_loss", "--method", "zero",
                           "--prompts", str(prompts), "--positions", "Q", "--sender-positions", "K,F",
                           "--n-control", "0", "--out", str(out))
    assert code == 0, err
    df = pd.read_csv(out)
    assert list(zip(df.receiver_pos, df.sender_pos, strict=True)) == [("Q", "K"), ("Q", "F")]
    assert df.effect[0] > 0.2 and df.effect[1] == 0.0


@pytest.mark.parametrize("method", ["corrupted", "mean"])
def test_ioi_edges_at_its_positions_equal_one_forward_per_edge(tmp_path, method):
    """The IOI probe on a grouped-query Llama: prompts of different templates put END (and S2) at different
    positions, so the resumed blocks run each prompt's own positions; logit_diff reads only the answers'
    logits. Equal to one full forward per edge; the reference is each prompt's ABC twin (corrupted) or the
    aligned mean over the twins."""
    from ioi_models import save_ioi_llama

    import headlens

    model = headlens.load(f"hf:{save_ioi_llama(tmp_path / 'ioi')}")
    s = setup(model, "logit_diff", method, prompts="ioi", n_prompts=6, seed=0)
    assert set(s.named.names) == {"IO", "S1", "S1+1", "S2", "END"} and len(set(s.named.index["END"].tolist())) > 1
    edges = make_edges(model, parse_nodes("L1H1,L1H2,logits", model), None, "qkv", positions=["END", "S2"],
                       sender_positions=["S2", "IO", "all"])
    fast = edge_values(model, s.task, ["logit_diff"], edges, s.deltas, True, named=s.named)
    naive = edge_values(model, s.task, ["logit_diff"], edges, s.deltas, False, named=s.named)
    assert max(float(np.abs(fast[1][k] - naive[1][k]).max()) for k in naive[1]) < TOL
    moved = [e for e in edges if float(np.abs(naive[1][e, "logit_diff"] - naive[0]["logit_diff"]).max()) > 1e-4]
    assert len(moved) > len(edges) // 3


def test_grouped_spans_equal_one_forward_per_edge(tmp_path, monkeypatch):
    """IOI prompts of several templates resume S2 -> END in groups of similar span (and a key or value sent from
    S2 or IO recomputes block R there alone): each group reads its own prompts' clean run, equal to one full
    forward per edge; the grouping is checked to happen, with several copies per chunk."""
    from ioi_models import save_ioi_llama

    import headlens
    from headlens.circuits import resume

    model = headlens.load(f"hf:{save_ioi_llama(tmp_path / 'ioi')}")
    s = setup(model, "logit_diff", "mean", prompts="ioi", n_prompts=16, seed=3)
    seen = []
    real = resume.span_groups
    monkeypatch.setattr(resume, "span_groups", lambda span: seen.append(out := real(span, saving=0.0)) or out)
    edges = make_edges(model, parse_nodes("L0H0,L0H3,L1H3", model), None, "qkv", positions=["END", "S2"],
                       sender_positions=["S2", "IO", "S1+1"])
    fast = edge_values(model, s.task, ["logit_diff"], edges, s.deltas, True, named=s.named)
    naive = edge_values(model, s.task, ["logit_diff"], edges, s.deltas, False, named=s.named)
    assert any(len(g) > 1 and all(len(rows) for rows, _ in g) for g in seen)  # grouped, no empty group
    assert max(float(np.abs(fast[1][k] - naive[1][k]).max()) for k in naive[1]) < TOL


def test_aligned_mean_over_the_corrupted_distribution():
    """At a named position the aligned mean is the mean over every twin at its own such position; elsewhere
    over the twins of the same layout."""
    from headlens.circuits.senders import Alignment, aligned_replaced

    ref = torch.arange(4 * 5, dtype=torch.float64).view(4, 5, 1)  # (B, T, 1): row r position t -> 5r + t
    al = Alignment({"END": torch.tensor([4, 3, 4, 3])}, torch.tensor([0, 1, 0, 1]))
    out = aligned_replaced(torch.zeros_like(ref), ref, "mean", 0, al)
    assert out[0, 4, 0] == out[1, 3, 0] == (4 + 8 + 14 + 18) / 4  # every END, wherever it is
    assert out[0, 1, 0] == (1 + 11) / 2 and out[1, 1, 0] == (6 + 16) / 2  # same layout, same position
    res = aligned_replaced(torch.zeros_like(ref), ref, "resample", 0, al)
    assert all(res[b, 1, 0] != ref[b, 1, 0] for b in range(4))  # another prompt of the layout


def test_a_receiver_position_in_a_prompts_padding_equals_one_forward_per_edge(tmp_path):
    """Prompts of different lengths whose named receiver position falls in one prompt's padding (past its end, where
    nothing is read): the resumed patcher takes its general path there, equal to one full forward per edge (the
    shortcut for chunks patched at queries alone indexed past the resumed positions)."""
    from hf_families import build

    import headlens

    model = headlens.load(f"hf:{build('llama', tmp_path / 'llama')}")
    s = setup(model, "lm_loss", "mean", prompts=["the quick brown fox jumps over the lazy dog " * 2, "a b c d e"],
              n_prompts=2)
    B, T = s.task.tokens.shape
    lengths = s.task.attention_mask.sum(1)
    late = torch.full((B,), T - 2)  # past the short prompt's end
    assert bool((late >= lengths).any())
    named = NamedPositions({"A": late, "B": torch.full((B,), 1)}, (B, T))
    edges = make_edges(model, parse_nodes("L1H0", model), None, "qkv", positions=["A"], sender_positions=["B"])
    fast = edge_values(model, s.task, ["lm_loss"], edges, s.deltas, True, named=named)
    naive = edge_values(model, s.task, ["lm_loss"], edges, s.deltas, False, named=named)
    assert max(float(np.abs(fast[1][k] - naive[1][k]).max()) for k in naive[1]) < TOL
