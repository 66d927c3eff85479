"""Models: everything headlens can run a probe through, behind one interface.

The native GPT (:mod:`headlens.models.gpt`, with its :class:`~headlens.models.config.ModelConfig`,
hook points and safetensors checkpoints), tokenizers and the probe-relevant facts of a vocabulary,
dtype/device placement, :func:`headlens.models.loading.load` for every model reference, export to a
Hugging Face GPT-2 directory, and the Hugging Face side (:mod:`headlens.models.hf`: the
TransformerLens bridge, fused attention for long context, the hub cache).

Kept import-light: nothing is imported until a submodule is.
"""
