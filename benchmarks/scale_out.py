"""Scale-out cost, side by side: classify on 1 vs 2 torchrun ranks over the same prompts, and --resume.

    python benchmarks/scale_out.py                      # zoo 'code', 128 prompts/probe, seq 128
    python benchmarks/scale_out.py --n-prompts 256 --repeats 5

(a) ``headlens.classify`` under ``torchrun --standalone`` with 1 and 2 gloo ranks (one thread
    each, as torchrun sets), plus one process with 2 threads (the fair opponent on 2 cores):
    per rank the time to scan its block of batches, the time until the table is ready (rank 0:
    gather + statistics included), and the rank's peak RSS.
(b) ``--resume`` overhead in one process: no store; a store being filled (every batch
    hashed into a fingerprint and written as a shard); a rerun that finds every shard.

Each configuration runs ``--repeats`` times; medians are printed. Times exclude interpreter
start, imports and model loading (they are paid once per rank and show up in the launcher's
wall time, printed too). Nothing is asserted.

What to expect on a 2-core machine shared with other jobs: little. Two ranks each get one core
only if the machine is otherwise idle; under load they share the same two cores with everyone
else, each rank pays its own imports and model copy (memory grows ~linearly with ranks), and the
scan of a small model is a few hundred milliseconds, so a second of process start-up dwarfs it.
The numbers below say how much of the ideal 2x survives, not what a GPU node would get.

Measured 2026-11-30 15:37-15:48 UTC on the shared 2-core CPU (load average 18.7 from other jobs),
``python benchmarks/scale_out.py --repeats 3``: zoo 'code' (3 layers x 4 heads, d128), 128 prompts
per probe (3 probes), seq 128, batch 16; medians of 3:

  (a)                     scan s per rank   table ready s    peak RSS MiB per rank   launcher wall s
      1 rank x 1 thread         7.33         7.40 (1.00x)           349                  30.1
      2 ranks x 1 thread    4.18 / 4.25      4.34 (1.70x)        360 / 345               26.1
      1 rank x 2 threads       43.58        44.02 (0.17x)           343                  69.5
  (b) no store 5.49 s; filling a store 5.38 s (0.98x: hashing the weights and probes and writing 24
      shards is within the noise); every shard present 0.56 s (0.10x: only the statistics are left).

Reading: two single-thread ranks scanned their halves in parallel (1.70x), each with its own copy of
torch and the model (peak RSS per rank about the same as one process: the model is tiny, the memory is
torch itself); the launcher's wall time hardly moves, because start-up (imports, model load, warm-up
on every rank) is ~20 s of the ~30 s. One process with two threads was 6x slower than with one: on a
machine this oversubscribed, OpenMP's threads wait for each other at every barrier. Timings under this
load vary by +-30 % run to run (the same "1 rank x 1 thread" took 7.40 s in (a) and 5.49 s in (b)).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    """One rank: load, wait for every rank, classify, write this rank's timings to ``args.out``."""
    import torch

    torch.set_num_threads(args.threads)
    import headlens
    from headlens.scoring.distributed import current

    rank = current()
    model = headlens.load(args.model)
    kw = dict(n_prompts=args.n_prompts, seq_len=args.seq_len, batch_size=args.batch_size, n_boot=200)
    headlens.classify(model, **{**kw, "n_prompts": 4})  # warm-up: lazy imports, first collectives
    if rank.world_size > 1:
        import torch.distributed as dist

        dist.barrier()
    last = [0.0]
    t0 = time.perf_counter()
    headlens.classify(model, **kw, resume=args.resume, progress=lambda d, t, s: last.__setitem__(0, time.perf_counter()))
    t1 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    Path(args.out, f"rank{rank.rank}.json").write_text(json.dumps(
        {"rank": rank.rank, "scan_s": (last[0] or t1) - t0, "total_s": t1 - t0, "peak_rss_mib": rss}))


def launch(args: argparse.Namespace, world: int, threads: int, resume: str | None = None) -> dict:
    """Run one configuration in fresh processes; per-rank results and the launcher's wall time."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               __file__, "--worker", "--out", out, "--threads", str(threads), "--model", args.model,
               "--n-prompts", str(args.n_prompts), "--seq-len", str(args.seq_len),
               "--batch-size", str(args.batch_size)] + (["--resume", resume] if resume else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": str(threads)}
        if sys.platform == "linux":
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if res.returncode:
            raise SystemExit(f"{cmd} failed:\n{res.stderr[-2000:]}")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    return {"wall_s": wall, "ranks": ranks}


def median_runs(runs: list[dict]) -> dict:
    world = len(runs[0]["ranks"])
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return {"wall_s": med([r["wall_s"] for r in runs]),
            "ranks": [{k: med([r["ranks"][i][k] for r in runs]) for k in ("scan_s", "total_s", "peak_rss_mib")}
                      for i in range(world)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--resume", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="code")
    parser.add_argument("--n-prompts", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    print(f"model {args.model}, {args.n_prompts} prompts/probe, seq {args.seq_len}, batch {args.batch_size}, "
          f"{args.repeats} repeats, load average {os.getloadavg()[0]:.1f}")
    rows = {}
    for name, world, threads in [("1 rank x 1 thread", 1, 1), ("2 ranks x 1 thread", 2, 1),
                                 ("1 rank x 2 threads", 1, 2)]:
        rows[name] = median_runs([launch(args, world, threads) for _ in range(args.repeats)])
    print("\n(a) classify, medians            scan (s) per rank   table ready (s)   peak RSS (MiB) per rank   "
          "launcher wall (s)")
    base = rows["1 rank x 1 thread"]["ranks"][0]["total_s"]
    for name, r in rows.items():
        scans = " / ".join(f"{x['scan_s']:.2f}" for x in r["ranks"])
        rss = " / ".join(f"{x['peak_rss_mib']:.0f}" for x in r["ranks"])
        ready = r["ranks"][0]["total_s"]
        print(f"  {name:<22} {scans:>20} {ready:>11.2f} ({base / ready:.2f}x) {rss:>24} {r['wall_s']:>14.1f}")
    print("\n(b) --resume overhead, 1 rank x 1 thread, medians (table ready, s)")
    results = {}
    for label in ("no store", "filling a store", "every shard present"):
        times = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as store:
                if label == "every shard present":
                    launch(args, 1, 1, resume=store)  # fill it first
                r = launch(args, 1, 1, resume=None if label == "no store" else store)
                times.append(r["ranks"][0]["total_s"])
        results[label] = statistics.median(times)
    for label, t in results.items():
        print(f"  {label:<22} {t:.2f} s ({t / results['no store']:.2f}x)")


if __name__ == "__main__":
    main()
