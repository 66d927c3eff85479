"""What the Learn view computes on SmolLM2 per click, side by side with plain transformers doing the same work.

    python benchmarks/lesson_lm.py [--repeats 3] [--model smollm2] [--threads 2]

In one process, interleaved round by round (a noisy shared CPU hurts both sides alike), median of the rounds:

* text edit -> pattern: the dashboard's pattern of one head on 102 tokens of prose (``head_patterns``, the bridged
  model's ``run_with_cache``) against a plain ``transformers`` forward of the same tokens (goal: the whole edit ->
  pattern in the browser <= 1 s, which ``dashboard_first_paint.py --model smollm2`` measures);
* a greedy continuation of 8 tokens, clean (key/value cache) and with the missing transpose planted (the whole
  sequence at every step: the bug mixes positions), against ``transformers``' own ``generate`` (goal <= 2 s);
* the silent-bug step, the wrong-head-count step and the doctor's limited check, each whole (reported).

No assertions: timings are reported, not tested (tests/ never times anything).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prose import LM_EDIT


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the machine's cores)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import torch

    import headlens
    from headlens.app import helpers as hd
    from headlens.app import lesson_lm as L

    torch.set_num_threads(args.threads)
    model = headlens.load(args.model)
    folder = L.model_directory(model)
    plain, _ = L.build(folder)
    config, layouts = L.layouts(folder)
    wrong = next(lay for lay in layouts if lay.n_kv_heads == 1)
    ids = model.to_tokens(LM_EDIT).cpu()
    prompt = model.to_tokens(L.EIFFEL).cpu()
    head = (18, 6)
    print(f"{args.model}: {ids.shape[1]} tokens of prose, prompt {prompt.shape[1]} tokens, {args.threads} threads")

    def plain_forward() -> None:
        with torch.inference_mode():
            plain(ids)

    def generate() -> None:
        with torch.inference_mode():
            plain.generate(prompt, max_new_tokens=L.N_NEW, do_sample=False)

    def bugged() -> None:
        from headlens.doctor.hf_bugs import planted

        with planted(plain, "missing_transpose_split"):
            L.continue_prompt(plain, model, L.EIFFEL, kv_cache=False)

    work = {
        "pattern, 1 head (dashboard)": lambda: hd.head_patterns(model, LM_EDIT, [head]),
        "forward (plain transformers)": plain_forward,
        "continuation, clean (lesson)": lambda: L.continue_prompt(plain, model, L.EIFFEL),
        "continuation, missing transpose": bugged,
        "generate (plain transformers)": generate,
        "silent-bug step, whole": lambda: L.bug_step(plain, model, hd.LM_TEXT, L.EIFFEL, "missing_transpose_split", 17),
        "head-count step, 3 heads, whole": lambda: L.layout_row(folder, model, hd.LM_TEXT, L.EIFFEL, wrong, 17),
        "doctor, 2 layouts": lambda: L.doctor_check(folder, wrong.n_heads, config.n_heads),
    }
    for fn in work.values():  # warm-up: first calls allocate and compile kernels
        if fn is not work["doctor, 2 layouts"]:
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in work}
    for i in range(args.repeats):
        for name, fn in work.items():
            seconds[name].append(timed(fn))
        print(f"round {i + 1}: " + ", ".join(f"{n} {s[-1]:.2f} s" for n, s in seconds.items()), flush=True)
    med = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"\nmedian of {args.repeats} rounds:")
    for name, s in med.items():
        print(f"  {name:<34} {s:7.2f} s")
    print(f"pattern / plain forward: {med['pattern, 1 head (dashboard)'] / med['forward (plain transformers)']:.2f}x "
          f"(goal: edit -> pattern in the browser <= 1 s)")
    print(f"clean continuation / generate: {med['continuation, clean (lesson)'] / med['generate (plain transformers)']:.2f}x"
          f"; {med['continuation, clean (lesson)']:.2f} s (goal <= 2 s); with the bug "
          f"{med['continuation, missing transpose']:.2f} s")


if __name__ == "__main__":
    main()
