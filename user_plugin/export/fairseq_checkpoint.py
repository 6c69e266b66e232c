"""Export one of our checkpoints as a checkpoint of fairseq's own ``transformer`` architecture.

The written file is what stock fairseq reads without ``--user-dir``, under torch's
``weights_only`` safe loading:

* ``cfg`` holds plain containers only (fairseq's loader turns it into an omegaconf config); an
  ``argparse.Namespace`` (what fairseq's legacy ``transformer`` would store) is refused by
  safe loading. ``cfg.model`` is the built-in's flat option dictionary with ``_name`` and
  ``arch`` ``transformer``: fairseq's ``build_model`` finds the legacy model by that name,
  applies its ``base_architecture`` to the dictionary and builds it;
* every other section names only stock components: the task is ``translation`` (ours adds only
  decoding settings), our label-smoothed criterion becomes fairseq's
  ``label_smoothed_cross_entropy`` (the same loss), our LR scheduler and the plugin directory are
  dropped, and the generation defaults are the paper's beam 4 and alpha 0.6 (in fairseq's
  ``|Y|^alpha`` form, the only one stock fairseq has);
* the weights go through the parameter mapping of :mod:`user_plugin.builtin_transformer`.

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

from ..artifacts.errors import ArtifactError
from ..builtin_transformer import (
    EXTRA_SHARED_OPTIONS,
    SHARED_OPTIONS,
    build_fairseq_transformer,
    copy_our_weights_into_fairseq,
    fairseq_name,
)
from ..files.atomic import atomic_write
from ..files.checkpoints import torch_save
from ..files.fingerprint import ARCHITECTURE, architecture
from ..files.fingerprint import KEY as FINGERPRINT_KEY
from ..models.transformer_config import UNSUPPORTED_OPTIONS
from ..paper import BEAM, LENPEN, MAX_LEN_OVER_SOURCE

#: The model name and architecture of fairseq's built-in Transformer.
BUILTIN_MODEL = "transformer"
#: Our model's registered name; extensions register others.
OUR_MODEL = "vaswani_transformer"

#: Options of fairseq's ``transformer`` that act only while training (LayerDrop, activation
#: checkpointing, FSDP wrapping, Quant-Noise); the export carries them as they are.
TRAINING_OPTIONS = (
    "encoder_layerdrop", "decoder_layerdrop", "checkpoint_activations", "offload_activations",
    "min_params_to_wrap", "export", "quant_noise_pq", "quant_noise_pq_block_size",
    "quant_noise_scalar",
)

#: How each option of our model configuration reaches fairseq's ``transformer``: ``same`` (same
#: name, same meaning), ``learned table`` (the positions become a learned table holding ours),
#: ``d_model / heads only`` (the built-in has no such option; only its fixed value exports),
#: ``applied`` (the export holds the kept layers only), ``dropped`` (initialization only: the
#: weights are in the checkpoint), ``default`` (our model refuses any other value) or ``not
#: exported`` (how alignments are read at decoding time: the built-in always aligns with its
#: last layer's heads, fairseq's defaults).
OPTION_MAPPING: dict[str, str] = {
    **{name: "same" for name in (*SHARED_OPTIONS, *EXTRA_SHARED_OPTIONS, *TRAINING_OPTIONS,
                                 "activation_fn")},
    **{name: "default" for name in UNSUPPORTED_OPTIONS},
    "encoder_learned_pos": "learned table",
    "decoder_learned_pos": "learned table",
    "attention_key_dim": "d_model / heads only",
    "attention_value_dim": "d_model / heads only",
    "encoder_layers_to_keep": "applied",
    "decoder_layers_to_keep": "applied",
    "encoder_embed_path": "dropped",
    "decoder_embed_path": "dropped",
    "alignment_layer": "not exported",
    "alignment_heads": "not exported",
    "full_context_alignment": "not exported",
    "compile_layers": "not exported",
}

#: Our criteria -> the stock criterion that computes the same loss.
STOCK_CRITERIA = {"vaswani_label_smoothed_cross_entropy": "label_smoothed_cross_entropy"}

#: Largest difference allowed between our model's and the exported model's log-probabilities
#: in the verification run (both float32; the computations differ only in summation order).
VERIFY_TOLERANCE = 1e-4


# -- reading our model ---------------------------------------------------------------------


def our_model_name(model_cfg: Any) -> str | None:
    """The registered model behind a checkpoint's ``cfg.model`` (its ``_name`` is the
    architecture, e.g. ``vaswani_base``), or None when no loaded plugin registers it."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY

    name = model_cfg.get("_name") or model_cfg.get("arch")
    if name in ARCH_MODEL_NAME_REGISTRY:
        return ARCH_MODEL_NAME_REGISTRY[name]
    return name if name in MODEL_REGISTRY else None


def load_our_model(checkpoint: str | os.PathLike, data_dir: str | os.PathLike,
                   source_lang: str | None = None, target_lang: str | None = None,
                   ) -> tuple[nn.Module, Any, Any]:
    """Our model of ``checkpoint`` (eval mode, CPU), its task on ``data_dir`` and the
    checkpoint's state; an :class:`ArtifactError` for a model that is not ours."""
    from .. import registration  # noqa: F401  (our model, task and safe loading)
    from ..artifacts.checkpoints import build_models, read_model_checkpoint, setup_task
    from ..artifacts.model_files import language_pair

    checkpoint, data_dir = Path(checkpoint), Path(data_dir)
    if not data_dir.is_dir():
        raise ArtifactError(f"{data_dir}: no such directory (the data directory of the "
                          "dictionaries, as given to fairseq-generate)")
    state = read_model_checkpoint(checkpoint)
    model_cfg = state["cfg"].model
    name = our_model_name(model_cfg)
    if name != OUR_MODEL:
        arch = model_cfg.get("_name") or model_cfg.get("arch")
        raise ArtifactError(
            f"{checkpoint}: model {name or arch!r} is not {OUR_MODEL}: fairseq's built-in "
            "transformer cannot express an extension's blocks"
        )
    src, tgt = language_pair(data_dir, source_lang, target_lang, state["cfg"].task)
    task = setup_task(state["cfg"].task, data_dir, src, tgt, "gnmt", MAX_LEN_OVER_SOURCE)
    (model,) = build_models(task, [checkpoint], [state], "cpu")
    return model, task, state


# -- what the built-in can express -----------------------------------------------------------


def refusal(model: nn.Module) -> str | None:
    """Why fairseq's ``transformer`` cannot hold ``model`` exactly, or None when it can."""
    from ..models.transformer_config import SIDES, StackConfig
    from ..models.vaswani_transformer import VaswaniTransformerModel

    if type(model) is not VaswaniTransformerModel:
        return (f"model class {type(model).__name__} is an extension of {OUR_MODEL}: "
                "fairseq's built-in transformer cannot express its blocks")
    for side in SIDES:
        stack = StackConfig.of(model.cfg, side)
        per_head = stack.embed_dim // stack.attention_heads
        for what, value, option in (("d_k", stack.key_dim, "--attention-key-dim"),
                                    ("d_v", stack.value_dim, "--attention-value-dim")):
            if value is not None and (value != per_head
                                      or stack.embed_dim % stack.attention_heads):
                return (f"{what} = {value} per head in the {side} ({option}; Table 3 row B), "
                        f"but fairseq's built-in transformer has {what} = d_model / heads = "
                        f"{stack.embed_dim}/{stack.attention_heads}")
    return None


def builtin_options(cfg: Any) -> argparse.Namespace:
    """The complete option namespace of fairseq's ``transformer`` for our configuration
    ``cfg`` (see :data:`OPTION_MAPPING`): learned positions on both sides (they hold our
    table), the layer counts after ``--*-layers-to-keep`` with nothing left to prune, no
    pre-trained embedding files, every other option at the built-in's default
    (``base_architecture``)."""
    from fairseq.models.transformer import base_architecture

    options = argparse.Namespace(**{name: getattr(cfg, name) for name in SHARED_OPTIONS})
    for name in (*EXTRA_SHARED_OPTIONS, *TRAINING_OPTIONS):
        value = getattr(cfg, name, None)
        if value is not None:
            setattr(options, name, value)
    options.activation_fn = str(cfg.activation_fn)
    options.encoder_learned_pos = options.decoder_learned_pos = True
    options.encoder_layers_to_keep = options.decoder_layers_to_keep = None
    options.encoder_embed_path = options.decoder_embed_path = None
    base_architecture(options)
    return options


def copy_positions(ours: nn.Module, theirs: nn.Module) -> None:
    """Write our positional table (sinusoids or learned) into the built-in's learned table at
    rows ``padding_idx + 1`` on; the rows before are zero (the padding row must be)."""
    from ..modules.positional_encoding import SinusoidalPositionalEncoding

    for side in ("encoder", "decoder"):
        our_positions = getattr(ours, side).embed_positions
        if our_positions is None:  # --no-token-positional-embeddings: neither has a table
            continue
        target = getattr(theirs, side).embed_positions.weight
        offset = getattr(theirs, side).padding_idx + 1
        if isinstance(our_positions, SinusoidalPositionalEncoding):
            table = our_positions.table
        else:
            table = our_positions.weight
        with torch.no_grad():
            target.zero_()
            target[offset: offset + table.size(0)] = table


def check_parameters_covered(ours: nn.Module, theirs: nn.Module) -> None:
    """Every parameter of ours has a counterpart of the same shape in the built-in and every
    parameter of the built-in is one of ours (or a positional table): otherwise the model has
    blocks the built-in cannot express."""
    their_state = theirs.state_dict()
    mapped = set()
    for name, tensor in ours.state_dict().items():
        target = fairseq_name(name)
        if target not in their_state or (
            not name.endswith("embed_positions.weight")
            and their_state[target].shape != tensor.shape
        ):
            raise ArtifactError(f"parameter {name} {tuple(tensor.shape)} has no counterpart in "
                              "fairseq's built-in transformer")
        mapped.add(target)
    for name, _ in theirs.named_parameters(remove_duplicate=False):
        if name not in mapped and not name.endswith("embed_positions.weight"):
            raise ArtifactError(f"fairseq's built-in transformer has parameter {name}, which "
                              "the model does not: it is not the paper's architecture")


def to_builtin_transformer(ours: nn.Module, task: Any) -> nn.Module:
    """fairseq's ``transformer`` computing the same function as ``ours`` (eval mode); an
    :class:`ArtifactError` when it cannot (:func:`refusal`)."""
    reason = refusal(ours)
    if reason is not None:
        raise ArtifactError(reason)
    theirs = build_fairseq_transformer(ours, task, builtin_options(ours.cfg))
    check_parameters_covered(ours, theirs)
    copy_our_weights_into_fairseq(ours, theirs)
    copy_positions(ours, theirs)
    return theirs.eval()


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
    plain["model"] = model
    task = _stock_fields(TranslationConfig, plain.get("task") or {})
    task.update(_name="translation", data=str(data_dir), eval_bleu=False)
    plain["task"] = task
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


def probe_batch(dictionary, length: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A small batch of real (non-special) tokens of ``dictionary``: two sources (one
    left-padded) and their teacher-forced decoder inputs."""
    first = dictionary.nspecial
    symbols = torch.arange(first, min(len(dictionary), first + 2 * length))
    symbols = symbols.repeat(2 * length // max(symbols.numel(), 1) + 1)[: 2 * length]
    pad, eos = dictionary.pad(), dictionary.eos()
    src = torch.full((2, length + 1), pad, dtype=torch.long)
    src[0, :length], src[0, length] = symbols[:length], eos
    src[1, 3:length], src[1, length] = symbols[length: 2 * length - 3], eos
    lengths = src.ne(pad).sum(dim=1)
    prev = torch.cat([torch.full((2, 1), eos), symbols[length:].view(1, -1).repeat(2, 1)], 1)
    return src, lengths, prev


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
    """Reload the written file as stock fairseq does and check it: safe loading, plain
    containers only, fairseq's loader builds a ``transformer`` from it alone, and that model
    gives our log-probabilities (:data:`VERIFY_TOLERANCE`)."""
    from fairseq import checkpoint_utils
    from fairseq.models.transformer import TransformerModel

    state = torch.load(path, map_location="cpu", weights_only=True)
    found = non_plain_entry(state)
    if found:
        raise ArtifactError(f"{path}: export holds a non-plain entry ({found})")
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
    found = non_plain_entry(exported)
    if found:
        raise ArtifactError(f"{checkpoint}: cannot store {found} in a safely loadable checkpoint")

    def write(temp: str) -> None:
        torch_save(exported, temp)  # a full disk: one line, not torch's RuntimeError
        verify_export(Path(temp), ours, task)

    atomic_write(output, write)
    return output
