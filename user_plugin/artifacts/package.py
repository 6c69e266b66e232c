"""The model package: a trained model as one self-describing folder (format :data:`FORMAT`).

It is fairseq's released-model layout, plus what tells what it is and proves it intact:

* ``model.pt`` (an ensemble: ``model1.pt``, ``model2.pt``, ... listed in the manifest's
  ``models``): the checkpoint without optimizer state;
* ``dict.<src>.txt`` and ``dict.<tgt>.txt``: the dictionaries it was trained with;
* the subword model (``bpecodes`` or ``sentencepiece.bpe.model``) and ``text_pipeline.json``,
  the text pipeline record that names it (:mod:`.text_pipeline`);
* ``manifest.json`` (:data:`MANIFEST`): the format, the language pair, the architecture and its
  options, the training fingerprint, where the model came from (the checkpoints by name and
  sha256, their updates and epoch, what was averaged), the scores it was measured with when
  known (sacreBLEU with its signature, tokenized BLEU with compound splitting, the test set),
  and the size and sha256 of every other file;
* ``README.md``: the model card, for a person.

A package is written whole by :mod:`.packaging` (:mod:`.written_directory`: staged, checked
as a reader checks it, moved into place) and never edited: its identity is its content. The
one reader of trained models (:func:`.model_files.open_model`) checks every file against the
manifest before use, so that a replaced, truncated or edited file is refused in one line naming
it. Hidden files (a tool's record beside the files, such as the recipes' ``.done``) are not
part of a package.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ArtifactError, read_json
from .manifest import check_files, manifest_name
from .text_pipeline import record_mismatch

#: The format name every package's manifest carries.
FORMAT = "vaswani-model/1"
#: The kind of directory, as :mod:`.manifest` and :mod:`.written_directory` name it.
KIND = "package"
#: The package's manifest file.
MANIFEST = manifest_name(KIND)
#: The model card.
CARD = "README.md"
#: The checkpoint of a single model.
MODEL = "model.pt"
#: The manifest's keys that every package has.
REQUIRED = ("format", "source_lang", "target_lang", "models", "files")


def model_names(count: int) -> list[str]:
    """The checkpoint names of a package of ``count`` models."""
    return [MODEL] if count == 1 else [f"model{number}.pt" for number in range(1, count + 1)]


def is_package(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder that holds a package manifest."""
    return (Path(path) / MANIFEST).is_file()


def read_package(directory: str | os.PathLike) -> dict:
    """The manifest of the package ``directory``, after checking every file it lists (size and
    sha256) and that nothing else is there; a one-line :class:`ArtifactError` naming the first
    file that differs."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{directory}: not a model package (no {MANIFEST}; make one with "
                            "vaswani-package)")
    manifest = read_json(path, "package manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ArtifactError(f"{path}: not a model package manifest of format {FORMAT}"
                            + (f" (format {found!r})" if found else ""))
    missing = [key for key in REQUIRED if key not in manifest]
    if missing:
        raise ArtifactError(f"{path}: corrupt manifest (no {missing[0]!r})")
    if not isinstance(manifest["files"], dict) or not manifest["files"]:
        raise ArtifactError(f"{path}: corrupt manifest ('files' must map each file of the "
                            "package to its size and sha256)")
    for key in ("source_lang", "target_lang"):
        if not isinstance(manifest[key], str) or not manifest[key]:
            raise ArtifactError(f"{path}: corrupt manifest ({key!r} must name a language)")
    models = manifest["models"]
    if (not isinstance(models, list) or not models
            or not all(isinstance(name, str) and name in manifest["files"] for name in models)):
        raise ArtifactError(f"{path}: corrupt manifest ('models' must list files of the package)")
    if models != model_names(len(models)):
        raise ArtifactError(f"{path}: corrupt manifest ('models' of a package of "
                            f"{len(models)} model(s) are {', '.join(model_names(len(models)))}, "
                            f"not {', '.join(models)})")
    check_files(directory, manifest, MANIFEST, what="model package")
    problem = record_mismatch(directory, manifest, path)
    if problem is not None:
        raise ArtifactError(problem)
    return manifest


def package_state_problem(directory: str | os.PathLike, manifest: Mapping[str, Any],
                          states: Sequence[Mapping]) -> str | None:
    """What the package ``directory``'s checkpoints (read into ``states``) say otherwise than
    its manifest, or None: each model's language pair (its task's), architecture and training
    fingerprint, and the dictionaries' token order. The writer takes all of them from the
    models, so a difference means an edited manifest or files replaced with a manifest
    rewritten to match; one line naming both values."""
    import json

    from .fingerprint import (
        architecture,
        architecture_name,
        dictionary_mismatch,
        fingerprint,
        has_data,
        model_config,
        stored_fingerprint,
    )

    def plain(value: Any) -> Any:  # as the manifest holds it (JSON)
        return json.loads(json.dumps(value, default=str))

    directory = Path(directory)
    where = directory / MANIFEST
    pair = (manifest["source_lang"], manifest["target_lang"])
    for name, state in zip(manifest["models"], states):
        task = state["cfg"].get("task") if hasattr(state["cfg"], "get") else None
        held = (task.get("source_lang"), task.get("target_lang")) if task is not None else pair
        if held != pair:
            return (f"{where}: says {pair[0]}->{pair[1]}, but {name} was packaged for "
                    f"{held[0]}->{held[1]}: the manifest was edited")
        config = model_config(state)
        found = plain({"arch": architecture_name(config), **architecture(config)})
        recorded = plain(manifest.get("architecture"))
        if recorded is not None and recorded != found:
            names = sorted(key for key in found.keys() | recorded.keys()
                           if found.get(key) != recorded.get(key))[:4]
            return (f"{where}: its architecture differs from {name}'s in {', '.join(names)} "
                    f"(manifest {', '.join(str(recorded.get(k)) for k in names)}; {name} "
                    f"{', '.join(str(found.get(k)) for k in names)}): the manifest was edited")
        stored = stored_fingerprint(state)
        if "training_fingerprint" in manifest and \
                plain(manifest["training_fingerprint"]) != plain(stored):
            return (f"{where}: its training fingerprint is not {name}'s: the manifest was "
                    "edited or the model replaced")
    stored = stored_fingerprint(states[0])
    if has_data(stored):
        from fairseq.data import Dictionary

        symbols = [Dictionary.load(str(directory / f"dict.{lang}.txt")).symbols for lang in pair]
        mismatch = dictionary_mismatch(fingerprint(*pair, *symbols), stored,
                                       f"the dictionaries of {directory}",
                                       manifest["models"][0])
        if mismatch is not None:
            return f"{where}: {mismatch}"
    return None


def describe(manifest: Mapping[str, Any]) -> str:
    """One line saying what a package holds."""
    scores = manifest.get("scores")
    score = (f", sacreBLEU {scores['sacrebleu']['score']:.1f} on {scores.get('test_set')}"
             if scores else "")
    arch = (manifest.get("architecture") or {}).get("arch", "?")
    return (f"{manifest['source_lang']}->{manifest['target_lang']} {arch}, "
            f"{len(manifest['models'])} model file(s){score}")
