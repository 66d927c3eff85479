"""Re-create tests/data/doctor/<family>/: tiny byte-level causal LMs of several Hugging Face families, briefly
trained, and tests/data/doctor/copier/: a tiny Llama that copies.

The doctor's head-count inference needs weights that were *trained* with a head layout (random
weights have none to find). Each model here is trained for a few hundred steps on windows of the
Python standard library's source (the ``code`` recipe's data), where bigram statistics and
previous-token attention form within a few hundred steps, and saved as a Hugging Face directory
(config.json, float16 model.safetensors, the byte-level tokenizer ``headlens export-hf`` writes).
The periodic-repeat data of ``induction-2l`` was tried first: on random symbols nothing but the
induction circuit lowers the loss, and it had not formed after 300 steps (loss still log 63), so those
weights carried no head layout to find. ``copier`` is the small-vocabulary case of the doctor's copying evidence: a 2-layer GQA Llama (4 query /
2 key-value heads of width 16) over the 63-symbol alphabet of ``induction-2l`` plus BOS (64 token ids),
trained by headlens' own training code (``headlens.training``, the ``llama-induction`` recipe's data:
random symbols in which a segment repeats at a random period 5..25 from a random start) until it copies
the repeats (3,000 steps: loss on the copies 0.14 nats at periods 7 and 15, 1.15 at 31, beyond its training
periods; log 63 = 4.14 without copying). Its context is 512 (its rows were 64 tokens): the doctor's rows are
as long as a user's model's context allows. Its config.json's ``headlens`` entry records the run.

Run from the repository root:

    python tests/data/make_doctor_models.py [family ...]   # all by default; ~1-2 min each on 1 core, copier ~4

Deterministic for a given torch version (seeded data and init, one thread).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

BOS = 256  # byte ids 0..255, BOS 256 (headlens' byte-level tokenizer)
SEQ_LEN = 63  # + BOS = 64 = max_position_embeddings
OUT = Path(__file__).parent / "doctor"
ROOT = Path(__file__).resolve().parents[2]
COMMON = dict(vocab_size=BOS + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              max_position_embeddings=SEQ_LEN + 1, bos_token_id=BOS, eos_token_id=BOS, pad_token_id=BOS,
              tie_word_embeddings=False)


def configs() -> dict[str, object]:
    """family -> config of the true layout (what the doctor must recover)."""
    from transformers import GemmaConfig, GPTNeoXConfig, LlamaConfig, MistralConfig, Qwen2Config

    return {
        "llama": LlamaConfig(**COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
        "qwen2": Qwen2Config(**COMMON, num_attention_heads=4, num_key_value_heads=2),
        "mistral": MistralConfig(**COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 sliding_window=32),
        "gemma": GemmaConfig(**COMMON, num_attention_heads=4, num_key_value_heads=1, head_dim=32),
        "gpt_neox": GPTNeoXConfig(**{**COMMON, "tie_word_embeddings": False}, num_attention_heads=4,
                                  rotary_pct=0.5),
    }


def batch(gen: torch.Generator, n: int) -> torch.Tensor:
    from headlens.probes.data import stdlib_corpus, window_batch

    return window_batch(gen, stdlib_corpus(4_000_000).train, n, SEQ_LEN, BOS)  # (n, 64)


def heldout_loss(model) -> float:
    """Mean next-byte loss on held-out stdlib windows."""
    from headlens.probes.data import stdlib_corpus, window_batch

    x = window_batch(torch.Generator().manual_seed(1), stdlib_corpus(4_000_000).heldout, 64, SEQ_LEN, BOS)
    with torch.no_grad():
        return float(F.cross_entropy(model(x[:, :-1]).logits.flatten(0, 1), x[:, 1:].flatten()))


def train(family: str, cfg, steps: int = 400, seed: int = 0, log_every: int = 100) -> None:
    from gqa_models import save_tokenizer
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    for step in range(steps):
        x = batch(gen, 32)
        loss = F.cross_entropy(model(x[:, :-1]).logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log_every and (step + 1) % log_every == 0:
            held = heldout_loss(model.eval())
            model.train()
            print(f"  {family} step {step + 1}: loss {loss.item():.3f}, held-out {held:.3f}", flush=True)
    model.eval()
    out = OUT / family
    model.to(torch.float16).save_pretrained(str(out))
    save_tokenizer(out, SEQ_LEN + 1)
    print(f"{family}: {steps} steps, train loss {loss.item():.3f}, held-out loss {heldout_loss(model.float()):.3f}, "
          f"{time.time() - t0:.0f} s -> {out}")


COPIER_STEPS = 3000


def copier_recipe():
    """The ``llama-induction`` recipe on a 64-token vocabulary (63 symbols + BOS), 64-token rows. Its context
    (max_position_embeddings) is 512, as a user's model's would be: the doctor's rows are then up to 512
    tokens, and its random segments of old (255 tokens over 63 ids) could not be copied unambiguously."""
    from dataclasses import replace

    from headlens.models.tokenizer import Tokenizer
    from headlens.probes.data import INDUCTION_ALPHABET
    from headlens.training.llama import LlamaSpec
    from headlens.training.recipes import get_recipe

    tok = Tokenizer.char_level(INDUCTION_ALPHABET)
    spec = LlamaSpec(n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, n_ctx=512, d_vocab=tok.d_vocab)
    return replace(get_recipe("llama-induction"), config=spec, tokenizer=tok, seq_len=63, steps=COPIER_STEPS,
                   snapshots=0)


def copy_loss(model_dir: Path, period: int) -> float:
    """Mean loss on the copies (every token after the first period) of rows ``BOS s s s ...``, ``s`` a
    segment of ``period`` distinct symbols: 0 when the model copies perfectly, log 63 when it cannot."""
    from transformers import AutoModelForCausalLM

    from headlens.doctor.sources import periodic_rows

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).float().eval()
    rows = periodic_rows(torch.arange(63), 32, 64, period, bos=63, seed=1)  # (32, 64)
    with torch.no_grad():
        ce = F.cross_entropy(model(rows[:, :-1]).logits.transpose(1, 2), rows[:, 1:], reduction="none")  # (32, 63)
    return float(ce[:, period:].mean())


def train_copier(steps: int = COPIER_STEPS) -> None:
    import shutil
    import tempfile

    from safetensors.torch import load_file, save_file

    from headlens.training.train import train as train_recipe

    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        result = train_recipe(copier_recipe(), tmp, steps=steps, snapshots=0)
        out = OUT / "copier"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(result.checkpoint, out)
    weights = out / "model.safetensors"
    save_file({k: v.half() for k, v in load_file(str(weights)).items()}, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    config = json.loads((out / "config.json").read_text())
    config["headlens"]["name"] = "doctor-copier"  # trained on the llama-induction recipe's data (its metadata)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    copies = ", ".join(f"period {p}: {copy_loss(out, p):.3f}" for p in (7, 15, 31))
    print(f"copier: {steps} steps, train loss {result.final_loss:.3f}, loss on the copies {copies} nats, "
          f"{time.time() - t0:.0f} s -> {out}")


def main() -> None:
    torch.set_num_threads(1)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    wanted = sys.argv[1:] or [*configs(), "copier"]
    for family, cfg in configs().items():
        if family in wanted:
            train(family, cfg)
    if "copier" in wanted:
        train_copier()


if __name__ == "__main__":
    main()
