"""What a model writes, read off its weights and its residual stream without intervening.

The OV circuit read through the unembedding (what a head writes when it attends to a token: copying,
copy suppression, successor heads) and direct logit attribution (how much each head, MLP and the embedding
writes into a token's logit at a position). Both read the model; nothing here patches or ablates (that is
:mod:`headlens.interventions`, whose ``attribution`` module is attribution *patching*, a different thing).
"""
