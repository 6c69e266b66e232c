"""Trained-model files: what the hub and the exports read and write, in one layer that both use
(neither imports the other).

Modules: :mod:`.errors` (:class:`ArtifactError`, the one error type), :mod:`.digests` (sha256
identity), :mod:`.checkpoints` (reading, CRC verification and atomic writing of checkpoints, and
building a checkpoint's task and models), :mod:`.fingerprint` (the training fingerprint a
checkpoint carries, and the identity of its parameters by content), :mod:`.averaging` (the mean
of the last checkpoints, §6.1), :mod:`.builtin_transformer` (our model <-> fairseq's
``transformer``: parameter names, options, conversion), :mod:`.our_model` (our model and task
read back from a checkpoint, for every exporter), :mod:`.text_pipeline` (:class:`TextPipeline`,
raw text <-> model tokens, and its record), :mod:`.model_files` (the one reader of
trained models: a model package, a checkpoint, or a folder holding one; dictionaries, subword
model, language pair), :mod:`.package` (the model package: one self-describing folder, read and
checked against its manifest), :mod:`.packaging` (writing one), :mod:`.manifest` (the manifest
of a directory of ours: every file's size and sha256, checked before use),
:mod:`.written_directory` (writing such a directory whole),
:mod:`.ctranslate2_layout` (a CTranslate2 export directory), :mod:`.transformers_layout` (the
files of a Hugging Face transformers export).

Importing this package is cheap; the modules import torch and fairseq where they need them.
"""
