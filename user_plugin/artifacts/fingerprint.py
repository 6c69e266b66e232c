"""What a model was trained on and what it computes, compared by every consumer; and which
checkpoints hold the same parameters.

A model's parameters mean something only with the dictionaries it was trained with, in their
token order (row N of the embedding is token N), in its language direction, and with the
architecture options that say what function they compute. Two dictionaries of the same size
with the same tokens in another order give tensors of the same shapes, and so do 4 or 8
attention heads over the same d_model, pre- or post-norm layers of the same widths, another
activation function, or embeddings scaled or not: shapes cannot tell them apart. Averaging such
checkpoints, ensembling them, resuming on such data or options, or decoding with such a
dictionary gives garbage without a word.

The **training fingerprint** of a checkpoint (:func:`stored_fingerprint`) has two parts:

* the **data** part, a small dict of plain strings stored in every checkpoint under the
  top-level key :data:`KEY` (fairseq-train writes it: the plugin's save hook,
  :mod:`user_plugin.fairseq_patches.save_directory`; copies, the averager and the export carry it):
  ``source_lang``, ``target_lang`` (the direction) and ``source_dictionary``,
  ``target_dictionary``, the sha256 of each dictionary's token order
  (:func:`dictionary_sha256`: the symbols joined by LF, UTF-8; counts do not matter to a model);
* the **architecture** part (:data:`ARCHITECTURE`): the values of
  :data:`ARCHITECTURE_OPTIONS`, every model option that changes what the parameters compute,
  an option missing from an older configuration taking its default (the value the model was
  built with). Options that only act while training (dropout, LayerDrop, quantization noise,
  activation checkpointing), at decoding (alignments), or at initialization (pre-trained
  embedding files), and the position limits (a longer table gives the same function on the
  sentences both accept) are not part of it (:data:`NOT_ARCHITECTURE_OPTIONS`). It is read
  from the model configuration every fairseq checkpoint holds (``cfg.model``, or ``args`` in
  the oldest ones), not stored: that covers every checkpoint ever written, and nothing can go
  stale, since the model is built from that very configuration. The one exception is an
  export to another model's layout (fairseq's ``transformer`` holding our sinusoids as its
  learned positions: another configuration of the same function), which stores the
  architecture of the model it was exported from under :data:`KEY`'s :data:`ARCHITECTURE`.

:func:`fingerprint_mismatch` compares two fingerprints in one sentence naming both (the
dictionaries, or the options that differ with both values), :func:`dictionary_mismatch` the
dictionaries only, :func:`ensemble_mismatch` the checkpoints of an ensemble. A checkpoint
written before data fingerprints were stored has none: consumers use it with one note line
(:func:`unchecked_note`), since its dictionaries cannot be checked.

**The same parameters.** :func:`parameters_sha256` identifies a model's parameters by content
(names, types, shapes and bytes of every tensor), so that a copy (``checkpoint_last.pt`` is a
byte copy of the last interval checkpoint) is counted once where checkpoints are combined
(:func:`distinct_parameters`, :func:`duplicate_note`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The checkpoint's top-level key holding the data part of its training fingerprint.
KEY = "training_data"
#: The fields of the data part.
FIELDS = ("source_lang", "target_lang", "source_dictionary", "target_dictionary")
#: The fingerprint's entry holding the architecture part.
ARCHITECTURE = "architecture"

#: The model options (names of ``cfg.model``, as fairseq's ``transformer`` and
#: ``vaswani_transformer`` share them) that decide the function a model's parameters compute,
#: with the value an older configuration without the option was built with.
ARCHITECTURE_OPTIONS: dict[str, Any] = {
    "activation_fn": "relu",
    "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_layers": 6,
    "encoder_attention_heads": 8, "encoder_normalize_before": False,
    "encoder_learned_pos": False,
    "decoder_embed_dim": 512, "decoder_ffn_embed_dim": 2048, "decoder_layers": 6,
    "decoder_attention_heads": 8, "decoder_normalize_before": False,
    "decoder_learned_pos": False,
    "attention_key_dim": None, "attention_value_dim": None,
    "share_decoder_input_output_embed": False, "share_all_embeddings": False,
    "no_scale_embedding": False, "no_token_positional_embeddings": False,
    "layernorm_embedding": False, "no_decoder_final_norm": False, "decoder_output_dim": None,
    "no_cross_attention": False, "cross_self_attention": False,
    "adaptive_softmax_cutoff": None, "adaptive_softmax_factor": 4,
    "adaptive_input": False, "tie_adaptive_weights": False, "tie_adaptive_proj": False,
    "merge_src_tgt_embed": False, "char_inputs": False, "encoder_xformers_att_config": None,
    "decoder_xformers_att_config": None, "base_layers": 0, "base_sublayers": 1,
    "base_shuffle": 1,
}
#: The model options that do not change what the parameters compute: training only
#: (dropouts, LayerDrop, quantization noise, activation checkpointing and sharding, compiling
#: each layer),
#: initialization (pre-trained embedding files), decoding extras (alignments), pruning at load
#: time (its result is the layer count), and the position limits.
NOT_ARCHITECTURE_OPTIONS = frozenset({
    "dropout", "attention_dropout", "activation_dropout", "relu_dropout",
    "encoder_layerdrop", "decoder_layerdrop", "encoder_layers_to_keep",
    "decoder_layers_to_keep", "quant_noise_pq", "quant_noise_pq_block_size",
    "quant_noise_scalar", "adaptive_softmax_dropout", "checkpoint_activations",
    "offload_activations", "min_params_to_wrap", "export", "encoder_embed_path",
    "decoder_embed_path", "max_source_positions", "max_target_positions", "alignment_layer",
    "alignment_heads", "full_context_alignment", "compile_layers",
})


def dictionary_sha256(symbols: Iterable[str]) -> str:
    """The sha256 (hex) of a dictionary's token order: its symbols joined by LF."""
    return hashlib.sha256("\n".join(symbols).encode("utf-8")).hexdigest()


def fingerprint(source_lang: str, target_lang: str, source_symbols: Iterable[str],
                target_symbols: Iterable[str]) -> dict[str, str]:
    """The training fingerprint of a direction and two dictionaries (their symbols)."""
    return {
        "source_lang": str(source_lang), "target_lang": str(target_lang),
        "source_dictionary": dictionary_sha256(source_symbols),
        "target_dictionary": dictionary_sha256(target_symbols),
    }


def task_fingerprint(task) -> dict[str, str] | None:
    """The fingerprint of a fairseq translation task (its dictionaries and languages), or None
    for a task without a source and a target dictionary."""
    try:
        source, target = task.source_dictionary, task.target_dictionary
    except (AttributeError, NotImplementedError):
        return None
    cfg = getattr(task, "cfg", None) or getattr(task, "args", None)
    src, tgt = getattr(cfg, "source_lang", None), getattr(cfg, "target_lang", None)
    if source is None or target is None or not src or not tgt:
        return None
    return fingerprint(src, tgt, source.symbols, target.symbols)


def model_config(state: Mapping) -> Any:
    """The model configuration a checkpoint's state holds (``cfg.model``, or the ``args`` of
    the oldest fairseq checkpoints), or None."""
    if not isinstance(state, Mapping):
        return None
    cfg = state.get("cfg")
    model = cfg.get("model") if isinstance(cfg, Mapping) else getattr(cfg, "model", None)
    if model is None:
        model = state.get("args")
    return model if isinstance(model, (Mapping, argparse.Namespace)) else None


def architecture_name(model_cfg: Any) -> str | None:
    """The registered architecture a model configuration was built as (``--arch``: fairseq's
    ``arch`` of an argparse namespace, ``_name`` of a dataclass configuration), or None."""
    if isinstance(model_cfg, Mapping):
        name = model_cfg.get("_name") or model_cfg.get("arch")
    else:
        name = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None)
    return name if isinstance(name, str) and name else None


def _normal(value: Any) -> Any:
    """An option's value in one spelling: enums by their value, lists (or omegaconf's) as
    ``a,b``, an unset value (None, empty) as None."""
    value = getattr(value, "value", value)  # a ChoiceEnum member
    if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
        return None
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        return ",".join(str(item) for item in value)
    return str(value)


def architecture(model_cfg: Any) -> dict[str, Any]:
    """The architecture part of a fingerprint: the value of each of
    :data:`ARCHITECTURE_OPTIONS` in the model configuration ``model_cfg`` (a dict, an omegaconf
    config or an argparse namespace), its default where the configuration lacks it; and, for a
    configuration that holds model options only (a dict or omegaconf config: a dataclass
    model's, such as an extension's), every other option it holds but those of
    :data:`NOT_ARCHITECTURE_OPTIONS` (an argparse namespace of the oldest checkpoints holds
    every option of the run, not only the model's: only the known ones are read there)."""
    found = {}
    for name, default in ARCHITECTURE_OPTIONS.items():
        if isinstance(model_cfg, Mapping):
            value = model_cfg[name] if name in model_cfg else default
        else:
            value = getattr(model_cfg, name, default)
        found[name] = _normal(value)
    if found["decoder_output_dim"] is None:  # unset: d_model (fairseq's transformer sets it)
        found["decoder_output_dim"] = found["decoder_embed_dim"]
    if isinstance(model_cfg, Mapping):
        for name in model_cfg:
            if str(name).startswith("_") or name in found or name in NOT_ARCHITECTURE_OPTIONS:
                continue
            try:
                found[str(name)] = _normal(model_cfg[name])
            except Exception:  # an omegaconf value that cannot be resolved: not comparable
                continue
    return found


def option_words(name: str, value: Any) -> str:
    """An option and its value as a command line gives it: ``--encoder-attention-heads 4``,
    ``--encoder-normalize-before``, or ``no --encoder-normalize-before`` (off or unset)."""
    option = "--" + name.replace("_", "-")
    if value is True:
        return option
    if value is False or value is None:
        return f"no {option}"
    return f"{option} {value}"


def architecture_mismatch(expected: Mapping[str, Any], found: Mapping[str, Any],
                          expected_name: str, found_name: str) -> str | None:
    """The options whose values differ between two architecture parts, with both values, in
    one sentence; None when they agree. The options of :data:`ARCHITECTURE_OPTIONS` are
    compared always; any other (an extension's) when both parts hold it, so that an option
    added or removed since a checkpoint was written does not refuse it."""
    extra = sorted((expected.keys() & found.keys()) - ARCHITECTURE_OPTIONS.keys())
    names = [name for name in [*ARCHITECTURE_OPTIONS, *extra]
             if expected.get(name) != found.get(name)]
    if not names:
        return None
    theirs = ", ".join(option_words(name, found.get(name)) for name in names)
    ours = ", ".join(option_words(name, expected.get(name)) for name in names)
    return (f"{found_name} was trained with {theirs} but {expected_name} with {ours}: the "
            "same parameters compute another function with these options")


def stored_fingerprint(state: Mapping) -> dict[str, Any] | None:
    """The training fingerprint of a checkpoint's state: the data part it stores (the fields
    :data:`FIELDS`, absent from a checkpoint written before fingerprints were stored, or not
    by fairseq-train) and the architecture part read from its model configuration (under
    :data:`ARCHITECTURE`, absent when it has none); None when it has neither."""
    found: dict[str, Any] = {}
    data = state.get(KEY) if isinstance(state, Mapping) else None
    if isinstance(data, Mapping) and all(isinstance(data.get(f), str) for f in FIELDS):
        found.update({field: data[field] for field in FIELDS})
    stored = data.get(ARCHITECTURE) if isinstance(data, Mapping) else None
    model = model_config(state)
    if isinstance(stored, Mapping):  # an export to another model's layout (module docstring)
        found[ARCHITECTURE] = {str(name): _normal(value) for name, value in stored.items()}
    elif model is not None:
        found[ARCHITECTURE] = architecture(model)
    return found or None


def has_data(found: Mapping | None) -> bool:
    """Whether a fingerprint has its data part (dictionaries and direction)."""
    return found is not None and all(field in found for field in FIELDS)


def data_part(found: Mapping | None) -> dict[str, str] | None:
    """The data part of a fingerprint, as stored in checkpoints under :data:`KEY`; None when it
    has none."""
    return {field: found[field] for field in FIELDS} if has_data(found) else None


def with_architecture(found: Mapping[str, str] | None, model_cfg: Any) -> dict[str, Any]:
    """A fingerprint of a data part (or None) and of the model configuration ``model_cfg`` (a
    run's ``cfg.model``)."""
    return {**(found or {}), ARCHITECTURE: architecture(model_cfg)}


def describe(found: Mapping[str, str]) -> str:
    """The data part of a fingerprint in a few words: ``en->de, dictionaries 1a2b3c4d5e6f /
    1a2b3c4d5e6f``."""
    return (f"{found['source_lang']}->{found['target_lang']}, dictionaries "
            f"{found['source_dictionary'][:12]} / {found['target_dictionary'][:12]}")


def fingerprint_mismatch(expected: Mapping[str, Any], found: Mapping[str, Any],
                         expected_name: str, found_name: str) -> str | None:
    """How ``found`` differs from ``expected`` in one sentence naming both: the direction or a
    dictionary's token order (when both have a data part), else the architecture options that
    differ, with both values (when both have that part); None when what both have agrees."""
    if has_data(expected) and has_data(found) and \
            any(expected[field] != found[field] for field in FIELDS):
        if (found["source_lang"], found["target_lang"]) != \
                (expected["source_lang"], expected["target_lang"]):
            what = "another language direction"
        else:
            what = "other dictionaries (another token order)"
        return (f"{found_name} was trained on {describe(found)} but {expected_name} is "
                f"{describe(expected)}: {what}")
    if ARCHITECTURE in expected and ARCHITECTURE in found:
        return architecture_mismatch(expected[ARCHITECTURE], found[ARCHITECTURE],
                                     expected_name, found_name)
    return None


def dictionary_mismatch(expected: Mapping[str, Any], found: Mapping[str, Any],
                        expected_name: str, found_name: str) -> str | None:
    """Like :func:`fingerprint_mismatch` for the dictionaries of each language only, whatever
    the direction (a model may be asked to translate the other way, which is warned about
    elsewhere): None when every language both name has the same token order, or when either
    has no data part."""
    if not (has_data(expected) and has_data(found)):
        return None
    mine = {expected["source_lang"]: expected["source_dictionary"],
            expected["target_lang"]: expected["target_dictionary"]}
    theirs = {found["source_lang"]: found["source_dictionary"],
              found["target_lang"]: found["target_dictionary"]}
    for lang in sorted(mine.keys() & theirs.keys()):
        if mine[lang] != theirs[lang]:
            return (f"{found_name} was trained on {describe(found)} but {expected_name} is "
                    f"{describe(expected)}: the {lang} dictionary differs (other tokens, or the "
                    "same in another order)")
    return None


def first_mismatch(named: Sequence[tuple[str | os.PathLike, Mapping[str, Any] | None]]
                   ) -> str | None:
    """For checkpoints given as ``(path, fingerprint or None)``: the sentence saying which two
    were trained on different data or with different architecture options, naming both; None
    when what is known agrees (each part is compared between the checkpoints that have it)."""
    for part in ("data", ARCHITECTURE):
        known = [(path, _part(found, part)) for path, found in named
                 if _part(found, part) is not None]
        for path, found in known[1:]:
            mismatch = fingerprint_mismatch(known[0][1], found, str(known[0][0]), str(path))
            if mismatch is not None:
                return mismatch
    return None


def ensemble_mismatch(named: Sequence[tuple[str | os.PathLike, Mapping[str, Any] | None]]
                      ) -> str | None:
    """For checkpoints meant to be used together (an ensemble), given as ``(path, fingerprint
    or None)``: the line refusing them (:func:`first_mismatch`), or None."""
    mismatch = first_mismatch(named)
    return None if mismatch is None else f"these checkpoints cannot be used together: {mismatch}"


def _part(found: Mapping[str, Any] | None, part: str) -> dict[str, Any] | None:
    """One part of a fingerprint (``"data"`` or :data:`ARCHITECTURE`) as a fingerprint of its
    own, or None when it lacks it."""
    if part == "data":
        return data_part(found)
    return None if found is None or ARCHITECTURE not in found else \
        {ARCHITECTURE: found[ARCHITECTURE]}


def missing_note(paths: Iterable[str | os.PathLike]) -> str:
    """The one note line for checkpoints without the data part of a fingerprint."""
    names = ", ".join(str(path) for path in paths)
    return (f"note: {names}: no training fingerprint (written before checkpoints stored "
            "one): its dictionaries and language direction cannot be checked")


def unchecked_note(named: Sequence[tuple[str | os.PathLike, Mapping[str, Any] | None]]
                   ) -> str | None:
    """One note line for the checkpoints (``(path, fingerprint or None)``) whose fingerprint
    lacks a part, saying what cannot be checked; None when every part is there."""
    no_data = [path for path, found in named if not has_data(found)]
    no_architecture = [path for path, found in named if found is None or ARCHITECTURE not in found]
    notes = []
    if no_data:
        notes.append(missing_note(no_data)[len("note: "):])
    if no_architecture:
        names = ", ".join(str(path) for path in no_architecture)
        notes.append(f"{names}: no model configuration: its architecture options cannot be "
                     "checked")
    return "note: " + "; ".join(notes) if notes else None


def parameters_sha256(model: Mapping[str, Any]) -> str:
    """The sha256 (hex) of a model's parameters: every entry's name, type, shape and bytes, in
    name order. Two checkpoints with the same value hold the same parameters, whatever else
    (training state, file name) differs."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(model):
        value = model[name]
        if not isinstance(value, torch.Tensor):
            digest.update(f"{name}\0{value!r}\0".encode("utf-8"))
            continue
        tensor = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}\0{tensor.dtype}\0{list(value.shape)}\0".encode("utf-8"))
        digest.update(tensor.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def distinct_parameters(named: Sequence[tuple[Any, str]]
                        ) -> tuple[list[int], list[tuple[Any, Any]]]:
    """For checkpoints given as ``(path, parameters_sha256)``: the indices of the first of each
    set holding the same parameters, in order, and ``(path, first path)`` for each other
    one."""
    first: dict[str, Any] = {}
    kept, dropped = [], []
    for index, (path, digest) in enumerate(named):
        if digest in first:
            dropped.append((path, first[digest]))
        else:
            first[digest] = path
            kept.append(index)
    return kept, dropped


def duplicate_note(dropped: Sequence[tuple[Any, Any]], kept: int) -> str:
    """The one note line for checkpoints dropped as copies of others (``(path, same as)``);
    ``kept`` is how many distinct checkpoints remain."""
    copies = "; ".join(f"{path} holds the same parameters as {same}" for path, same in dropped)
    return (f"note: {copies}: each set of identical checkpoints is used once ({kept} "
            "distinct checkpoint(s))")
