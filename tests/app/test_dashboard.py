"""The dashboard's non-UI helpers: head ids, selection syncing, example texts, patterns, losses."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import make_gpt

from headlens import GPT, ModelConfig, save_checkpoint
from headlens.app import cache, history
from headlens.app import helpers as hd
from headlens.errors import HeadlensError, ProbeError
from headlens.models.tokenizer import Tokenizer


def char_model(alphabet: str = "()[]{}abcdefgh ", n_ctx: int = 64) -> GPT:
    tok = Tokenizer.char_level(alphabet)
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=32, n_ctx=n_ctx, d_vocab=tok.d_vocab, attn_only=True,
                      normalization="none")
    return GPT(cfg, tokenizer=tok, name="char").eval()


def test_head_ids_round_trip_and_bad_ids_say_what_was_expected():
    for layer, head in [(0, 0), (3, 11), (12, 7)]:
        assert hd.parse_head(hd.format_head(layer, head)) == (layer, head)
    assert hd.parse_head(" l1h2 ") == (1, 2)
    for bad in ["", "L1", "H2", "1,2", "L-1H2", "L1H2x"]:
        with pytest.raises(HeadlensError, match="L\\{layer\\}H\\{head\\}"):
            hd.parse_head(bad)
    assert hd.all_heads(2, 2) == ["L0H0", "L0H1", "L1H0", "L1H1"]


def test_heads_from_selection_reads_customdata_in_every_shape_streamlit_gives():
    points = [{"customdata": [1, 2, "L1H2"], "x": 2, "y": 1}, {"customdata": [0, 3]},
              {"customdata": [1, 2]}, {"x": 5}]
    assert hd.heads_from_selection({"selection": {"points": points}}) == ["L1H2", "L0H3"]
    assert hd.heads_from_selection({"points": points[:1]}) == ["L1H2"]
    assert hd.heads_from_selection(points[1:2]) == ["L0H3"]
    assert hd.heads_from_selection(None) == []
    assert hd.heads_from_selection({"selection": {"points": []}}) == []


def test_sync_selection_lets_a_new_click_win_but_never_a_stale_one():
    # a new click replaces the hand-picked heads
    assert hd.sync_selection(["L0H0"], ["L1H1"], []) == ["L1H1"]
    assert hd.sync_selection(["L0H0"], ["L1H1", "L0H2"], ["L1H1"]) == ["L1H1", "L0H2"]
    # the same grid selection as last time: the multiselect (edited by hand) wins
    assert hd.sync_selection(["L0H0", "L0H1"], ["L1H1"], ["L1H1"]) == ["L0H0", "L0H1"]
    # a cleared grid selection does not clear the multiselect
    assert hd.sync_selection(["L0H0"], [], ["L1H1"]) == ["L0H0"]


def test_example_text_uses_only_the_alphabet_and_has_repeats_and_brackets():
    model = char_model()
    text = hd.example_text(model)
    assert set(text) <= set(model.tokenizer.alphabet)
    assert model.to_tokens(text).shape[1] <= model.cfg.n_ctx
    words = text.split(" ")
    assert words[0] == words[1] and len(words[0]) >= 4  # a repeated segment
    assert "([{" in text and "}])" in text  # nested brackets
    no_brackets = char_model("abcdefghijklmnop ")
    assert set(hd.example_text(no_brackets)) <= set("abcdefghijklmnop ")
    tiny_ctx = char_model(n_ctx=12)
    assert 0 < tiny_ctx.to_tokens(hd.example_text(tiny_ctx)).shape[1] <= 12


def test_byte_example_repeats_a_line_and_has_brackets():
    model = make_gpt(n_ctx=256)
    text = hd.example_text(model)
    assert text.count("def area(width, height):") == 2
    assert all(ch in text for ch in "()[]")


def test_validate_text_refuses_empty_and_too_long_text():
    model = make_gpt(n_ctx=16)
    with pytest.raises(ProbeError, match="empty"):
        hd.validate_text(model, "  \n")
    with pytest.raises(ProbeError, match="n_ctx=16"):
        hd.validate_text(model, "x" * 40)
    with pytest.raises(ProbeError, match="alphabet"):
        hd.validate_text(char_model(), "xyz!")
    assert hd.validate_text(model, "abc").shape == (1, 4)


def test_head_patterns_are_the_models_own_and_leave_no_hooks():
    model = make_gpt()
    tokens, patterns = hd.head_patterns(model, "abcabc", [(1, 2), (0, 1)])
    assert tokens == ["<bos>", "a", "b", "c", "a", "b", "c"]
    _, cache = model.run_with_cache("abcabc", names_filter=lambda n: n.endswith("hook_pattern"))
    np.testing.assert_allclose(patterns[(1, 2)], cache["blocks.1.attn.hook_pattern"][0, 2].numpy())
    np.testing.assert_allclose(patterns[(0, 1)].sum(-1), 1.0, atol=1e-5)
    assert model.active_hooks() == []
    fired = []
    with model.hooks([("blocks.1.attn.hook_pattern", lambda x, hook: fired.append(hook.name))]):
        _, only = hd.head_patterns(model, "abcabc", [(0, 1)])
    assert not fired and model.active_hooks() == []  # the pass stopped after layer 0
    np.testing.assert_allclose(only[(0, 1)], patterns[(0, 1)])


def test_token_losses_are_next_token_cross_entropy():
    model = make_gpt()
    tokens = model.to_tokens("hello world")
    expected = F.cross_entropy(model(tokens)[0, :-1], tokens[0, 1:], reduction="none")
    np.testing.assert_allclose(hd.token_losses(model, tokens), expected.detach().numpy(), rtol=1e-5)


def test_loss_diff_html_colours_each_token_and_escapes_it():
    page = hd.loss_diff_html(["<b>", " x", "\n"], [1.0, -0.5, 0.0])
    assert "&lt;b&gt;" in page and "<b>" not in page
    assert "rgba(220,40,40,0.85)" in page  # the largest increase: full red
    assert "rgba(40,90,220,0.42)" in page  # half the magnitude, blue
    assert page.count("<span") == 3
    assert "+1.000 nats" in page


def test_heads_table_is_one_row_per_head_with_labels():
    rows = []
    for layer in range(2):
        for head in range(2):
            for det in ("induction", "previous_token"):
                rows.append(dict(model="m", layer=layer, head=head, detector=det, score=0.1 * (layer + head),
                                 ci_low=0, ci_high=1, baseline=0.1, lift=layer + head + (det == "induction"),
                                 n_positions=1, n_prompts=1, label=(layer, head) == (1, 1)))
    table = hd.heads_table(pd.DataFrame(rows))
    assert list(table["head"]) == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert list(table.columns[:5]) == ["head", "layer", "index", "kv_head", "labels"]
    assert list(table["kv_head"]) == [0, 1, 0, 1]  # a table without kv_head: no GQA, kv_head == head
    assert table.loc[3, "labels"] == "induction, previous_token"  # strongest lift first
    assert table.loc[0, "labels"] == ""
    assert table.loc[2, "induction"] == pytest.approx(0.1)
    assert hd.heads_table(pd.DataFrame()).empty


def test_snapshots_next_to_a_checkpoint_give_the_loss_curve(tmp_path):
    model = make_gpt()
    save_checkpoint(model, tmp_path / "m.safetensors")
    assert history.find_snapshots(str(tmp_path / "m.safetensors")) == []
    for step, loss in [(200, 2.0), (50, 4.0), (100, 3.0)]:
        save_checkpoint(model, tmp_path / "snapshots" / f"step_{step:05d}.safetensors",
                        metadata={"step": step, "loss": loss}, half=True)
    snaps = history.find_snapshots(str(tmp_path / "m.safetensors"))
    assert [p.name for p in snaps] == ["step_00050.safetensors", "step_00100.safetensors", "step_00200.safetensors"]
    losses = history.training_losses(snaps)
    assert list(losses["step"]) == [50, 100, 200] and list(losses["loss"]) == [4.0, 3.0, 2.0]
    (tmp_path / "log.json").write_text('{"log": [{"step": 10, "loss": 5.0, "lr": 1}, {"step": 20, "loss": 4.5}]}')
    assert list(history.training_losses(snaps)["loss"]) == [5.0, 4.5]  # the full log wins over snapshot metadata
    assert history.find_snapshots("minilm") == [] and history.find_snapshots("hf:/nowhere") == []


def test_release_hooks_removes_leaked_hooks():
    model = make_gpt()
    model.hook_dict["blocks.0.attn.hook_z"].add_hook(lambda x, hook: None)
    assert hd.release_hooks(model) == ["blocks.0.attn.hook_z"]
    assert model.active_hooks() == []


def test_initial_model_and_fingerprint(tmp_path):
    assert hd.initial_model({hd.MODEL_ENV: " induction-2l "}) == "induction-2l"
    assert hd.initial_model({}) is None
    path = tmp_path / "m.safetensors"
    save_checkpoint(make_gpt(), path)
    before = hd.fingerprint(str(path))
    save_checkpoint(make_gpt(seed=1, n_ctx=32), path)
    assert hd.fingerprint(str(path)) != before  # a rewritten checkpoint is a new cache entry
    assert hd.fingerprint("/no/such/file") == "/no/such/file"
    assert hd.model_choices()[-1] == hd.CUSTOM_CHOICE


def test_the_app_script_ships_inside_the_package():
    script = cache.app_script()
    assert script.is_file() and script.parent.parent.name == "headlens"


def test_cli_refuses_an_unknown_model_and_a_busy_port_in_one_line():
    import socket

    from typer.testing import CliRunner

    from headlens.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["dashboard", "--model", "/no/such/model.safetensors"])
    assert result.exit_code == 4 and "no such file" in result.stderr  # one line, the exit code
    assert result.stderr.count("\n") == 1
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = runner.invoke(app, ["dashboard", "--port", str(port)])
    assert result.exit_code == 7 and f"port {port}" in result.stderr
    help_text = runner.invoke(app, ["dashboard", "--help"]).output
    assert "--model" in help_text and "--port" in help_text


def test_cli_serves_the_packaged_script_on_localhost():
    from headlens.cli.dashboard import HOST, streamlit_args

    args = streamlit_args(8601)
    assert args[:2] == ["run", str(cache.app_script())]
    assert args[args.index("--server.address") + 1] == HOST == "127.0.0.1"
    assert args[args.index("--server.port") + 1] == "8601"
    assert args[args.index("--server.headless") + 1] == "true"


def test_exclusive_use_of_a_shared_model_serialises_hooked_passes_and_cleans_up():
    import threading
    import time

    model = make_gpt()
    order: list[str] = []

    def hooked(name: str) -> None:
        with cache.exclusive(model):
            model.hook_dict["blocks.0.attn.hook_z"].add_hook(lambda x, hook: None)  # a leak, on purpose
            order.append(f"{name} in")
            time.sleep(0.05)
            order.append(f"{name} out")

    threads = [threading.Thread(target=hooked, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])
    assert model.active_hooks() == []


def test_the_page_waits_for_the_warm_up_imports_it_shares():
    """plotly reads pandas from sys.modules without importing it: the page must not draw while the
    warm-up thread is half-way through importing pandas (seen as an AttributeError in the page)."""
    import sys

    from headlens.app import SHARED_IMPORTS
    from headlens.cli.dashboard import import_shared

    assert SHARED_IMPORTS.is_set()  # no warm-up: the page never waits
    SHARED_IMPORTS.clear()
    try:
        import_shared()
        assert SHARED_IMPORTS.is_set()
        assert hasattr(sys.modules["pandas"], "Series") and "plotly.graph_objects" in sys.modules
    finally:
        SHARED_IMPORTS.set()
    src = cache.app_script().read_text()
    main = src[src.index("def main"):]
    assert main.index("SHARED_IMPORTS.wait(") < main.index("with SHARED_IMPORT_LOCK:") < main.index("grid_layout(")


def test_the_warm_up_imports_nothing_while_a_page_draws_without_pandas():
    """A page that draws a kept grid (no pandas) holds SHARED_IMPORT_LOCK: the warm-up's imports wait for it."""
    import threading

    from headlens.app import SHARED_IMPORT_LOCK, SHARED_IMPORTS
    from headlens.cli.dashboard import import_shared

    SHARED_IMPORTS.clear()
    try:
        with SHARED_IMPORT_LOCK:  # a page drawing
            warm_up = threading.Thread(target=import_shared)
            warm_up.start()
            warm_up.join(0.5)
            assert warm_up.is_alive() and not SHARED_IMPORTS.is_set()
        warm_up.join(30)
        assert not warm_up.is_alive() and SHARED_IMPORTS.is_set()
    finally:
        SHARED_IMPORTS.set()


def test_cli_starts_the_server_before_torch_is_imported():
    """Importing torch (1-2 s) before ``streamlit run`` held the server's start back by that much: on
    the CPU the command checks --dtype/--device by name and leaves torch to the warm-up thread."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:  # a free port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    probe = (
        "import sys\n"
        "from streamlit.web import cli\n"
        "import os\n"
        "from headlens.app import DEVICE_ENV, DTYPE_ENV\n"
        "cli.main = lambda **kw: print(os.environ[DTYPE_ENV], os.environ[DEVICE_ENV], 'torch' in sys.modules)\n"
        "from headlens.cli import app\n"
        f"app(['dashboard', '--no-warm', '--port', '{port}', '--dtype', 'bf16', '--device', ' CPU'], "
        "standalone_mode=False)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # the page's sidebar starts from the canonical names; torch is not imported yet
    assert out.stdout.strip().splitlines()[-1] == "bfloat16 cpu False"


def test_dtype_names_are_checked_without_torch():
    from headlens.errors import ConfigError
    from headlens.models.placement import dtype_name

    assert dtype_name("bf16") == "bfloat16" and dtype_name(" Float32 ") == "float32"
    with pytest.raises(ConfigError, match="unknown dtype 'int8'"):
        dtype_name("int8")


def test_ablation_control_falls_back_to_heads_anywhere_when_the_selection_fills_its_layer():
    torch.set_num_threads(1)
    model = make_gpt(0, n_ctx=32)
    some = hd.run_ablation(model, ["L1H0", "L1H1"], "zero", "repeated_loss", "abc abc", n_prompts=4)
    whole = hd.run_ablation(model, [f"L1H{h}" for h in range(model.n_heads)], "zero", "repeated_loss", "abc abc",
                            n_prompts=4)
    assert some["control"] == "layer" and whole["control"] == "model"
    assert np.isfinite(some["sweep"]["control_delta"]) and np.isfinite(whole["sweep"]["control_delta"])


def test_smollm2_and_gguf_files_are_offered_and_checked_before_serving(tmp_path):
    from headlens.app import picker
    from headlens.errors import ModelReferenceError
    from headlens.models.loading import check_reference as _check_reference

    choices = hd.model_choices()
    assert ("smollm2" in choices) == picker.smollm2_installed() and choices[-1] == hd.CUSTOM_CHOICE
    if picker.smollm2_installed():
        _check_reference("smollm2")
        assert hd.fingerprint("smollm2").split(":")[0].endswith(".gguf")  # the file's path, size and mtime
    with pytest.raises(ModelReferenceError, match="no such GGUF file"):
        _check_reference(f"gguf:{tmp_path / 'missing.gguf'}")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    _check_reference(f"gguf:{gguf}")
    before = hd.fingerprint(f"gguf:{gguf}")
    gguf.write_bytes(b"GGUF and more")
    assert hd.fingerprint(f"gguf:{gguf}") != before  # another file: another cache entry
