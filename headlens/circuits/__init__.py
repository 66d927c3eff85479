"""Circuits: how heads work together, by exact path patching on the direct path.

An *edge* is a sender (a head ``L{l}H{h}``, the embedding ``embed`` or an MLP ``mlp{l}``) and one input
(``q``, ``k`` or ``v``) of a later receiver head, or the logits. Its effect is the change of a task metric
when the sender is ablated on that one path only: the receiver's input becomes
``LN(resid_clean + delta_sender)``, everything else stays clean and everything downstream is recomputed.

* :mod:`~headlens.circuits.nodes`: sender / receiver names, edges, which edges exist;
* :mod:`~headlens.circuits.senders`: each sender's ablation delta ``(B, T, d_model)`` from one clean run;
* :mod:`~headlens.circuits.native`: the fast path on native models (receiver layer recomputed from
  cached deltas, a batch of edges at once) and the naive hook-per-edge reference;
* :mod:`~headlens.circuits.bridge`: the same on Hugging Face models through TransformerLens' per-head
  q/k/v input forks (grouped-query k/v per query head and per group);
* :mod:`~headlens.circuits.composition`: Elhage et al. composition scores with a rotation null;
* :mod:`~headlens.circuits.edges`: effects, bootstrap CIs, random-sender controls, the edge table;
* :mod:`~headlens.circuits.discovery` and :mod:`~headlens.circuits.motifs`: circuits found from a metric,
  faithfulness, named motifs joined to ``classify``'s labels.
"""
