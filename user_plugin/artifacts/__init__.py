"""Trained-model files: what the hub and the exports read and write, in one layer that both use
(neither imports the other).

Modules: :mod:`.errors` (:class:`ArtifactError`, the one error type), :mod:`.digests` (sha256
identity), :mod:`.text_pipeline` (:class:`TextPipeline`, raw text <-> model tokens, and its
record), :mod:`.model_files` (a model directory's checkpoints, dictionaries, subword model,
language pair), :mod:`.checkpoints` (reading checkpoints and building their task and models),
:mod:`.manifest` (an export directory's manifest: every file's size and sha256, checked
before use), :mod:`.ctranslate2_layout` (a CTranslate2 export directory),
:mod:`.transformers_layout` (the files of a Hugging Face transformers export).

Importing this package is cheap; the modules import torch and fairseq where they need them.
"""
