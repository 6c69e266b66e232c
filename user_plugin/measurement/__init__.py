"""Measuring training where it runs: operator calls and host-device synchronisations per update
(:mod:`.operator_count`), fairseq's training step observed in its own process
(:mod:`.train_step_probe`), the model FLOPs behind an MFU figure (:mod:`.flops`), the CPU and
its own matrix-multiply peak (:mod:`.cpu`), a synthetic corpus with WMT14's sentence lengths
to measure on (:mod:`.synthetic_corpus`), and fairseq-generate's command lines for stock and
our model in the decoding comparisons (:mod:`.generate_runs`).

Importing this package registers nothing with fairseq: a stock fairseq process observed by
the probe stays stock.
"""
