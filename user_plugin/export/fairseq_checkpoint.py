"""Export one of our checkpoints as a checkpoint of fairseq's own ``transformer`` architecture.

The written file is what stock fairseq itself writes for its ``transformer``, so that every
tool that reads stock checkpoints reads it the same way (``fairseq-generate``,
``TransformerModel.from_pretrained``, CTranslate2's ``ct2-fairseq-converter``), without
``--user-dir``:

* ``cfg.model`` is an ``argparse.Namespace``, as fairseq 0.12 stores the options of its legacy
  models: the built-in's model options with ``_name`` and ``arch`` ``transformer``, ``task``
  ``translation`` and the task's options. fairseq's ``build_model`` finds the legacy model by
  that name and builds it; CTranslate2's converter sets its ``data`` and sets up the task from
  it. Like every checkpoint stock fairseq writes, it needs ``argparse.Namespace`` allowed by
  torch's ``weights_only`` loading (torch >= 2.6): ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` for
  stock fairseq, ``--unsafe_deserialization`` or ``--user_dir`` of ours (an allow-list) for the
  converter. Everything else in ``cfg`` is plain containers;
* every other section names only stock components: the task is ``translation`` (ours adds only
  decoding settings), our label-smoothed criterion becomes fairseq's
  ``label_smoothed_cross_entropy`` (the same loss), our LR scheduler and the plugin directory are
  dropped, and the generation defaults are the paper's beam 4 and alpha 0.6 (in fairseq's
  ``|Y|^alpha`` form, the only one stock fairseq has);
* the weights go through the parameter mapping of :mod:`user_plugin.artifacts.builtin_transformer`.

Positions (§3.5): our sinusoids interleave sine and cosine channels, fairseq's concatenate the
two halves with another frequency step, so the exported model uses *learned* positions
(``encoder_learned_pos``/``decoder_learned_pos``) holding our table exactly, from row
``padding_idx + 1`` on, where fairseq's positions start. Rows before it are zero. A model
trained with learned positions (Table 3 row E) keeps its own table.

What the built-in cannot express is refused with one line naming the reason and nothing is
written: d_k or d_v other than d_model / h (Table 3 row B), and any model other than
``vaswani_transformer`` itself (an extension's blocks, e.g. from ``--user-dir``), or a
parameter without a counterpart in the built-in.

The file is written atomically and verified before it is moved into place: reloaded under safe
loading, checked to hold plain containers and tensors only, built by fairseq's own loader as a
stock ``transformer`` and run on a test batch beside our model.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..artifacts.builtin_transformer import (
    BUILTIN_MODEL,
    builtin_options,
    to_builtin_transformer,
)
from ..artifacts.checkpoints import torch_save
from ..artifacts.errors import ArtifactError
from ..artifacts.fingerprint import ARCHITECTURE, architecture
from ..artifacts.fingerprint import KEY as FINGERPRINT_KEY
from ..artifacts.our_model import load_our_model, probe_batch
from ..files.atomic import atomic_write
from ..paper import BEAM, LENPEN, MAX_LEN_OVER_SOURCE

#: Our criteria -> the stock criterion that computes the same loss.
STOCK_CRITERIA = {"vaswani_label_smoothed_cross_entropy": "label_smoothed_cross_entropy"}

#: Largest difference allowed between our model's and the exported model's log-probabilities
#: in the verification run (both float32; the computations differ only in summation order).
VERIFY_TOLERANCE = 1e-4


# -- the checkpoint's contents -----------------------------------------------------------------


def _stock_fields(dataclass_type, values: dict) -> dict:
    """The entries of ``values`` that are fields of the stock config ``dataclass_type``."""
    names = {field.name for field in dataclasses.fields(dataclass_type)}
    return {key: value for key, value in values.items() if key in names}


def exported_config(cfg: Any, model_cfg: Any, data_dir: Path) -> dict:
    """Our checkpoint's configuration with every section naming stock components only (see
    the module docstring), as plain containers."""
    from fairseq.tasks.translation import TranslationConfig
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    model = dict(vars(builtin_options(model_cfg)))
    model.update(_name=BUILTIN_MODEL, arch=BUILTIN_MODEL)
    task = _stock_fields(TranslationConfig, plain.get("task") or {})
    task.update(_name="translation", data=str(data_dir), eval_bleu=False)
    plain["task"] = task
    # the legacy model's Namespace holds the task's options too, as fairseq's does; the
    # model's win where both have one (the position limits)
    task_options = {key: value for key, value in task.items() if key != "_name"}
    plain["model"] = argparse.Namespace(**{**task_options, "task": "translation", **model})
    criterion = plain.get("criterion") or {}
    stock = STOCK_CRITERIA.get(criterion.get("_name"))
    if stock is not None:
        from fairseq.criterions.label_smoothed_cross_entropy import (
            LabelSmoothedCrossEntropyCriterionConfig,
        )

        plain["criterion"] = {
            **_stock_fields(LabelSmoothedCrossEntropyCriterionConfig, criterion),
            "_name": stock,
        }
    elif criterion.get("_name", "").startswith("vaswani_"):
        plain["criterion"] = None
    scheduler = plain.get("lr_scheduler") or {}
    if scheduler.get("_name", "").startswith("vaswani_"):
        plain["lr_scheduler"] = None
    if plain.get("common"):
        plain["common"]["user_dir"] = None
    if plain.get("generation"):
        plain["generation"].update(beam=BEAM, lenpen=LENPEN, max_len_a=1,
                                   max_len_b=MAX_LEN_OVER_SOURCE)
    return plain


def exported_state(state: dict, ours: nn.Module, theirs: nn.Module, data_dir: Path) -> dict:
    """The checkpoint fairseq's loader reads: configuration, weights, and the training
    history fields its upgrade step expects (without optimizer state)."""
    history = (state.get("optimizer_history") or [{}])[-1]
    extra = state.get("extra_state") or {}
    return {
        "args": None,
        "cfg": exported_config(state["cfg"], ours.cfg, data_dir),
        "model": {name: tensor.detach().clone() for name, tensor in
                  theirs.state_dict().items()},
        "optimizer_history": [{
            "criterion_name": "LabelSmoothedCrossEntropyCriterion",
            "optimizer_name": str(history.get("optimizer_name", "")),
            "lr_scheduler_state": {},
            "num_updates": int(history.get("num_updates", 0)),
        }],
        "extra_state": {
            "train_iterator": {"epoch": int((extra.get("train_iterator") or {}).get("epoch", 1))},
        },
        # the data part of the training fingerprint, and the architecture of our model: this
        # configuration describes fairseq's layout of the same function (learned positions
        # holding our sinusoids), which ensembles with ours must not take for another one
        FINGERPRINT_KEY: {**dict(state.get(FINGERPRINT_KEY) or {}),
                          ARCHITECTURE: architecture(ours.cfg)},
    }


PLAIN_TYPES = (str, int, float, bool, type(None))


def stock_layout_problem(state: dict) -> str | None:
    """What keeps ``state`` from being a checkpoint as stock fairseq writes it: ``cfg.model``
    an ``argparse.Namespace`` of plain values, every other entry a plain container, scalar or
    tensor (:func:`non_plain_entry`); None when it is one."""
    cfg = state.get("cfg")
    model = cfg.get("model") if isinstance(cfg, dict) else None
    if type(model) is not argparse.Namespace:
        return f"checkpoint.cfg.model: {type(model).__name__}, not an argparse.Namespace"
    return non_plain_entry({**state, "cfg": {**cfg, "model": vars(model)}})


def non_plain_entry(value: Any, where: str = "checkpoint") -> str | None:
    """The first entry of ``value`` that is neither a plain container (dict with string keys,
    list, tuple), a plain scalar nor a tensor, as ``where.key: type``; None when all are."""
    if isinstance(value, torch.Tensor) or type(value) in PLAIN_TYPES:
        return None
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"{where}: key {key!r} of type {type(key).__name__}"
            found = non_plain_entry(item, f"{where}.{key}")
            if found:
                return found
        return None
    if type(value) in (list, tuple):
        for index, item in enumerate(value):
            found = non_plain_entry(item, f"{where}[{index}]")
            if found:
                return found
        return None
    return f"{where}: {type(value).__module__}.{type(value).__qualname__}"


# -- verification ----------------------------------------------------------------------------


def max_difference(ours: nn.Module, theirs: nn.Module, task: Any) -> float:
    """Largest difference of the next-token log-probabilities of the two models on
    :func:`probe_batch` (target dictionary for the decoder input, source for the encoder)."""
    src, lengths, _ = probe_batch(task.source_dictionary)
    _, _, prev = probe_batch(task.target_dictionary)
    with torch.no_grad():
        ours_lp = torch.log_softmax(ours(src, lengths, prev)[0].float(), dim=-1)
        their_lp = torch.log_softmax(theirs(src, lengths, prev)[0].float(), dim=-1)
    return float((ours_lp - their_lp).abs().max())


def verify_export(path: Path, ours: nn.Module, task: Any) -> None:
    """Reload the written file as stock fairseq does and check it: safe loading (``Namespace``
    allowed, as the plugin allows it), stock fairseq's layout, fairseq's loader builds a
    ``transformer`` from it alone, and that model gives our log-probabilities
    (:data:`VERIFY_TOLERANCE`)."""
    from fairseq import checkpoint_utils
    from fairseq.models.transformer import TransformerModel

    state = torch.load(path, map_location="cpu", weights_only=True)
    found = stock_layout_problem(state)
    if found:
        raise ArtifactError(f"{path}: not laid out as stock fairseq's checkpoints ({found})")
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    theirs = models[0].eval()
    if type(theirs) is not TransformerModel:
        raise ArtifactError(f"{path}: fairseq built {type(theirs).__name__}, not its transformer")
    difference = max_difference(ours, theirs, task)
    if not difference <= VERIFY_TOLERANCE:
        raise ArtifactError(f"{path}: the exported model's log-probabilities differ from ours by "
                          f"{difference:.2e} (more than {VERIFY_TOLERANCE})")


def export_fairseq_checkpoint(checkpoint: str | os.PathLike, data_dir: str | os.PathLike,
                              output: str | os.PathLike, source_lang: str | None = None,
                              target_lang: str | None = None) -> Path:
    """Write ``output``: the checkpoint of fairseq's built-in ``transformer`` equivalent to
    our ``checkpoint`` (the dictionaries in ``data_dir``). Atomic and verified; raises
    :class:`ArtifactError` (or another one-line error) with nothing written."""
    data_dir, output = Path(data_dir), Path(output)
    ours, task, state = load_our_model(checkpoint, data_dir, source_lang, target_lang)
    theirs = to_builtin_transformer(ours, task)
    exported = exported_state(state, ours, theirs, data_dir.resolve())
    found = stock_layout_problem(exported)
    if found:
        raise ArtifactError(f"{checkpoint}: cannot store {found} in a stock checkpoint")

    def write(temp: str) -> None:
        torch_save(exported, temp)  # a full disk: one line, not torch's RuntimeError
        verify_export(Path(temp), ours, task)

    atomic_write(output, write)
    return output
