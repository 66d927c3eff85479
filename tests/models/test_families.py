"""The architecture matrix: every family headlens claims, as a tiny random model built in-process, every command.

For each family of ``hf_families.FAMILIES`` (GPT-2, GPT-NeoX, GPT-J, OPT, Llama-GQA, Mistral with a
sliding window, Qwen2 with q/k/v biases, Gemma multi-query with ``head_dim != d_model / n_heads``,
Phi-3 with a fused qkv, BERT, RoBERTa; the newer families: Gemma 2/3 with post-norms, Qwen3, OLMo-2, Mixtral,
Phi-1/2, Falcon, Cohere, Starcoder2, StableLM) the directory is booted through ``headlens.load("hf:...")``
and checked against ``transformers`` alone:

* every ``blocks.{l}.attn.hook_pattern`` equals the eager attention weights (<= 1e-5, float32) on
  prompts longer than Mistral's window;
* the hook shapes are TransformerLens' (``hook_k``/``hook_v`` per key/value head, the rest per query head);
* ablating heads through ``hook_z`` (zero, mean, resample) gives the logits of an independent
  ablation: a forward pre-hook on the output projection that rewrites those heads' slices of its input;
* ``classify`` runs every applicable detector, ``sweep`` ablates with each method, and the
  dashboard loads the model (AppTest);
* ``circuit`` returns a whole, finite edge table into q, k, v and the logits, with a receiver metric, and
  restricted to named positions; ``doctor`` passes or says why it cannot tell (random weights: it cannot).
  Exactness of circuits is tests/circuits' (a freezing reference); ``attribute`` is tests/readout/test_dla_families.

A family that refuses a claim by design (``Family.refuses``) is checked to refuse it in one line; a claim a
family fails today through a known bug not fixed yet (``Family.known``) is a strict xfail.
Each model is built once per module and only when a test asks for it (``-k gemma`` builds one).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hf_families import (
    CLAIMS,
    FAMILIES,
    N_HEADS,
    N_LAYERS,
    SLIDING_WINDOW,
    Family,
    build,
    claims,
    load_eager,
    out_proj,
)

import headlens
from headlens.errors import HeadlensError
from headlens.models.vocab import vocab

TOL = 1e-5
T = 40  # > SLIDING_WINDOW: Mistral's window must bite
HEADS = [(0, 3), (1, 1)]  # one per layer; under GQA L1H1 shares its key/value head with L1H0


class Built:
    def __init__(self, family: str, path: Path) -> None:
        self.family, self.path = family, path
        self.model = headlens.load(f"hf:{path}")
        self.hf = load_eager(path, family)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Built]:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    root, cache = tmp_path_factory.mktemp("families"), {}

    def get(family: str) -> Built:
        if family not in cache:
            cache[family] = Built(family, build(family, root / family))
        return cache[family]

    return get


def _tokens(model: Any, n: int, seed: int, length: int = T) -> torch.Tensor:
    """``n`` prompts of ``length`` tokens: ordinary ids inside the model's own specials."""
    v = vocab(model)
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor(v.ordinary)
    body = length - v.n_special_positions
    return torch.tensor([v.wrap(pool[torch.randint(len(pool), (body,), generator=gen)].tolist()) for _ in range(n)])


@pytest.mark.parametrize("family", claims("patterns"))
def test_patterns_equal_transformers_eager(built, family):
    b = built(family)
    tokens = _tokens(b.model, 2, seed=1)
    _, cache = b.model.run_with_cache(tokens, names_filter=lambda n: n.endswith("attn.hook_pattern"))
    with torch.no_grad():
        ref = b.hf(tokens, output_attentions=True).attentions
    diff = max(float((cache[f"blocks.{layer}.attn.hook_pattern"] - ref[layer]).abs().max()) for layer in range(N_LAYERS))
    assert diff <= TOL, f"{family}: max |pattern - eager| = {diff:.2e}"
    pattern = cache["blocks.1.attn.hook_pattern"]  # (B, H, Q, K)
    if FAMILIES[family].causal:
        assert float(pattern.triu(1).abs().max()) == 0
    if family == "mistral":  # the window bites: the last query sees exactly SLIDING_WINDOW keys
        seen = (pattern[:, :, -1] > 0).sum(-1)  # (B, H)
        assert bool((seen == SLIDING_WINDOW).all()) and T > SLIDING_WINDOW


@pytest.mark.parametrize("family", claims("patterns"))
def test_hook_shapes(built, family):
    b, fam = built(family), FAMILIES[family]
    tokens = _tokens(b.model, 2, seed=2, length=11)
    assert (b.model.n_layers, b.model.n_heads, b.model.cfg.d_head) == (N_LAYERS, N_HEADS, fam.d_head)
    assert b.model.is_causal is fam.causal
    _, cache = b.model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.1.attn.hook_"))
    shape = {k.rsplit(".", 1)[1]: tuple(v.shape) for k, v in cache.items()}
    assert shape["hook_pattern"] == shape["hook_attn_scores"] == (2, N_HEADS, 11, 11)
    assert shape["hook_q"] == shape["hook_z"] == (2, 11, N_HEADS, fam.d_head)
    assert shape["hook_k"] == shape["hook_v"] == (2, 11, fam.n_kv_heads, fam.d_head)
    assert b.model.active_hooks() == []


def _independent_ablation(b: Built, tokens: torch.Tensor, method: str, reference: torch.Tensor,
                          ref_row: int = 0) -> torch.Tensor:
    """Logits with ``HEADS`` removed by pre-hooks on the output projections of plain ``transformers``.

    ``resample`` gives every input row the heads' activations of reference row ``ref_row``.
    """
    d, layers = FAMILIES[b.family].d_head, sorted({layer for layer, _ in HEADS})
    captured: dict[int, torch.Tensor] = {}
    handles = [out_proj(b.hf, b.family, layer).register_forward_pre_hook(
        lambda mod, args, layer=layer: captured.__setitem__(layer, args[0].detach())) for layer in layers]
    try:
        with torch.no_grad():
            b.hf(reference)  # clean reference: every head's z, concatenated (R, T, H * d_head)
    finally:
        for h in handles:
            h.remove()

    def rewrite(layer: int) -> Any:
        def pre_hook(mod: Any, args: tuple) -> tuple:
            x = args[0].clone()  # (B, T, H * d_head): head h owns columns h*d .. (h+1)*d
            for hl, h in HEADS:
                cols = slice(h * d, (h + 1) * d)
                if hl != layer:
                    continue
                if method == "zero":
                    x[..., cols] = 0
                elif method == "mean":
                    x[..., cols] = captured[layer].mean(0)[: x.shape[1], cols]
                else:
                    x[..., cols] = captured[layer][ref_row, : x.shape[1], cols]
            return (x, *args[1:])

        return pre_hook

    handles = [out_proj(b.hf, b.family, layer).register_forward_pre_hook(rewrite(layer)) for layer in layers]
    try:
        with torch.no_grad():
            return b.hf(tokens).logits
    finally:
        for h in handles:
            h.remove()


def _reference(b: Built, tokens: torch.Tensor, method: str, reference: torch.Tensor,
               ours: torch.Tensor) -> torch.Tensor:
    """The independent ablation's logits. Under ``resample`` the reference row each input row drew is
    found by comparing ``ours`` with every candidate (one other prompt each), never read from the code."""
    if method != "resample":
        return _independent_ablation(b, tokens, method, reference)
    by_row = [_independent_ablation(b, tokens, method, reference, ref_row=r) for r in range(len(reference))]
    drawn = [[r for r, cand in enumerate(by_row) if float((ours[i] - cand[i]).abs().max()) <= TOL]
             for i in range(len(tokens))]
    assert all(len(d) == 1 and d[0] != i for i, d in enumerate(drawn)), drawn
    return torch.stack([by_row[d[0]][i] for i, d in enumerate(drawn)])


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
@pytest.mark.parametrize("family", claims("ablate"))
def test_ablation_equals_an_output_projection_pre_hook(built, family, method):
    b = built(family)
    tokens, reference = _tokens(b.model, 2, seed=3), _tokens(b.model, 3, seed=4)
    with torch.no_grad(), headlens.ablate(b.model, HEADS, method=method, reference=reference, seed=0):
        ours = b.model(tokens)
    ref = _reference(b, tokens, method, reference, ours)
    with torch.no_grad():
        clean = b.hf(tokens).logits
    assert float((ref - clean).abs().max()) > 1e-3  # the ablation does something
    diff = float((ours - ref).abs().max())
    assert diff <= TOL, f"{family}/{method}: max |logits - pre-hook reference| = {diff:.2e}"


@pytest.mark.parametrize("family", claims("classify"))
def test_classify_and_sweep(built, family):
    from headlens.interventions.sweep import sweep
    from headlens.scoring.classification import select_detectors

    b, fam = built(family), FAMILIES[family]
    dets, _, _ = select_detectors(b.model, None)
    df = headlens.classify(b.model, n_prompts=10, seq_len=24, n_boot=100)
    ran = set(df.detector)
    assert ran == {d.name for d in dets} - set(df.attrs["skipped"]), (ran, df.attrs["skipped"])
    assert len(df) == len(ran) * N_LAYERS * N_HEADS and df.score.notna().all()
    assert {"previous_token", "first_token"} <= ran and ("ov_copying" in ran) is fam.causal  # no OV readout in MLMs
    assert ("next_token" in ran) is (not fam.causal) and "bracket_matching" in ran
    group = N_HEADS // fam.n_kv_heads
    if "kv_head" in df.columns:
        assert (df.kv_head == df["head"] // group).all()
    metrics, prompts = (["repeated_loss"], None) if fam.causal else (["kl"], ["def f(x):", "return [x]"])
    for method in ("zero", "mean", "resample"):
        res = sweep(b.model, groups=[HEADS], method=method, metrics=metrics, prompts=prompts, n_prompts=4,
                    n_control=0, n_boot=50, attribution=False)
        assert len(res) == 1 and res.delta.notna().all() and abs(float(res.delta.iloc[0])) > 0, (method, res)


@pytest.mark.parametrize("family", claims("dashboard"))
def test_dashboard_loads_it(built, family, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from headlens.app import helpers as hd

    b = built(family)
    monkeypatch.setattr(hd, "DEFAULT_N_PROMPTS", 4)
    monkeypatch.setenv(hd.MODEL_ENV, f"hf:{b.path}")
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "apps" / "dashboard.py"), default_timeout=300)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    from headlens.app.ui import md

    assert any(md(b.path.name) in c.value for c in at.caption), [c.value for c in at.caption]  # as Markdown shows it


def _refused(fam: Family, claim: str) -> contextlib.AbstractContextManager:
    """Where ``fam`` refuses ``claim`` by design: expect its one-line ``HeadlensError``; else nothing."""
    why = fam.refuses.get(claim)
    return pytest.raises(HeadlensError, match=why) if why else contextlib.nullcontext()


TEXTS = ["def f(x):\n    return x + 1", "import os\nprint(os.sep)", "for i in range(3): pass", "y = [1, 2]"]
SENDERS_L1 = ["embed", "L0H0", "L0H1", "L0H2", "L0H3", "mlp0"]  # every node that writes before layer 1
SENDERS_ALL = [*SENDERS_L1, "L1H0", "L1H1", "L1H2", "L1H3", "mlp1"]


def _check_table(df: Any, senders: list[str], inputs: str, positions: tuple[str, ...] = ("all",)) -> None:
    """One finite row per (sender, input, receiver position), every sender, a CI around each effect."""
    assert sorted(df.sender.unique()) == sorted(senders) and set(df.input) == set(inputs)
    assert set(df.receiver_pos) == set(positions)
    assert len(df) == len(senders) * len(inputs) * len(positions), df[["sender", "input", "receiver_pos"]]
    assert np.isfinite(df.effect).all() and (df.ci_low <= df.ci_high).all()
    assert float(df.effect.abs().max()) > 0  # random weights: every edge does something somewhere


def _circuit_kw(fam: Family) -> dict[str, Any]:
    """Few, short prompts; an encoder's metric is ``kl`` on text (next-token metrics are refused there)."""
    return dict(n_prompts=3, n_control=1, n_boot=50) | ({} if fam.causal else dict(metric="kl", prompts=TEXTS))


@pytest.mark.parametrize("family", claims("circuit"))
def test_circuit_into_q_k_v_and_the_logits(built, family):
    b, fam = built(family), FAMILIES[family]
    with _refused(fam, "circuit") if not fam.causal else contextlib.nullcontext():  # encoders: no logits edges either
        logits = headlens.circuit(b.model, receivers="logits", **_circuit_kw(fam))
        _check_table(logits, SENDERS_ALL, ["resid"])
    with _refused(fam, "circuit"):
        df = headlens.circuit(b.model, receivers="L1H1", **_circuit_kw(fam))
        _check_table(df, SENDERS_L1, "qkv")
        assert (df.kv_head == 1 // (N_HEADS // fam.n_kv_heads)).all()  # L1H1's key/value head under GQA / MQA
        assert df.control.notna().any()  # random senders of the same layer, for the heads


@pytest.mark.parametrize("family", claims("circuit_receiver"))
def test_circuit_with_a_receiver_metric(built, family):
    b, fam, metric = built(family), FAMILIES[family], "receiver:previous_token"  # induction: past a window
    with _refused(fam, "circuit_receiver"):
        df = headlens.circuit(b.model, receivers="L1H1", inputs="qk", **_circuit_kw(fam) | dict(metric=metric))
        _check_table(df, SENDERS_L1, "qk")
        assert df.attrs["metric"] == metric


@pytest.mark.parametrize("family", claims("circuit_positions"))
def test_circuit_at_named_positions(built, family):
    """Prompts that name their positions by character span: one row per receiver position."""
    b, fam = built(family), FAMILIES[family]
    prompts = [{"text": t, "positions": {"START": [0, 1], "END": [len(t) - 1, len(t)]}} for t in TEXTS]
    kw = dict(metric="kl", prompts=prompts, positions="START,END", n_prompts=len(TEXTS), n_control=0, n_boot=50)
    with _refused(fam, "circuit") if not fam.causal else contextlib.nullcontext():  # encoders: no logits edges either
        _check_table(headlens.circuit(b.model, receivers="logits", **kw), SENDERS_ALL, ["resid"], ("START", "END"))
    with _refused(fam, "circuit_positions"):
        df = headlens.circuit(b.model, receivers="L1H1", inputs="qk", **kw)
        _check_table(df, SENDERS_L1, "qk", ("START", "END"))


@pytest.mark.parametrize("family", claims("doctor"))
def test_doctor_passes_or_says_why_it_cannot_tell(built, family):
    """``headlens doctor`` as a user runs it. Random weights: it cannot separate head layouts by loss, so it
    says inconclusive (exit 9) with its reasons, or passes (exit 0) on evidence the weights fix (a QK norm's
    width); never fails, never a traceback. An encoder is refused in one line."""
    from typer.testing import CliRunner

    from headlens.cli import app

    b, fam = built(family), FAMILIES[family]
    result = CliRunner().invoke(app, ["doctor", f"hf:{b.path}", "--rows", "4", "--seq-len", "32", "--json", "-q"])
    assert isinstance(result.exception, SystemExit | None) and "Traceback" not in result.output, result.output
    if why := fam.refuses.get("doctor"):
        lines = result.stderr.strip().splitlines()
        assert result.exit_code not in (0, 8, 9) and len(lines) == 1 and why in lines[0], result.output
        return
    report = json.loads(result.stdout)
    assert (result.exit_code, report["verdict"]) in ((0, "passed"), (9, "inconclusive")), result.output
    if report["verdict"] == "passed":
        assert (report["inferred_n_heads"], report["inferred_n_kv_heads"]) == (N_HEADS, fam.n_kv_heads), report
    else:
        assert not report["passed"] and report["warnings"], report  # why each source could not tell

ROWS = {"gpt2": "GPT-2", "gpt_neox": "GPT-NeoX", "gptj": "GPT-J", "opt": "OPT", "llama": "Llama", "mistral": "Mistral",
        "qwen2": "Qwen2", "gemma": "Gemma (", "phi3": "Phi-3", "bert": "BERT", "roberta": "RoBERTa", "gemma2": "Gemma 2",
        "gemma3": "Gemma 3", "qwen3": "Qwen3", "olmo2": "OLMo-2", "mixtral": "Mixtral", "phi": "Phi-1/2",
        "falcon": "Falcon", "cohere": "Cohere", "starcoder2": "Starcoder2", "stablelm": "StableLM"}
COLUMNS = ["family (config in the matrix)", "patterns, classify", "ablate", "attribute", "circuit", "doctor",
           "dashboard", "does not, and why", "parity: pattern / ablation"]


@pytest.mark.parametrize("page", ["README.md", "docs/models.md"])
def test_the_matrix_on_the_page_has_every_family_and_command(page):
    """The published table: its header row, a column per command, one row per family of FAMILIES; a family
    with a known bug says so in its row. The claims the tests check name real commands."""
    for fam in FAMILIES.values():
        assert set(fam.refuses) | set(fam.known) <= set(CLAIMS) and not set(fam.refuses) & set(fam.known)
    text = (Path(__file__).resolve().parents[2] / page).read_text(encoding="utf-8")
    lines = text[text.index("## Architectures"):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| family"))
    assert [c.strip() for c in lines[start].strip("|").split("|")] == COLUMNS and lines[start + 1].startswith("|---")
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2:]))  # the table's body
    assert len(rows) == len(FAMILIES) == len(ROWS)
    for name, fam in FAMILIES.items():
        row = next(r for r in rows if r.startswith(f"| {ROWS[name]}"))
        assert len(row.strip("|").split("|")) == len(COLUMNS), row
        assert ("known bug" in row) is bool(fam.known), (name, row)
