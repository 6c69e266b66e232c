"""Loading a translator: the model's files through the one reader
(:func:`~user_plugin.artifacts.model_files.open_model`), then the checkpoints' task and models
through fairseq, then the text pipeline.

Decoding defaults are the paper's: beam 4, GNMT length penalty with alpha 0.6, at most source
length + 50 output tokens per sentence (the ``vaswani_translation`` task's generator).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from ..artifacts.checkpoints import build_models, setup_task
from ..artifacts.errors import ArtifactError
from ..artifacts.fingerprint import ensemble_mismatch, stored_fingerprint
from ..artifacts.model_files import open_model
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
    """Load a model: a model package, a checkpoint file (with ``data_dir``), or a folder holding
    one checkpoint (:func:`~user_plugin.artifacts.model_files.open_model`); raises
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
    from ..registration import register

    register()  # the models, task and criterion that checkpoints name; safe loading
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
    files = open_model(model_dir, checkpoints, data_dir, bpe_codes, sentencepiece_model)
    states = files.read_states()
    mismatch = ensemble_mismatch([(path, stored_fingerprint(state))
                                  for path, state in zip(files.checkpoints, states)])
    if mismatch is not None:
        raise ArtifactError(mismatch)
    src, tgt = files.language_pair(states[0], source_lang, target_lang)
    # the text pipeline is checked before the models are built: a refusal costs nothing
    codec, note = files.text_pipeline(src, tgt, moses)
    task = setup_task(states[0]["cfg"].task, files.data_dir, src, tgt, length_penalty_form,
                      max_len_over_source)
    models = build_models(task, files.checkpoints, states, device)
    if note is not None:
        logger.warning(note)
    translator = Translator(task, models, codec, beam=beam, lenpen=lenpen,
                            batch_size=batch_size, max_tokens=max_tokens)
    translator.model_files = files
    return translator
