"""Writing a model package (:mod:`.package`) of checkpoints: the files the one reader
(:func:`.model_files.open_model`) finds for them, the manifest, the model card, written whole.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .digests import sha256_of
from .errors import ArtifactError, read_json
from .package import CARD, FORMAT, KIND, MANIFEST, model_names, read_package
from .text_pipeline import RECORD_NAME, TextPipeline

logger = logging.getLogger(__name__)


def origin_of(paths: Sequence[Path], states: Sequence[Mapping]) -> dict[str, Any]:
    """Where the models came from: each checkpoint's name, sha256, updates, epoch and the
    checkpoints it averages (when it is an average)."""
    entries = []
    for path, state in zip(paths, states):
        history = (state.get("optimizer_history") or [{}])[-1]
        extra = state.get("extra_state") or {}
        entry = {
            "checkpoint": path.name,
            "sha256": sha256_of(path),
            "num_updates": int(history.get("num_updates", 0) or 0),
            "epoch": int((extra.get("train_iterator") or {}).get("epoch", 0) or 0),
        }
        if state.get("averaged_from"):
            entry["averaged_from"] = list(state["averaged_from"])
        entries.append(entry)
    return {"checkpoints": entries}


def scores_of(report: Mapping, test_set: str | None) -> dict[str, Any]:
    """The scores a package records, from the JSON report of ``vaswani-score``."""
    try:
        sacre, tokenized = report["sacrebleu"], report["tokenized_bleu"]
        scores = {
            "test_set": test_set,
            "num_sentences": int(report["num_sentences"]),
            "sacrebleu": {"score": float(sacre["score"]), "signature": str(sacre["signature"])},
            "tokenized_bleu": {"score": float(tokenized["score"]),
                               "compound_split": bool(tokenized["compound_split"]),
                               "tokenizer": str(tokenized["tokenizer"])},
        }
    except (KeyError, TypeError, ValueError) as error:
        raise ArtifactError(f"not a report of vaswani-score --output-json (no {error})") from None
    return scores


def read_scores(path: str | os.PathLike, test_set: str | None) -> dict[str, Any]:
    """:func:`scores_of` the report file ``path``, naming it in an error."""
    try:
        return scores_of(read_json(Path(path), "scores report"), test_set)
    except ArtifactError as error:
        raise ArtifactError(f"{path}: {error}") from None


def model_card(manifest: Mapping[str, Any]) -> str:
    """The package's README.md: what the model is, how to load it with each tool, its scores and
    how it was trained, from the manifest alone."""
    src, tgt = manifest["source_lang"], manifest["target_lang"]
    arch = manifest.get("architecture") or {}
    origin = (manifest.get("origin") or {}).get("checkpoints") or []
    scores = manifest.get("scores")
    models = manifest["models"]
    lines = [
        f"# A Transformer translating {src} to {tgt} (vaswani)",
        "",
        f"A model package (`{FORMAT}`) written by vaswani, the fairseq plugin of *Attention Is "
        "All You Need* (Vaswani et al., 2017). Every file is listed with its size and sha256 in "
        f"`{MANIFEST}`; vaswani's commands refuse a package whose files differ from it.",
        "",
        "## The model",
        "",
        f"- language pair: {src} -> {tgt}",
        f"- architecture: `{arch.get('arch', 'unknown')}`"
        + (f", {len(models)} checkpoints decoded as an ensemble" if len(models) > 1 else ""),
    ]
    for name in ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim",
                 "encoder_attention_heads", "decoder_layers"):
        if name in arch:
            lines.append(f"  - {name.replace('_', ' ')}: {arch[name]}")
    for entry in origin:
        averaged = entry.get("averaged_from")
        what = (f"the average of {len(averaged)} checkpoints ({', '.join(averaged)})"
                if averaged else "a training checkpoint")
        lines.append(f"- trained {entry['num_updates']} updates ({entry['epoch']} epochs); "
                     f"`{entry['checkpoint']}` was {what}")
    lines += ["", "## Scores", ""]
    if scores:
        lines += [
            f"- test set: {scores.get('test_set') or 'not named'} "
            f"({scores['num_sentences']} sentences)",
            f"- sacreBLEU {scores['sacrebleu']['score']:.1f} "
            f"(`{scores['sacrebleu']['signature']}`)",
            f"- tokenized BLEU {scores['tokenized_bleu']['score']:.2f} "
            f"({scores['tokenized_bleu']['tokenizer']}, "
            f"{'with' if scores['tokenized_bleu']['compound_split'] else 'without'} compound "
            "splitting, as the paper's Table 2)",
        ]
    else:
        lines.append("Not measured when the package was written.")
    lines += [
        "",
        "## Use",
        "",
        "```bash",
        "pip install vaswani   # or scripts/setup_venv.sh in its repository",
        f"echo 'A sentence in {src}.' | vaswani-translate PACKAGE",
        "vaswani-serve PACKAGE                               # HTTP service with a page",
        "vaswani-export PACKAGE --to fairseq --output OUT    # stock fairseq, CTranslate2's "
        "converter",
        "vaswani-export PACKAGE --to ctranslate2 --output OUT",
        "vaswani-export PACKAGE --to transformers --output OUT",
        "```",
        "",
        "From Python: `user_plugin.hub.load_translator(\"PACKAGE\").translate(\"...\")`. With "
        "fairseq's own commands (the plugin is needed: the model is vaswani's): "
        f"`fairseq-generate ... --user-dir \"$(vaswani-user-dir)\" --path PACKAGE/{models[0]}` "
        "with this folder as the data directory.",
        "",
        "Raw text goes through the recorded text pipeline (`text_pipeline.json`: Moses "
        "normalisation and tokenization, then the subword model it names), as the training data "
        "did.",
        "",
    ]
    return "\n".join(lines)


def package_manifest(states: Sequence[Mapping], paths: Sequence[Path], source_lang: str,
                     target_lang: str, pipeline: TextPipeline,
                     scores: Mapping[str, Any] | None) -> dict[str, Any]:
    """The manifest of a package of the checkpoints ``paths`` (read into ``states``), but its
    ``files``, which the writer fills."""
    from .fingerprint import architecture, architecture_name, model_config, stored_fingerprint

    config = model_config(states[0])
    return {
        "format": FORMAT,
        "source_lang": source_lang,
        "target_lang": target_lang,
        "models": model_names(len(paths)),
        "architecture": {"arch": architecture_name(config), **architecture(config)},
        "training_fingerprint": stored_fingerprint(states[0]),
        "text_pipeline": RECORD_NAME,
        "subword": pipeline.subword,
        "origin": origin_of(paths, states),
        "scores": dict(scores) if scores else None,
    }


def model_only(state: Mapping, source_lang: str, target_lang: str) -> dict:
    """``state`` without optimizer state and EMA copies, its configuration as plain containers
    (as fairseq writes it) naming the language pair it was trained on: what a released model
    holds."""
    from omegaconf import OmegaConf

    from .averaging import DROPPED_EXTRA_FIELDS, DROPPED_FIELDS

    kept = {key: value for key, value in state.items() if key not in DROPPED_FIELDS}
    cfg = kept["cfg"]
    if OmegaConf.is_config(cfg):
        cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    else:
        cfg = dict(cfg)
    cfg["task"] = {**(cfg.get("task") or {}), "source_lang": source_lang,
                   "target_lang": target_lang}
    kept["cfg"] = cfg
    if isinstance(kept.get("extra_state"), dict):
        kept["extra_state"] = {key: value for key, value in kept["extra_state"].items()
                               if key not in DROPPED_EXTRA_FIELDS}
    return kept


def write_package(output: str | os.PathLike, checkpoints: Sequence[str | os.PathLike],
                  data_dir: str | os.PathLike, source_lang: str | None = None,
                  target_lang: str | None = None, bpe_codes: str | os.PathLike | None = None,
                  sentencepiece_model: str | os.PathLike | None = None,
                  scores: Mapping[str, Any] | None = None) -> dict:
    """Write the package ``output`` of ``checkpoints`` (several: an ensemble) with the
    dictionaries of ``data_dir`` and the model's text pipeline (the record beside a checkpoint
    or in ``data_dir``, else the recipes' pipeline on the subword model given or found:
    :func:`.model_files.open_model`'s rules); returns its manifest. Atomic: on any error nothing
    is written and an existing package at ``output`` is unchanged (one-line errors)."""
    from ..files.atomic import refuse_input_clash
    from .checkpoints import torch_save
    from .fingerprint import ensemble_mismatch, stored_fingerprint
    from .model_files import open_model
    from .written_directory import refuse_foreign_output, write_export

    output = Path(output)
    paths = [Path(path) for path in checkpoints]
    if not paths:
        raise ArtifactError("no checkpoint to package")
    files = open_model(paths[0], checkpoints=paths, data_dir=data_dir, bpe_codes=bpe_codes,
                       sentencepiece_model=sentencepiece_model)
    refuse_input_clash(output, [*files.checkpoints, files.data_dir, *files.inputs()])
    refuse_foreign_output(output, KIND)
    states = files.read_states()
    mismatch = ensemble_mismatch([(path, stored_fingerprint(state))
                                  for path, state in zip(files.checkpoints, states)])
    if mismatch is not None:
        raise ArtifactError(mismatch)
    src, tgt = files.language_pair(states[0], source_lang, target_lang)
    pipeline, note = files.text_pipeline(src, tgt)
    if note is not None:
        logger.warning(note)
    manifest = package_manifest(states, files.checkpoints, src, tgt, pipeline, scores)

    def fill(directory: Path) -> None:
        for name, state in zip(manifest["models"], states):
            torch_save(model_only(state, src, tgt), directory / name)
        for lang in (src, tgt):
            shutil.copyfile(files.data_dir / f"dict.{lang}.txt", directory / f"dict.{lang}.txt")
        pipeline.ship(directory)
        (directory / CARD).write_text(model_card(manifest), encoding="utf-8")

    def check(directory: Path) -> dict:
        return read_package(directory)

    write_export(output, KIND, manifest, fill, check)
    return manifest
