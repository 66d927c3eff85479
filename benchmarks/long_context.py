"""Long-context head scores: dense pattern vs the sparse LSE scan, memory and time against T.

    python benchmarks/long_context.py                      # 1k .. 32k, memory + time, figure
    python benchmarks/long_context.py --lengths 1024 8192  # a subset
    python benchmarks/long_context.py --figure docs/long_context.png
    python benchmarks/long_context.py --family llama --lengths 1024 8192 --paths sparse-unfused sparse
    python benchmarks/long_context.py --family gpt2 --lengths 1024 8192  # also mistral, bert, gemma2
    python benchmarks/long_context.py --paths sparse --detectors all --lengths 1024 8192 --code . /work/main
    python benchmarks/long_context.py --paths sparse --detectors previous_token --lengths 32768

The run: a random 4-layer x 8-head, d_model 256 native GPT (byte-level; n_ctx 8,192 up to 8k
tokens, 32,768 beyond), ``headlens.classify(model, corpus="stdlib", batch_size=1, n_prompts=2,
detectors=[previous_token, first_token, duplicate_token, induction], seq_len=T, scan_path=P)``,
which is ``headlens classify --corpus stdlib --batch-size 1 --n-prompts 2 --seq-len T --scan-path P``.

(a) memory: each (T, path) in a fresh subprocess; peak RSS (``ru_maxrss``) of the whole process,
    import and model included. The longest sparse run also runs under a 6 GB address-space limit
    (``RLIMIT_AS``), as the issue asks. Dense is skipped where its pattern cannot fit.
(b) time: per T, one subprocess runs dense and sparse alternately (``--repeats`` each up to 2k
    tokens, once beyond; median), so both see the same machine load; the ratio sparse / dense is
    what to read. Where dense cannot run, the time is the sparse memory run's.
(c) agreement: the largest |score_sparse - score_dense| over every head and detector.

``--family llama|mistral|gpt2|bert|gemma2`` measures a Hugging Face model through the bridge instead: a
random 2-layer, d_model 64, 4-head model (Llama with 2 KV heads; Mistral, the same with a 512-token window;
GPT-2; BERT; Gemma-2 with logit soft-capping and a 512-token window on every other layer), n_ctx 8,192,
written without a tokenizer to a temporary directory, scored on the generated probes (``corpus=None``).
Its memory paths: ``sparse`` (the fused
attention of ``headlens.models.hf.fused``), ``sparse-unfused`` (the bridge's own attention, which builds
the pattern: the sparse scan before fusing) and ``dense``; ``--paths`` picks them (memory only).

``--detectors`` picks what is scored: ``four`` (the list above, the default), ``all`` (every default
detector of ``classify``: position, token, bracket, sink and streaming heads, copying) or names.
``--code DIR ...`` runs the same workers against other source trees (``PYTHONPATH=DIR``; e.g. this
checkout and main's, to compare two versions of the scan on one machine at one time), alternately,
``--repeats`` times in memory-only mode. ``--timeout-s`` stops a worker that runs too long and
reports the last progress line it printed (prompts done, elapsed time, peak RSS so far).

Nothing is asserted; a table is printed and, with ``--figure``, a two-panel plot is written
(``.html``, or ``.png`` through the headless Chromium the dashboard screenshots use).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

DETECTORS: list[str] | None = ["previous_token", "first_token", "duplicate_token", "induction"]  # --detectors
FAMILY = "gpt"  # --family
N_PROMPTS = 2  # --n-prompts
DENSE_MAX = 8192  # dense needs 4 * 8 heads * T^2 bytes per layer pattern and more: 16k is > 8 GB


def build_model(T: int):
    import torch

    import headlens

    torch.manual_seed(0)
    n_ctx = 8192 if T <= 8192 else max(32768, T)
    cfg = headlens.ModelConfig(n_layers=4, n_heads=8, d_model=256, n_ctx=n_ctx, d_vocab=257)
    return headlens.GPT(cfg, name=f"random-4x8-d256-ctx{n_ctx}").eval()


HF_FAMILIES = ("llama", "mistral", "gpt2", "bert", "gemma2")  # --family: bridged HF models, 2 layers, d_model 64, 4 heads


def build_hf(family: str, T: int):
    """A random 2-layer, d_model 64, 4-head HF ``family`` model through the bridge (no tokenizer)."""
    import tempfile

    import torch
    import transformers

    from headlens.models.hf.boot import load_bridge

    torch.manual_seed(0)
    n = max(8192, T)
    ids = dict(vocab_size=257, bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    llama = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=n, **ids)
    cls, cfg = {  # Llama: RoPE + GQA (Mistral: + a 512-token window); GPT-2: learned positions, fused qkv;
        # BERT: bidirectional;
        # Gemma-2: logit soft-capping and a 512-token sliding window on every other layer (our blocked attention)
        "llama": lambda: (transformers.LlamaForCausalLM, transformers.LlamaConfig(**llama)),
        "mistral": lambda: (transformers.MistralForCausalLM, transformers.MistralConfig(**llama, sliding_window=512)),
        "gpt2": lambda: (transformers.GPT2LMHeadModel,
                         transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=n, **ids)),
        "bert": lambda: (transformers.BertForMaskedLM,
                         transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=128, max_position_embeddings=n, **ids)),
        "gemma2": lambda: (transformers.Gemma2ForCausalLM,
                           transformers.Gemma2Config(**llama, head_dim=16, sliding_window=512,
                                                     attn_logit_softcapping=50.0)),
    }[family]()
    path = Path(tempfile.mkdtemp(prefix=f"headlens-{family}-"))
    cls(cfg).eval().save_pretrained(path)
    return load_bridge(str(path))


def classify(model, T: int, path: str):
    import headlens

    if path == "sparse-unfused":  # the bridge's own attention (pattern and all), as before fusing
        model.fused_attention = None
        path = "sparse"
    corpus = None if FAMILY in HF_FAMILIES else "stdlib"
    t0 = time.perf_counter()

    def progress(done: int, total: int, what: str) -> None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"progress: {what} {done}/{total} prompts, {time.perf_counter() - t0:.0f} s, peak RSS {rss:.0f} MiB",
              file=sys.stderr, flush=True)

    return headlens.classify(model, detectors=DETECTORS, corpus=corpus, batch_size=1, n_prompts=N_PROMPTS,
                             seq_len=T, scan_path=path, n_boot=100, progress=progress)


def worker(T: int, paths: list[str], repeats: int) -> dict:
    """Runs inside the subprocess: classify once per path (memory) or alternately (time)."""
    import torch

    torch.set_num_threads(1)
    model = build_hf(FAMILY, T) if FAMILY in HF_FAMILIES else build_model(T)
    times: dict[str, list[float]] = {p: [] for p in paths}
    scores = {}
    for _ in range(repeats):
        for p in paths:
            t0 = time.perf_counter()
            df = classify(model, T, p)
            times[p].append(time.perf_counter() - t0)
            scores[p] = df.sort_values(["detector", "layer", "head"]).score.tolist()
            assert df.attrs["scan_path"] == p.removesuffix("-unfused"), df.attrs["scan_path"]
    diff = None
    if len(paths) == 2:
        diff = max(abs(a - b) for a, b in zip(scores[paths[0]], scores[paths[1]], strict=True))
    return {"T": T, "paths": paths, "time_s": {p: statistics.median(v) for p, v in times.items()},
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "max_abs_diff": diff}


def run_worker(T: int, paths: list[str], repeats: int, as_limit_gb: float | None = None, code: str | None = None,
               timeout_s: float | None = None) -> dict:
    def limit() -> None:
        if as_limit_gb:
            cap = int(as_limit_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    cmd = [sys.executable, __file__, "--worker", str(T), "--paths", *paths, "--repeats", str(repeats),
           "--family", FAMILY, "--n-prompts", str(N_PROMPTS),
           "--detectors", "all" if DETECTORS is None else ",".join(DETECTORS)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if code is not None:  # import headlens from that source tree
        env["PYTHONPATH"] = str(Path(code).resolve())
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        err_text = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
        done = [x for x in err_text.splitlines() if x.startswith("progress:")] or ["progress: none"]
        return {"T": T, "paths": paths, "error": f"stopped after {timeout_s:.0f} s; last {done[-1]}",
                "wall_s": time.perf_counter() - t0}
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines() or ["?"]
        done = [x for x in lines if x.startswith("progress:")]
        return {"T": T, "paths": paths, "error": lines[-1] + (f" (last {done[-1]})" if done else ""),
                "wall_s": time.perf_counter() - t0}
    return json.loads(out.stdout.strip().splitlines()[-1])


def figure(rows: list[dict], path: Path) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("peak memory (RSS, MiB)", "classify time (s)"))
    for name, color in (("dense", "#d62728"), ("sparse", "#1f77b4")):
        mem = [(r["T"], r["mem"][name]) for r in rows if r["mem"].get(name)]
        tim = [(r["T"], r["time"][name]) for r in rows if r["time"].get(name)]
        for col, pts in ((1, mem), (2, tim)):
            if pts:
                fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                         name=name, line={"color": color}, showlegend=col == 1), row=1, col=col)
    fig.update_xaxes(type="log", title_text="tokens per prompt (T)", tickvals=[r["T"] for r in rows])
    fig.update_yaxes(type="log")
    fig.update_layout(width=1000, height=420, template="plotly_white", margin={"t": 60},
                      title="headlens classify, random 4x8 d256 GPT, stdlib, 2 prompts: dense pattern vs sparse LSE scan")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".html":
        fig.write_html(str(path), include_plotlyjs=True)
        return
    html = path.with_suffix(".tmp.html")
    fig.write_html(str(html), include_plotlyjs=True)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1020, "height": 440})
        page.goto(html.resolve().as_uri())
        page.wait_for_timeout(1500)
        page.screenshot(path=str(path))
        browser.close()
    html.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--repeats", type=int, default=3, help="timing repeats per path (median)")
    ap.add_argument("--as-limit-gb", type=float, default=6.0, help="address-space cap for the longest sparse run")
    ap.add_argument("--figure", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the measurements here")
    ap.add_argument("--figure-only", action="store_true", help="redraw the figure from --json, measure nothing")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--paths", nargs="+", default=None, help="memory only, these paths (HF families: sparse-unfused sparse)")
    ap.add_argument("--family", choices=["gpt", *HF_FAMILIES], default="gpt", help="native GPT or a bridged HF model")
    ap.add_argument("--detectors", default="four", help="four (the default list), all (classify's defaults) or names")
    ap.add_argument("--n-prompts", type=int, default=2)
    ap.add_argument("--code", nargs="+", default=None, help="source trees to import headlens from (memory-only mode)")
    ap.add_argument("--timeout-s", type=float, default=None, help="stop a worker after this long (memory-only mode)")
    args = ap.parse_args()
    global FAMILY, DETECTORS, N_PROMPTS
    FAMILY, N_PROMPTS = args.family, args.n_prompts
    if args.detectors != "four":
        DETECTORS = None if args.detectors == "all" else args.detectors.split(",")
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.paths, args.repeats)))
        return
    if args.family in HF_FAMILIES or args.paths:  # memory only, one fresh process per (T, path, code, repeat)
        print(f"load average at start: {os.getloadavg()[0]:.1f}; detectors {args.detectors}; 1 thread per run", flush=True)
        codes = args.code or [None]
        for T in args.lengths:
            for p in args.paths or ["sparse-unfused", "sparse"]:
                times: dict[str | None, list[float]] = {c: [] for c in codes}
                for _ in range(args.repeats if args.code else 1):
                    for c in codes:
                        r = run_worker(T, [p], 1, code=c, timeout_s=args.timeout_s)
                        if "error" not in r:
                            times[c].append(r["time_s"][p])
                        print(f"{args.family} T={T:>6} {p:>14}{'' if c is None else ' ' + c}: " + (r.get("error") or
                              f"peak RSS {r['maxrss_mib']:.0f} MiB, {r['time_s'][p]:.1f} s"), flush=True)
                if args.code and args.repeats > 1:
                    print("  median time: " + ", ".join(f"{c} {statistics.median(v):.1f} s" for c, v in times.items()
                                                        if v), flush=True)
        print(f"load average at end: {os.getloadavg()[0]:.1f}", flush=True)
        return
    if args.figure_only:
        figure(json.loads(args.json.read_text()), args.figure)
        return
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; 1 thread per run", flush=True)
    rows = []
    for T in args.lengths:
        dense_ok = T <= DENSE_MAX
        row = {"T": T, "mem": {}, "time": {}, "diff": None, "errors": {}}
        for p in (["dense"] if dense_ok else []) + ["sparse"]:
            cap = args.as_limit_gb if (p == "sparse" and T == max(args.lengths)) else None
            r = run_worker(T, [p], 1, cap)
            if "error" in r:
                row["errors"][p] = r["error"]
            else:
                row["mem"][p] = r["maxrss_mib"]
                row["time"][p] = r["time_s"][p]  # replaced by the side-by-side timing below when dense runs
                if cap:
                    row["as_limit_gb"] = cap
        if dense_ok:
            r = run_worker(T, ["dense", "sparse"], args.repeats if T <= 2048 else 1)
            if "error" in r:
                row["errors"]["time"] = r["error"]
            else:
                row["time"], row["diff"] = r["time_s"], r["max_abs_diff"]
        row["load"] = os.getloadavg()[0]
        rows.append(row)
        _print_row(row, rows[0])
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    if args.json:  # merge with earlier runs (other lengths) so one figure can show them all
        old = json.loads(args.json.read_text()) if args.json.exists() else []
        merged = {r["T"]: r for r in old} | {r["T"]: r for r in rows}
        rows = [merged[T] for T in sorted(merged)]
        args.json.write_text(json.dumps(rows, indent=1))
    if args.figure:
        figure(rows, args.figure)
        print(f"wrote {args.figure}")


def _print_row(row: dict, first: dict) -> None:
    def f(x: float | None, fmt: str) -> str:
        return format(x, fmt) if x is not None else "-"

    m, t = row["mem"], row["time"]
    cap_note = " (under RLIMIT_AS {:.0f} GB)".format(row["as_limit_gb"]) if row.get("as_limit_gb") else ""
    ratio_mem = {p: m[p] / first["mem"][p] for p in m if first["mem"].get(p)}
    print(f"T={row['T']:>6}  peak MiB dense {f(m.get('dense'), '8.0f')} sparse {f(m.get('sparse'), '7.0f')}"
          f"{cap_note}"
          f"  vs T0: dense {f(ratio_mem.get('dense'), '5.2f')}x sparse {f(ratio_mem.get('sparse'), '5.2f')}x"
          f"  |  time s dense {f(t.get('dense'), '7.2f')} sparse {f(t.get('sparse'), '7.2f')}"
          f"  sparse/dense {f(t['sparse'] / t['dense'] if t.get('dense') else None, '5.2f')}"
          f"  max|diff| {f(row['diff'], '.1e')}  {row['errors'] or ''}", flush=True)


if __name__ == "__main__":
    main()
