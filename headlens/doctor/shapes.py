"""What the weight shapes alone fix about the head layout, read from file headers before any model is built.

Why it looks like this:

* **Most shapes fix only products.** ``q_proj`` has ``n_heads * head_dim`` rows and ``k_proj``
  ``n_kv_heads * head_dim``: any split with the same products loads, so the doctor races the splits on
  text (:mod:`headlens.doctor.family_check`). Some tensors fix the split itself: a q/k norm applied to
  each head (Gemma 3, Qwen3: ``q_norm.weight`` has ``head_dim`` entries), a norm of shape
  ``(n_heads, head_dim)`` (Cohere), one norm per head (StableLM's ``q_layernorm.norms.{h}``), a
  per-head parameter (attention sinks, ``(n_heads,)``). Then no text is needed: the weights say the
  layout, and a config that says another one is wrong (a finding, exit 8), not a file that fails to load.
* **Read before anything runs.** Shapes come from the safetensors header (or a GGUF's tensor table), so a
  lying config is named in well under a second and no forward pass, conversion or re-initialisation
  ever happens on it. Building the model first made ``transformers`` re-initialise ``q_norm`` under
  every wrong layout ("Reinit due to size mismatch"), which could only end in "inconclusive".
* **A norm over all heads says nothing.** OLMo-2 normalises q and k before the split
  (``q_norm.weight`` as wide as ``q_proj``): every split keeps it, so the loss race decides there.
* **A GGUF header's ``attention.key_length`` is the header's own claim**, not weights: it can contradict
  the header's head count (``head_count * key_length`` != the query rows: a finding) but never passes a
  file on its own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from headlens.doctor.families import HeadLayout
from headlens.errors import CheckpointError
from headlens.models.safetensors_file import read_safetensors_header

Shapes = dict[str, tuple[int, ...]]  # tensor name -> shape, (out, in) for projections as Hugging Face keeps them

_LAYER = re.compile(r"(?:layers|h|blk)\.(\d+)\.")
_ROLES = {  # role -> the names' endings that play it (Hugging Face and GGUF spellings)
    "q": re.compile(r"(?:q_proj|attn_q)\.weight$"),
    "k": re.compile(r"(?:k_proj|attn_k)\.weight$"),
    "q_norm": re.compile(r"(?:q_norm|q_layernorm|attn_q_norm)\.weight$"),
    "k_norm": re.compile(r"(?:k_norm|k_layernorm|attn_k_norm)\.weight$"),
    "q_norms": re.compile(r"q_layernorm\.norms\.\d+\.weight$"),  # one norm per query head
    "sinks": re.compile(r"(?:sinks|attn_sinks\.weight)$"),
}


@dataclass(frozen=True)
class ShapeEvidence:
    """The head layout a tensor's shape implies, and the sentence that says why.

    ``decisive``: the shape belongs to a weight (a per-head norm, sinks), so it can pass a config as well
    as fail one; a GGUF header's ``key_length`` is not (it can only contradict the header).
    """

    layout: HeadLayout
    tensor: str  # the tensor (or header key) that fixes the layout
    statement: str  # "<tensor> has 32 entries: heads are 32 wide, so q_proj's 128 rows are 4 heads ..."
    decisive: bool = True

    def finding(self, said: HeadLayout, whose: str = "the config's") -> str:
        """The one line a layout that disagrees gets: the evidence, then what ``said`` claimed."""
        return f"{self.statement}, not {whose} {said.n_heads} heads of width {said.d_head} ({_kv(said.n_kv_heads)})"


def _grouped(shapes: Shapes) -> dict[int, dict[str, list[tuple[str, tuple[int, ...]]]]]:
    """layer -> role -> [(name, shape)] for the tensors :data:`_ROLES` names."""
    out: dict[int, dict[str, list[tuple[str, tuple[int, ...]]]]] = {}
    for name, shape in shapes.items():
        layer = _LAYER.search(name)
        role = next((r for r, pattern in _ROLES.items() if pattern.search(name)), None)
        if layer is not None and role is not None:
            out.setdefault(int(layer.group(1)), {}).setdefault(role, []).append((name, shape))
    return out


def _kv(n: int) -> str:
    return f"{n} key/value head{'s' * (n != 1)}"


def _short(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``q_proj``."""
    return name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]


def _width_evidence(roles: dict[str, list[tuple[str, tuple[int, ...]]]], Q: int, KV: int
                    ) -> tuple[str, str, int | None, int] | None:
    """``(tensor, what its shape is, n_heads or None, head_dim)`` from the first role that fixes the width."""
    if len(norms := roles.get("q_norms", [])) > 1 and all(len(s) == 1 for _, s in norms):
        name = norms[0][0].rsplit(".", 2)[0]  # ...q_layernorm.norms
        return name, f"holds {len(norms)} norms of {norms[0][1][0]} entries", len(norms), norms[0][1][0]
    for role, width in (("q_norm", Q), ("k_norm", KV)):
        for name, shape in roles.get(role, []):
            if len(shape) == 2 and role == "q_norm":  # (n_heads, head_dim): Cohere
                return name, f"is {shape[0]} x {shape[1]}", shape[0], shape[1]
            if len(shape) == 1 and shape[0] < width and width % shape[0] == 0:  # a norm of each head
                return name, f"has {shape[0]} entries", None, shape[0]
    for name, shape in roles.get("sinks", []):
        if len(shape) == 1 and shape[0] > 0 and Q % shape[0] == 0:
            return name, f"has {shape[0]} entries (one per query head)", shape[0], Q // shape[0]
    return None


def _layer_evidence(roles: dict[str, list[tuple[str, tuple[int, ...]]]]) -> ShapeEvidence | None:
    if not roles.get("q") or not roles.get("k"):
        return None
    (q_name, q_shape), (k_name, k_shape) = roles["q"][0], roles["k"][0]
    Q, KV = q_shape[0], k_shape[0]  # query rows n_heads * head_dim, key rows n_kv_heads * head_dim
    found = _width_evidence(roles, Q, KV)
    if found is None:
        return None
    name, what, heads, d_head = found
    if Q % d_head or KV % d_head or (heads is not None and heads * d_head != Q) or (Q // d_head) % (KV // d_head):
        return None  # a shape that does not tile the projections is no per-head tensor
    layout = HeadLayout(Q // d_head, KV // d_head, d_head)
    return ShapeEvidence(layout, name, f"{name} {what}: heads are {d_head} wide, so {_short(q_name)}'s {Q} rows "
                                       f"are {layout.n_heads} heads and {_short(k_name)}'s {KV} rows "
                                       f"{_kv(layout.n_kv_heads)}")


def implied_layout(shapes: Shapes) -> ShapeEvidence | None:
    """The layout the weights fix, from the first layer that has a per-head tensor; None when their shapes
    fix only the projection widths (then the losses decide).

    >>> shapes = {"model.layers.0.self_attn.q_proj.weight": (128, 64), "model.layers.0.self_attn.k_proj.weight":
    ...           (64, 64), "model.layers.0.self_attn.q_norm.weight": (32,)}
    >>> ev = implied_layout(shapes)
    >>> str(ev.layout)
    'n_heads=4, n_kv_heads=2, head_dim=32'
    >>> ev.finding(HeadLayout(8, 4, 32))
    "model.layers.0.self_attn.q_norm.weight has 32 entries: heads are 32 wide, so q_proj's 128 rows are 4 heads and k_proj's 64 rows 2 key/value heads, not the config's 8 heads of width 32 (4 key/value heads)"
    """
    layers = _grouped(shapes)
    return next((ev for layer in sorted(layers) if (ev := _layer_evidence(layers[layer])) is not None), None)


def width_mismatch(shapes: Shapes, said: HeadLayout) -> str | None:
    """Which projection's rows the layout ``said`` cannot hold, in words; None when both fit (or are unknown).

    >>> width_mismatch({"model.layers.0.self_attn.q_proj.weight": (128, 64)}, HeadLayout(8, 2, 32))
    'model.layers.0.self_attn.q_proj.weight has 128 rows, where 8 heads of width 32 need 256'
    """
    roles = next(iter(_grouped(shapes).values()), {})
    for role, heads in (("q", said.n_heads), ("k", said.n_kv_heads)):
        for name, shape in roles.get(role, [])[:1]:
            if shape[0] != heads * said.d_head:
                kind = "heads" if role == "q" else "key/value heads"
                return f"{name} has {shape[0]} rows, where {heads} {kind} of width {said.d_head} need " \
                       f"{heads * said.d_head}"
    return None


def safetensors_shapes(model_dir: Path) -> Shapes:
    """Every tensor's shape in the directory's safetensors file(s), read from their headers (no weights are
    read); empty when it has none (``pytorch_model.bin``: the losses decide)."""
    index = model_dir / "model.safetensors.index.json"
    try:
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
            else ["model.safetensors"]
    except (OSError, json.JSONDecodeError, KeyError, AttributeError):
        return {}
    shapes: Shapes = {}
    for file in files:
        try:
            header = read_safetensors_header(model_dir / file)
        except CheckpointError:
            return {}  # the loader reports an unreadable file in its own words
        shapes.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return shapes


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file's header says of its attention, and its tensors' shapes (Hugging Face orientation)."""

    architecture: str
    layout: HeadLayout  # head_count, head_count_kv, key_length (else embedding_length / head_count)
    d_model: int
    key_length: int | None
    shapes: Shapes


def _int_field(reader: object, key: str) -> int | None:
    field = reader.fields.get(key)  # type: ignore[attr-defined]
    if field is None or len(field.data) != 1:
        return None  # absent, or one value per layer (not a single layout)
    value = field.parts[field.data[0]].tolist()
    return int(value[0]) if value else None


def gguf_header(path: Path, arch: str) -> GGUFHeader | None:
    """The header of the GGUF at ``path``, of architecture ``arch`` (``general.architecture``, as
    :func:`headlens.models.hf.gguf_file.inspect_file` read it): its tensor table and attention metadata, no
    weights read; None when it states no single head count (the loss race, on the converted model, decides)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    heads, d_model = _int_field(reader, f"{arch}.attention.head_count"), _int_field(reader, f"{arch}.embedding_length")
    if not heads or not d_model:
        return None
    kv = _int_field(reader, f"{arch}.attention.head_count_kv") or heads
    key_length = _int_field(reader, f"{arch}.attention.key_length")
    # GGUF lists dimensions innermost first: (in, out) -> (out, in), as Hugging Face keeps them
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}
    return GGUFHeader(arch, HeadLayout(heads, kv, key_length or d_model // heads), d_model, key_length, shapes)


def header_evidence(header: GGUFHeader) -> ShapeEvidence | None:
    """The layout a GGUF's weights fix (:func:`implied_layout`), else the one its ``key_length`` and query rows
    imply when that contradicts its head count (never decisive: both are the header's word)."""
    if (ev := implied_layout(header.shapes)) is not None or header.key_length is None:
        return ev
    q = header.shapes.get("blk.0.attn_q.weight")
    k = header.shapes.get("blk.0.attn_k.weight")
    kl = header.key_length
    if q is None or k is None or q[0] % kl or k[0] % kl or q[0] // kl == header.layout.n_heads:
        return None
    layout = HeadLayout(q[0] // kl, k[0] // kl, kl)
    return ShapeEvidence(layout, "attention.key_length", f"the header's attention.key_length is {kl}, so "
                                                         f"blk.0.attn_q.weight's {q[0]} rows are {layout.n_heads} "
                                                         f"heads", decisive=False)
