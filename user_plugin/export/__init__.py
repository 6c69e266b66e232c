"""Shipping a trained model: export to stock fairseq, CTranslate2 and Hugging Face transformers.

``vaswani-export PACKAGE --to fairseq --output OUT.pt`` (or a checkpoint with ``--data-dir``)
writes a checkpoint of fairseq's own ``transformer`` as stock fairseq writes it
(:mod:`.fairseq_checkpoint`), which stock ``fairseq-generate``, ``from_pretrained`` and
CTranslate2's ``ct2-fairseq-converter`` load without ``--user-dir``; ``--to ctranslate2 --output DIR
[--quantization int8]`` writes a CTranslate2 model directory that the hub's ``ctranslate2``
backend translates raw text with (:mod:`.ctranslate2_model`); ``--to transformers --output DIR``
writes a directory that transformers' ``from_pretrained`` loads (:mod:`.transformers_model`).
Every export carries the model's text pipeline record, and the directory exports are written
whole by :mod:`user_plugin.artifacts.written_directory` (staged, described by a manifest,
checked, moved into place).
The files these write and read are described in :mod:`user_plugin.artifacts`, which the hub
uses too. The command line is
:mod:`user_plugin.commands.export`; docs/export.md has the details and measurements.

Importing this package is cheap; the modules import torch and fairseq.
"""
