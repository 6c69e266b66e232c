"""Export one of our checkpoints as a CTranslate2 model directory that translates raw text alone.

CTranslate2 (C++, int8 on CPU) is the engine fairseq and Marian models are deployed with. Its
own ``ct2-fairseq-converter`` cannot read our checkpoints (it accepts only fairseq's model
names and reads ``cfg`` as an argparse namespace), nor the safely loadable export of
:mod:`.fairseq_checkpoint` (its loader expects ``cfg.model`` to be that namespace too). Only that
loading step is replaced here: the model is the built-in ``transformer`` that the fairseq export
writes (:func:`~user_plugin.artifacts.builtin_transformer.to_builtin_transformer`, same
weights, our §3.5 table as learned positions), the specification is CTranslate2's
``TransformerSpec.from_config``, and its weights are filled by CTranslate2's own fairseq
converter functions (``set_transformer_encoder``/``set_transformer_decoder``), so the weight
layout is the one CTranslate2 maintains for fairseq models. Special tokens are set as that
converter sets them: decoding starts with EOS (fairseq's convention) and the source gets an EOS
appended.

The directory holds CTranslate2's files (``model.bin``, ``config.json``, the vocabularies), the
text pipeline's subword model (subword-nmt codes as ``bpecodes``, or a SentencePiece model as
``sentencepiece.bpe.model``) and :data:`MANIFEST`: the language pair, the text pipeline, the
model's position limits, the paper's decoding settings, and the size and sha256 of every file,
so that a corrupt or mixed directory is recognised before translating
(:func:`check_export_directory`). It is written into a temporary directory beside the output,
verified (CTranslate2 loads it and scores a test batch; at float32 its log-probabilities must
equal our model's), then moved into place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..artifacts.builtin_transformer import to_builtin_transformer
from ..artifacts.ctranslate2_layout import (
    FORMAT,
    check_export_directory,
    ctranslate2_vocabulary,
    require_ctranslate2,
)
from ..artifacts.errors import ArtifactError
from ..artifacts.our_model import load_our_model, probe_batch
from ..artifacts.text_pipeline import SHIPPED_MODEL_NAMES
from ..artifacts.written_directory import ExportedDirectory, refuse_foreign_output, write_export
from ..files.errors import UserError
from ..paper import BEAM, LENPEN, MAX_LEN_OVER_SOURCE

#: Largest difference between our model's and the float32 CTranslate2 model's token
#: log-probabilities on the verification batch (different GEMM kernels, same float32).
VERIFY_TOLERANCE = 1e-3


def transformer_spec(theirs: nn.Module, task: Any):
    """CTranslate2's ``TransformerSpec`` of fairseq's built-in ``transformer`` ``theirs``, its
    weights set by CTranslate2's fairseq converter functions; an :class:`ArtifactError` for
    what the specification cannot express."""
    require_ctranslate2()
    from ctranslate2.converters import fairseq as ct2_fairseq
    from ctranslate2.specs import transformer_spec as ct2_transformer

    encoder, decoder = theirs.encoder, theirs.decoder
    cfg = theirs.cfg
    pre_norm = bool(cfg.encoder.normalize_before)
    unsupported = {
        "--no-token-positional-embeddings": cfg.no_token_positional_embeddings,
        "--cross-self-attention": cfg.cross_self_attention,
        "--no-cross-attention": cfg.no_cross_attention,
        "--adaptive-softmax-cutoff": cfg.adaptive_softmax_cutoff is not None,
        "--decoder-output-dim": decoder.project_out_dim is not None,
        "--no-decoder-final-norm": pre_norm and cfg.no_decoder_final_norm,
    }
    for option, used in unsupported.items():
        if used:
            raise ArtifactError(f"CTranslate2's Transformer has no {option}")
    if cfg.encoder.normalize_before != cfg.decoder.normalize_before:
        raise ArtifactError("CTranslate2 needs --encoder-normalize-before and "
                          "--decoder-normalize-before to be the same")
    if cfg.encoder.attention_heads != cfg.decoder.attention_heads:
        raise ArtifactError("CTranslate2 needs --encoder-attention-heads and "
                          "--decoder-attention-heads to be the same")
    # fairseq's activation names -> CTranslate2's, as its fairseq converter maps them
    activations = ct2_fairseq._SUPPORTED_ACTIVATIONS
    activation = str(cfg.activation_fn)
    if activation not in activations:
        raise ArtifactError(f"CTranslate2 has no activation {activation!r} "
                          f"(it has {', '.join(activations)})")
    spec = ct2_transformer.TransformerSpec.from_config(
        (len(encoder.layers), len(decoder.layers)), cfg.encoder.attention_heads,
        pre_norm=pre_norm, activation=activations[activation],
        layernorm_embedding=bool(cfg.layernorm_embedding),
    )
    with torch.no_grad():
        ct2_fairseq.set_transformer_encoder(spec.encoder, encoder)
        ct2_fairseq.set_transformer_decoder(spec.decoder, decoder)
    spec.register_source_vocabulary(ctranslate2_vocabulary(task.source_dictionary))
    spec.register_target_vocabulary(ctranslate2_vocabulary(task.target_dictionary))
    spec.config.decoder_start_token = spec.config.eos_token
    spec.config.add_source_eos = True
    return spec


def max_score_difference(ours: nn.Module, task: Any, directory: Path) -> float:
    """Largest difference between our model's and CTranslate2's log-probabilities of the
    target tokens (and EOS) of :func:`probe_batch`, scored teacher-forced by both."""
    ctranslate2 = require_ctranslate2()
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src, lengths, _ = probe_batch(src_dict)
    _, _, prev = probe_batch(tgt_dict)
    target = torch.cat([prev[:, 1:], torch.full((prev.size(0), 1), tgt_dict.eos())], dim=1)
    with torch.no_grad():
        logits, _ = ours(src, lengths, prev)
        ours_lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, target.unsqueeze(-1))
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    source_tokens = [[src_dict[i] for i in row if i not in (src_dict.pad(), src_dict.eos())]
                     for row in src.tolist()]
    target_tokens = [[tgt_dict[i] for i in row] for row in prev[:, 1:].tolist()]
    scored = translator.score_batch(source_tokens, target_tokens)
    difference = 0.0
    for row, result in enumerate(scored):
        theirs = torch.tensor(result.log_probs)
        if theirs.numel() != target.size(1):
            raise ArtifactError(f"CTranslate2 scored {theirs.numel()} tokens, expected "
                              f"{target.size(1)}")
        difference = max(difference, float((theirs - ours_lp[row, :, 0]).abs().max()))
    return difference


def export_ctranslate2(
    checkpoint: str | os.PathLike,
    data_dir: str | os.PathLike,
    output: str | os.PathLike,
    quantization: str | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    bpe_codes: str | os.PathLike | None = None,
    sentencepiece_model: str | os.PathLike | None = None,
    moses: bool | None = None,
) -> ExportedDirectory:
    """Write the CTranslate2 model directory ``output`` of our ``checkpoint`` (dictionaries in
    ``data_dir``), with weights of type ``quantization`` (default float32), the subword model
    (given, or found beside the checkpoint or in ``data_dir``) and :data:`MANIFEST`. Verified
    and moved into place whole; raises a one-line ``UserError`` with nothing written."""
    from ..artifacts.model_files import checkpoint_text_pipeline

    ctranslate2 = require_ctranslate2()
    quantization = quantization or "float32"
    supported = sorted(ctranslate2.get_supported_compute_types("cpu"))
    if quantization not in supported:
        raise UserError(f"--quantization {quantization}: this CPU supports "
                        f"{', '.join(supported)}")
    output, data_dir = Path(output), Path(data_dir)
    refuse_foreign_output(output, "ctranslate2")
    ours, task, _ = load_our_model(checkpoint, data_dir, source_lang, target_lang)
    pipeline = checkpoint_text_pipeline(checkpoint, data_dir, task.cfg.source_lang,
                                        task.cfg.target_lang, bpe_codes, sentencepiece_model,
                                        moses)
    shipped_name = SHIPPED_MODEL_NAMES.get(pipeline.subword)
    spec = transformer_spec(to_builtin_transformer(ours, task), task)
    manifest = {
        "format": FORMAT,
        "source_checkpoint": Path(checkpoint).name,
        "source_lang": task.cfg.source_lang,
        "target_lang": task.cfg.target_lang,
        "quantization": quantization,
        "moses": pipeline.moses_tokenize,
        "bpe_codes": shipped_name if pipeline.subword == "bpe" else None,
        "sentencepiece_model": shipped_name if pipeline.subword == "sentencepiece" else None,
        "max_source_positions": int(ours.cfg.max_source_positions),
        "max_target_positions": int(ours.cfg.max_target_positions),
        "decoding": {"beam": BEAM, "lenpen": LENPEN, "length_penalty_form": "gnmt",
                     "max_len_over_source": MAX_LEN_OVER_SOURCE},
    }

    def fill(model_dir: Path) -> None:
        try:
            spec.validate()
            spec.optimize(quantization=quantization)
            spec.save(str(model_dir))
        except (ValueError, RuntimeError, NotImplementedError) as error:
            raise ArtifactError(f"CTranslate2 refused the model: {error}") from None
        pipeline.ship(model_dir)
        difference = max_score_difference(ours, task, model_dir)
        manifest["verified_max_logprob_difference"] = difference
        if quantization == "float32" and not difference <= VERIFY_TOLERANCE:
            raise ArtifactError(f"the CTranslate2 model's log-probabilities differ from ours by "
                              f"{difference:.2e} (more than {VERIFY_TOLERANCE})")

    write_export(output, "ctranslate2", manifest, fill, check_export_directory)
    subword = manifest["bpe_codes"] or manifest["sentencepiece_model"] or "none"
    return ExportedDirectory(
        output, manifest,
        f"CTranslate2 model ({manifest['quantization']}, {manifest['source_lang']}->"
        f"{manifest['target_lang']}, subword model: {subword}; translate with "
        f"vaswani-translate {output} --backend ctranslate2)")
