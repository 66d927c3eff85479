"""Hugging Face models: booted through TransformerLens' ``TransformerBridge``.

:mod:`~headlens.models.hf.hub` decides where a reference points (a local directory or the Hugging
Face cache), :mod:`~headlens.models.hf.boot` loads it, :mod:`~headlens.models.hf.bridge` wraps it in
the interface the rest of headlens uses, :mod:`~headlens.models.hf.specs` reads how each layer
computes its attention scores, and :mod:`~headlens.models.hf.fused` runs long prompts without
building the attention pattern.
"""
