"""Loading a translator from a model directory: its files, then the checkpoints' task and
models through fairseq, then the text codec.

Decoding defaults are the paper's: beam 4, GNMT length penalty with alpha 0.6, at most source
length + 50 output tokens per sentence (the ``vaswani_translation`` task's generator).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from .. import registration  # noqa: F401  (the models, task and criterion checkpoints name)
from ..artifacts.checkpoints import build_models, read_model_checkpoint, setup_task
from ..artifacts.errors import ArtifactError
from ..artifacts.fingerprint import ensemble_mismatch, stored_fingerprint
from ..artifacts.model_files import find_model_files, language_pair, model_text_pipeline
from ..generation.decoding_options import check_values
from ..generation.gnmt_sequence_generator import penalty_function
from ..paper import BEAM, LENPEN, MAX_LEN_OVER_SOURCE
from .translator import TextTranslator, Translator

logger = logging.getLogger(__name__)


def load_translator(
    model_dir: str | os.PathLike,
    checkpoints: Sequence[str | os.PathLike] | None = None,
    data_dir: str | os.PathLike | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    bpe_codes: str | os.PathLike | None = None,
    sentencepiece_model: str | os.PathLike | None = None,
    moses: bool | None = None,
    beam: int = BEAM,
    lenpen: float = LENPEN,
    length_penalty_form: str = "gnmt",
    max_len_over_source: int = MAX_LEN_OVER_SOURCE,
    batch_size: int = 64,
    max_tokens: int | None = None,
    device: str = "cpu",
    backend: str = "fairseq",
) -> TextTranslator:
    """Load a model directory (see :mod:`user_plugin.hub.model_files`); raises
    :class:`ArtifactError` naming the file when something is missing or unreadable, and a
    :class:`~user_plugin.generation.decoding_options.DecodingOptionError` (a ``ValueError``)
    for a decoding setting out of its range, before reading anything.

    Raw text is encoded by the model's text pipeline: the ``text_pipeline.json`` record in the
    model directory or the data directory (written by the recipes' prepare step, carried by the
    averaged model), else the recipes' pipeline is assumed and one warning line says so
    (:func:`~user_plugin.artifacts.model_files.model_text_pipeline`; ``moses=`` overrides Moses
    tokenization).
    ``backend="ctranslate2"`` loads a CTranslate2 export directory instead
    (:mod:`user_plugin.hub.ctranslate2_translator`), with the same text pipeline and decoding
    defaults.
    """
    # the decoding settings are checked before any file is read
    check_values(beam=beam, lenpen=lenpen, batch_size=batch_size,
                 max_len_over_source=max_len_over_source)
    penalty_function(length_penalty_form)
    if backend == "ctranslate2":
        from .ctranslate2_translator import CTranslate2Translator, open_export

        if checkpoints is not None or data_dir is not None or max_tokens is not None:
            raise ArtifactError("checkpoints=, data_dir= and max_tokens= belong to the fairseq "
                           "backend: a CTranslate2 export holds its model and vocabularies")
        engine, codec, manifest = open_export(model_dir, source_lang, target_lang, bpe_codes,
                                              sentencepiece_model, moses, device)
        return CTranslate2Translator(
            engine, codec, manifest, beam=beam, lenpen=lenpen, batch_size=batch_size,
            length_penalty_form=length_penalty_form, max_len_over_source=max_len_over_source,
        )
    if backend != "fairseq":
        raise ArtifactError(f"backend must be 'fairseq' or 'ctranslate2', got {backend!r}")
    files = find_model_files(model_dir, checkpoints, data_dir, bpe_codes, sentencepiece_model)
    states = [read_model_checkpoint(path) for path in files.checkpoints]
    mismatch = ensemble_mismatch([(path, stored_fingerprint(state))
                                  for path, state in zip(files.checkpoints, states)])
    if mismatch is not None:
        raise ArtifactError(mismatch)
    task_cfg = states[0]["cfg"].task
    src, tgt = language_pair(files.data_dir, source_lang, target_lang, task_cfg)
    task = setup_task(task_cfg, files.data_dir, src, tgt, length_penalty_form,
                      max_len_over_source)
    models = build_models(task, files.checkpoints, states, device)
    model_dir = Path(model_dir)
    codec, note = model_text_pipeline(
        [model_dir, files.data_dir], src, tgt,
        bpe_codes=None if bpe_codes is None else files.bpe_codes,
        sentencepiece_model=None if sentencepiece_model is None else files.sentencepiece_model,
        moses=moses, found=(files.bpe_codes, files.sentencepiece_model),
    )
    if note is not None:
        logger.warning(note)
    return Translator(task, models, codec, beam=beam, lenpen=lenpen, batch_size=batch_size,
                      max_tokens=max_tokens)
