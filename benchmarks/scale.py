"""The cost curve: GGUF files of one family (Llama) from 135M to ~3B parameters, converted, loaded and
classified, in float32 and bfloat16.

The files are written here, one tensor at a time, with **random weights** (Q8_0, normal(0, 0.02)) and a
synthetic byte-level vocabulary: right for memory and time, meaningless for heads. Shapes are real ones
(SmolLM2-135M, SmolLM2-360M, Llama-3.2-1B, Llama-3.2-3B: 49k and 128k vocabularies). Per size and dtype,
each stage in a fresh process (its peak RSS from ``wait4``):

1. **convert**: ``headlens.load`` of the file into an empty cache (hash, dequantize one tensor at a time,
   write, boot): wall seconds and peak RSS against the bound "the model in that dtype + 1 GB + 2x its
   largest tensor" (the memory check's bound);
2. **load**: the second ``headlens.load`` (from the cache): wall seconds;
3. **classify** (behaviour detectors, a small probe: see ``--n-prompts``/``--seq-len``): wall seconds
   against plain transformers forwards over the very same batches (recorded, replayed through
   ``AutoModelForCausalLM`` on the cached weights), and its peak RSS against weights + one batch's
   activations (:func:`headlens.models.memory.needed`).

Run: ``flock /tmp/heavy.lock python benchmarks/scale.py [--sizes 135M,360M,1B,3B] [--dtypes float32,bfloat16]
[--json out.json] [--svg docs/scale.svg]``. A size whose float32 weights do not fit in 70 % of MemAvailable
is skipped in that dtype (and said). Nothing asserts on time; a shared machine inflates every time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# name -> (d_model, n_layers, n_heads, n_kv_heads, d_mlp, d_vocab, tied)
SHAPES = {
    "tiny": (64, 2, 4, 2, 128, 70000, True),  # a smoke test of the script itself (pairs and triples)
    "135M": (576, 30, 9, 3, 1536, 49152, True),  # SmolLM2-135M
    "360M": (960, 32, 15, 5, 2560, 49152, True),  # SmolLM2-360M
    "1B": (2048, 16, 32, 8, 8192, 128256, True),  # Llama-3.2-1B
    "3B": (3072, 28, 24, 8, 8192, 128256, True),  # Llama-3.2-3B
}


def n_params(shape: tuple) -> int:
    d, n_layers, h, kv, mlp, vocab, tied = shape
    d_head = d // h
    per_layer = d * d_head * (2 * h + 2 * kv) + 3 * d * mlp + 2 * d
    return n_layers * per_layer + vocab * d * (1 if tied else 2) + d


def vocabulary(n: int) -> tuple[list[str], list[str]]:
    """``n`` byte-level BPE tokens (the 256 bytes, then pairs, then triples) and the merges that make them."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    tokens, merges = [*alphabet, "<|endoftext|>"], []
    pairs = ((a, b) for a in alphabet for b in alphabet)
    triples = ((a + b, c) for a in alphabet for b in alphabet for c in alphabet)  # 16M: enough for any vocabulary
    for left, right in itertools.chain(pairs, triples):
        if len(tokens) >= n:
            break
        tokens.append(left + right)
        merges.append(f"{left} {right}")
    return tokens[:n], merges


def write_llama(path: Path, shape: tuple, seed: int = 0) -> Path:
    """A Llama GGUF of ``shape`` with random Q8_0 weights, written a tensor at a time (bounded memory)."""
    import gguf
    import numpy as np

    d, n_layers, h, kv, mlp, vocab, tied = shape
    d_head = d // h
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"random-llama-{path.stem}")
    for key, value in {"context_length": 2048, "embedding_length": d, "block_count": n_layers,
                       "feed_forward_length": mlp, "attention.head_count": h, "attention.head_count_kv": kv,
                       "rope.dimension_count": d_head, "vocab_size": vocab}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
    tokens, merges = vocabulary(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL)
                       for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(256)
    w.add_eos_token_id(256)
    w.add_add_bos_token(False)
    specs = [("token_embd.weight", (vocab, d)), ("output_norm.weight", (d,))]
    specs += [] if tied else [("output.weight", (vocab, d))]
    for i in range(n_layers):
        specs += [(f"blk.{i}.attn_norm.weight", (d,)), (f"blk.{i}.attn_q.weight", (h * d_head, d)),
                  (f"blk.{i}.attn_k.weight", (kv * d_head, d)), (f"blk.{i}.attn_v.weight", (kv * d_head, d)),
                  (f"blk.{i}.attn_output.weight", (d, h * d_head)), (f"blk.{i}.ffn_norm.weight", (d,)),
                  (f"blk.{i}.ffn_gate.weight", (mlp, d)), (f"blk.{i}.ffn_up.weight", (mlp, d)),
                  (f"blk.{i}.ffn_down.weight", (d, mlp))]

    def tensor(shape_: tuple) -> tuple[Any, Any]:
        if len(shape_) == 1:
            return np.ones(shape_, dtype=np.float32), None
        x = (rng.standard_normal(shape_, dtype=np.float32) * 0.02)
        return gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0

    for name, shape_ in specs:  # the table first (shapes and byte sizes), the data after
        q8 = len(shape_) == 2
        nbytes = shape_[0] * shape_[1] // 32 * 34 if q8 else 4 * shape_[0]
        stored = (shape_[0], shape_[1] // 32 * 34) if q8 else shape_  # a quantized tensor's shape is in bytes
        w.add_tensor_info(name, stored, np.dtype(np.uint8 if q8 else np.float32), nbytes,
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0 if q8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, shape_ in specs:
        w.write_tensor_data(tensor(shape_)[0])
    w.close()
    return path


STAGE = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(int(sys.argv[4]))
import headlens
t0 = time.perf_counter()
model = headlens.load("gguf:" + sys.argv[1], dtype=sys.argv[2])
out = {"load_s": time.perf_counter() - t0}
if sys.argv[3] == "classify":
    sys.path.insert(0, sys.argv[5])
    from benchmarks.real_models import Recorder
    n, T = int(sys.argv[6]), int(sys.argv[7])
    with Recorder() as rec:
        t0 = time.perf_counter()
        headlens.classify(model, detectors="previous_token,induction,first_token", n_prompts=n, seq_len=T,
                          batch_size=n, n_boot=50)
        out["classify_s"] = time.perf_counter() - t0
    out["classify_peak"] = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
    folder = model.source["cache"]
    del model
    import gc; gc.collect()
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, sys.argv[2])).eval()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for tokens, mask in rec.batches:
            hf(tokens, attention_mask=mask)
    out["forwards_s"] = time.perf_counter() - t0
    out["n_batches"], out["n_tokens"] = len(rec.batches), sum(t.numel() for t, _ in rec.batches)
print(json.dumps(out))
"""


def measured(path: Path, dtype: str, what: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """``stage`` under a wrapper that reports the child's own peak RSS."""
    wrapper = ("import json, resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, "
               "text=True); print(r.stderr[-3000:], file=sys.stderr); "
               "print(json.dumps({'out': r.stdout, 'rc': r.returncode, "
               "'peak': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))")
    cmd = [sys.executable, "-c", wrapper, sys.executable, "-c", STAGE, str(path), dtype, what, str(args.threads),
           str(ROOT), str(args.n_prompts), str(args.seq_len)]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if got["rc"]:
        raise SystemExit(f"{what} {path.name} {dtype} failed:\n{run.stderr[-3000:]}")
    return {**json.loads(got["out"].strip().splitlines()[-1]), "peak": got["peak"], "wall_s": wall}


def mem_available() -> int:
    text = Path("/proc/meminfo").read_text()
    return int(next(line for line in text.splitlines() if line.startswith("MemAvailable")).split()[1]) * 1024


def one_size(name: str, dtype: str, args: argparse.Namespace, work: Path) -> dict[str, Any] | None:
    from headlens.models.memory import ModelShape, needed

    shape = SHAPES[name]
    params = n_params(shape)
    size = params * (4 if dtype == "float32" else 2)
    if size > 0.7 * mem_available():
        print(f"{name} {dtype}: skipped, {size / 1e9:.1f} GB of weights against {mem_available() / 1e9:.1f} GB "
              f"available", flush=True)
        return None
    path = work / f"llama-{name}.gguf"
    if not path.is_file():
        t0 = time.perf_counter()
        write_llama(path, shape)
        print(f"{name}: wrote {path.stat().st_size / 1e9:.2f} GB of random Q8_0 in {time.perf_counter() - t0:.0f} s",
              flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads),
           "HEADLENS_CACHE": str(work / f"cache-{name}-{dtype}"), "HEADLENS_MEMORY_LIMIT": "1TB"}
    first = measured(path, dtype, "load", args, env)
    second = measured(path, dtype, "classify", args, env)
    d, *_, vocab, _ = shape
    largest = vocab * d * (4 if dtype == "float32" else 2)
    weights, acts = needed(ModelShape(params, shape[2], vocab), dtype, args.n_prompts, args.seq_len)
    row = {"size": name, "params": params, "dtype": dtype, "weights": weights, "activations": acts,
           "convert_s": first["wall_s"], "convert_peak": first["peak"], "convert_bound": size + 1e9 + 2 * largest,
           "load_s": second["load_s"], "classify_s": second["classify_s"], "forwards_s": second["forwards_s"],
           "classify_peak": second["classify_peak"], "n_tokens": second["n_tokens"]}
    print(f"{name} ({params / 1e9:.2f}B) {dtype}: first load {row['convert_s']:.0f} s, peak "
          f"{row['convert_peak'] / 1e9:.2f} GB (bound {row['convert_bound'] / 1e9:.2f}); load {row['load_s']:.1f} s; "
          f"classify {row['classify_s']:.1f} s vs plain forwards {row['forwards_s']:.1f} s "
          f"({row['classify_s'] / row['forwards_s']:.2f}x, {row['n_tokens']} tokens); classify peak "
          f"{row['classify_peak'] / 1e9:.2f} GB = {row['classify_peak'] / (weights + acts):.2f}x weights+batch "
          f"({(weights + acts) / 1e9:.2f} GB)", flush=True)
    import shutil

    shutil.rmtree(work / f"cache-{name}-{dtype}", ignore_errors=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="135M,360M,1B,3B")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-prompts", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=48)
    parser.add_argument("--work", type=Path, default=None, help="where the GGUF files go (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--svg", type=Path, default=None, help="draw the curve (benchmarks/scale_plot.py)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, MemAvailable {mem_available() / 1e9:.1f} GB, {args.threads} "
          f"threads (a shared machine inflates every time)", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="headlens-scale-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.sizes.split(","):
            for dtype in args.dtypes.split(","):
                if (row := one_size(name, dtype, args, work)) is not None:
                    rows.append(row)
                    if args.json:
                        args.json.write_text(json.dumps(rows, indent=1))
            (work / f"llama-{name}.gguf").unlink(missing_ok=True)
    from benchmarks.scale_plot import draw, markdown

    print(markdown(rows))
    if args.svg:
        args.svg.write_text(draw(rows))


if __name__ == "__main__":
    main()
