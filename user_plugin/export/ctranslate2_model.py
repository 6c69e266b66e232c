"""Export one of our checkpoints as a CTranslate2 model directory that translates raw text alone.

CTranslate2 (C++, int8 on CPU) is the engine fairseq and Marian models are deployed with. Its
own ``ct2-fairseq-converter`` cannot read our checkpoints (it accepts only fairseq's model
names and reads ``cfg`` as an argparse namespace), nor the safely loadable export of
:mod:`.fairseq_checkpoint` (its loader expects ``cfg.model`` to be that namespace too). Only that
loading step is replaced here: the model is the built-in ``transformer`` that the fairseq export
writes (:func:`~.fairseq_checkpoint.to_builtin_transformer`, same weights, our §3.5 table as
learned positions), the specification is CTranslate2's ``TransformerSpec.from_config``, and its
weights are filled by CTranslate2's own fairseq converter functions
(``set_transformer_encoder``/``set_transformer_decoder``), so the weight layout is the one
CTranslate2 maintains for fairseq models. Special tokens are set as that converter sets them:
decoding starts with EOS (fairseq's convention) and the source gets an EOS appended.

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

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..files.atomic import atomic_write_text, make_temp_dir
from ..files.errors import UserError, file_error
from ..paper import BEAM, LENPEN, MAX_LEN_OVER_SOURCE
from .fairseq_checkpoint import ExportError, load_our_model, probe_batch, to_builtin_transformer

#: The file of an export directory that describes it (see the module docstring).
MANIFEST = "vaswani_export.json"
#: The manifest's format name; a directory without it is not one of our exports.
FORMAT = "vaswani-ctranslate2/1"
#: What a manifest must hold besides its format.
MANIFEST_KEYS = ("source_lang", "target_lang", "moses", "bpe_codes", "sentencepiece_model",
                 "max_source_positions", "max_target_positions", "files")
#: Names the subword model gets in the directory (the hub looks for these first).
BPE_CODES_NAME = "bpecodes"
SENTENCEPIECE_NAME = "sentencepiece.bpe.model"
#: CTranslate2's name for fairseq's padding symbol (what its fairseq converter uses).
CT2_PAD = "<blank>"
#: Largest difference between our model's and the float32 CTranslate2 model's token
#: log-probabilities on the verification batch (different GEMM kernels, same float32).
VERIFY_TOLERANCE = 1e-3


def require_ctranslate2():
    """The ``ctranslate2`` module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError("CTranslate2 is not installed: pip install 'ctranslate2==4.8.5' "
                        "(or the project's extra: pip install -e '.[ctranslate2]')") from None
    return ctranslate2


def ctranslate2_vocabulary(dictionary: Any) -> list[str]:
    """A fairseq dictionary's symbols in CTranslate2's convention (padding is ``<blank>``)."""
    return [CT2_PAD if symbol == "<pad>" else symbol for symbol in dictionary.symbols]


def transformer_spec(theirs: nn.Module, task: Any):
    """CTranslate2's ``TransformerSpec`` of fairseq's built-in ``transformer`` ``theirs``, its
    weights set by CTranslate2's fairseq converter functions; an :class:`ExportError` for
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
            raise ExportError(f"CTranslate2's Transformer has no {option}")
    if cfg.encoder.normalize_before != cfg.decoder.normalize_before:
        raise ExportError("CTranslate2 needs --encoder-normalize-before and "
                          "--decoder-normalize-before to be the same")
    if cfg.encoder.attention_heads != cfg.decoder.attention_heads:
        raise ExportError("CTranslate2 needs --encoder-attention-heads and "
                          "--decoder-attention-heads to be the same")
    # fairseq's activation names -> CTranslate2's, as its fairseq converter maps them
    activations = ct2_fairseq._SUPPORTED_ACTIVATIONS
    activation = str(cfg.activation_fn)
    if activation not in activations:
        raise ExportError(f"CTranslate2 has no activation {activation!r} "
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


def sha256_of(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_records(directory: Path) -> dict[str, dict[str, Any]]:
    """``name -> {"bytes", "sha256"}`` of every file in ``directory`` but the manifest."""
    return {
        path.name: {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
        for path in sorted(directory.iterdir()) if path.is_file() and path.name != MANIFEST
    }


def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of an export directory; a one-line error when there is none or it is not
    ours."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"{directory}: no such directory (a CTranslate2 export of "
                        "python -m user_plugin.export --to ctranslate2)")
    path = directory / MANIFEST
    if not path.is_file():
        raise UserError(f"{directory}: not a CTranslate2 export of vaswani (no {MANIFEST}; "
                        "export one with python -m user_plugin.export ... --to ctranslate2)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise file_error(path, error) from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: corrupt manifest (not JSON: {error.msg} at line "
                        f"{error.lineno})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{path}: not a manifest of format {FORMAT}")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if missing:
        raise UserError(f"{path}: corrupt manifest (no {missing[0]!r})")
    return manifest


def check_export_directory(directory: str | os.PathLike) -> dict:
    """Read the manifest of ``directory`` and check that every file it lists is there with its
    recorded size and sha256, and that nothing else is; returns the manifest. A one-line error
    names the first file that differs (a corrupt or partly replaced directory)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not recorded:
        raise UserError(f"{directory / MANIFEST}: lists no files")
    for name, record in recorded.items():
        path = directory / name
        if not isinstance(record, dict):
            raise UserError(f"{directory / MANIFEST}: corrupt manifest (entry {name!r})")
        if not path.is_file():
            raise UserError(f"{path}: missing from the export (listed in {MANIFEST})")
        size = path.stat().st_size
        if size != record.get("bytes"):
            raise UserError(f"{path}: {size} bytes, but the export wrote {record.get('bytes')}: "
                            "the directory is corrupt or mixed with another export")
        if sha256_of(path) != record.get("sha256"):
            raise UserError(f"{path}: content differs from the export (sha256): the directory "
                            "is corrupt or mixed with another export")
    extra = sorted(p.name for p in directory.iterdir() if p.name not in recorded
                   and p.name != MANIFEST)
    if extra:
        raise UserError(f"{directory / extra[0]}: not part of the export (mixed with another "
                        "model's files?)")
    return manifest


def find_subword_model(name: str | os.PathLike | None, names: tuple[str, ...],
                       places: list[Path]) -> Path | None:
    """The given subword model (which must exist), else the first of ``names`` in ``places``."""
    if name is not None:
        path = Path(name)
        if not path.is_file():
            raise UserError(f"{path}: no such file")
        return path
    for place in places:
        for candidate in names:
            if (place / candidate).is_file():
                return place / candidate
    return None


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
            raise ExportError(f"CTranslate2 scored {theirs.numel()} tokens, expected "
                              f"{target.size(1)}")
        difference = max(difference, float((theirs - ours_lp[row, :, 0]).abs().max()))
    return difference


@dataclass
class ExportedDirectory:
    """What :func:`export_ctranslate2` wrote."""

    directory: Path
    manifest: dict

    def summary(self) -> str:
        subword = self.manifest["bpe_codes"] or self.manifest["sentencepiece_model"] or "none"
        return (f"{self.manifest['quantization']}, {self.manifest['source_lang']}->"
                f"{self.manifest['target_lang']}, subword model: {subword}; translate with "
                f"python -m user_plugin.hub {self.directory} --backend ctranslate2")


def replace_directory(new: Path, output: Path) -> None:
    """Move the complete directory ``new`` to ``output``. An existing ``output`` must be one of
    our exports (or empty); it is renamed aside first and removed last, so a complete export is
    always there under one of the two names."""
    if output.exists():
        if not output.is_dir():
            raise UserError(f"{output}: exists and is not a directory")
        if any(output.iterdir()) and not (output / MANIFEST).is_file():
            raise UserError(f"{output}: exists and is not a CTranslate2 export of vaswani; "
                            "remove it or choose another --output")
        old = make_temp_dir(output)
        os.replace(output, old / "previous")
        os.replace(new, output)
        shutil.rmtree(old)
    else:
        os.replace(new, output)


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
    from ..hub.model_files import BPE_CODES_NAMES, SENTENCEPIECE_NAMES

    ctranslate2 = require_ctranslate2()
    quantization = quantization or "float32"
    supported = sorted(ctranslate2.get_supported_compute_types("cpu"))
    if quantization not in supported:
        raise UserError(f"--quantization {quantization}: this CPU supports "
                        f"{', '.join(supported)}")
    output, data_dir = Path(output), Path(data_dir)
    if output.exists() and (not output.is_dir() or (
            any(output.iterdir()) and not (output / MANIFEST).is_file())):
        raise UserError(f"{output}: exists and is not a CTranslate2 export of vaswani; "
                        "remove it or choose another --output")
    ours, task, _ = load_our_model(checkpoint, data_dir, source_lang, target_lang)
    places = [Path(checkpoint).parent, data_dir]
    bpe = find_subword_model(bpe_codes, BPE_CODES_NAMES, places)
    spm = find_subword_model(sentencepiece_model, SENTENCEPIECE_NAMES, places)
    if bpe is not None and spm is not None:
        raise UserError(f"found both BPE codes ({bpe}) and a SentencePiece model ({spm}): "
                        "give the one the model was trained with (--bpe-codes or "
                        "--sentencepiece-model)")
    spec = transformer_spec(to_builtin_transformer(ours, task), task)
    manifest = {
        "format": FORMAT,
        "source_checkpoint": Path(checkpoint).name,
        "source_lang": task.cfg.source_lang,
        "target_lang": task.cfg.target_lang,
        "quantization": quantization,
        "moses": (spm is None) if moses is None else bool(moses),
        "bpe_codes": BPE_CODES_NAME if bpe is not None else None,
        "sentencepiece_model": SENTENCEPIECE_NAME if spm is not None else None,
        "max_source_positions": int(ours.cfg.max_source_positions),
        "max_target_positions": int(ours.cfg.max_target_positions),
        "decoding": {"beam": BEAM, "lenpen": LENPEN, "length_penalty_form": "gnmt",
                     "max_len_over_source": MAX_LEN_OVER_SOURCE},
    }
    staging = make_temp_dir(output)
    try:
        model_dir = staging / "model"
        try:
            spec.validate()
            spec.optimize(quantization=quantization)
            model_dir.mkdir()
            spec.save(str(model_dir))
        except (ValueError, RuntimeError, NotImplementedError) as error:
            raise ExportError(f"CTranslate2 refused the model: {error}") from None
        if bpe is not None:
            shutil.copyfile(bpe, model_dir / BPE_CODES_NAME)
        if spm is not None:
            shutil.copyfile(spm, model_dir / SENTENCEPIECE_NAME)
        difference = max_score_difference(ours, task, model_dir)
        manifest["verified_max_logprob_difference"] = difference
        if quantization == "float32" and not difference <= VERIFY_TOLERANCE:
            raise ExportError(f"the CTranslate2 model's log-probabilities differ from ours by "
                              f"{difference:.2e} (more than {VERIFY_TOLERANCE})")
        manifest["files"] = file_records(model_dir)
        atomic_write_text(model_dir / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        check_export_directory(model_dir)
        replace_directory(model_dir, output)
    except OSError as error:
        raise file_error(output, error, writing=True) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportedDirectory(output, manifest)
