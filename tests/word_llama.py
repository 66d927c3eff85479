"""A word-level-tokenizer GQA Llama for the doctor: tokens ``t0`` ... ``t63``, 4 query / 2 key-value heads of width 16.

Why this subject: its tokenizer turns Python source (the doctor's default text) into the unknown token
almost everywhere, so that text cannot tell head layouts apart; only evidence that fits the model can.

Training data (the doctor's model-agnostic source in the same format): ``<bos> r r``, a random sequence
``r`` of 31 words repeated once (64 tokens = the context). In about 100 steps (a few seconds on one
thread) the model learns to copy the second half from 31 tokens back: a query-key match at a fixed
relative offset through RoPE, which a wrong head split (other rotary pairs, other slices) breaks.

``write_word_llama(out, steps)`` writes the directory (``steps=0``: the untrained model of the same
shape); ``lie(out)`` edits its config to claim 2 / 1 heads of width 32 (loads without a shape error).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

N_WORDS, UNK, BOS, N_CTX = 64, 0, 1, 64
SEG = (N_CTX - 1) // 2  # words per copy
STEPS = 150
LIE = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}


def config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=N_WORDS + 2, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=N_CTX,
                       bos_token_id=BOS, eos_token_id=BOS, pad_token_id=UNK, tie_word_embeddings=False)


def repeated_rows(gen: torch.Generator, n: int) -> torch.Tensor:
    """``(n, 64)`` rows ``<bos> r r`` over the word ids 2 .. 65."""
    r = torch.randint(2, N_WORDS + 2, (n, SEG), generator=gen)  # (N, SEG)
    return torch.cat([torch.full((n, 1), BOS), r, r], dim=1)  # (N, 1 + 2 SEG)


def texts(n: int = 16, seed: int = 7) -> list[str]:
    """Held-out rows as text in the model's own vocabulary (``t5 t17 ...``), one string per row."""
    rows = repeated_rows(torch.Generator().manual_seed(seed), n)[:, 1:]
    return [" ".join(f"t{i - 2}" for i in row) for row in rows.tolist()]


@lru_cache(maxsize=4)
def _trained_state(steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    from transformers import LlamaForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x = repeated_rows(gen, 32)
            loss = F.cross_entropy(model(x[:, :-1]).logits.flatten(0, 1), x[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)


def save_word_tokenizer(out: Path) -> None:
    """A word-level tokenizer: ``[UNK]`` 0, ``<bos>`` 1, ``t0`` ... ``t63`` 2 ... 65, split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": UNK, "<bos>": BOS, **{f"t{i}": i + 2 for i in range(N_WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<bos>", eos_token="<bos>",
                            pad_token="[UNK]", model_max_length=N_CTX).save_pretrained(str(out))


def write_word_llama(out: Path, steps: int = STEPS) -> Path:
    """The model trained ``steps`` steps (0: untrained) as a Hugging Face directory at ``out``."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(config())
    model.load_state_dict(_trained_state(steps))
    model.save_pretrained(str(out))
    save_word_tokenizer(out)
    return out


def lie(d: Path) -> Path:
    """Edit ``d``'s config to claim 2 query / 1 key-value heads of width 32 (same projection widths)."""
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **LIE}))
    return d
