"""Optimizers registered with fairseq: ``vaswani_adam`` (:mod:`.multi_tensor_adam`, §5.3)."""
