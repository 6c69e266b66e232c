"""The Transformer's building blocks (paper §3): attention (§3.2), the position-wise feed-forward
network (§3.3), positional encoding (§3.5), the residual wrapping of every sub-layer (§3.1), the
encoder and decoder layers, and the caches of incremental decoding.

A regular package (this file), so that a non-editable ``pip install .`` ships it.
"""
