"""How the zoo was made: recipes, data samplers, the training loop, and the measurements that write
the model cards. Nothing here is needed to *use* a zoo model (that is :mod:`headlens.zoo`).
"""
