"""Cutting a stack down to some of its layers (``--{encoder,decoder}-layers-to-keep``).

A model trained with LayerDrop (Fan et al. 2019, ``--*-layerdrop``) is robust to losing whole
layers, so a smaller model can be cut from its checkpoint: fairseq-generate with
``--model-overrides "{'decoder_layers_to_keep': '0,2,4'}"``, or fairseq-train
``--finetune-from-model`` with ``--decoder-layers-to-keep 0,2,4`` to train on. The model is
built with as many layers as are kept (:func:`prune_to_kept_layers`), and fairseq's
``prune_state_dict``, which ``load_state_dict`` runs, renumbers the kept layers of the
checkpoint (``decoder.layers.4.*`` -> ``decoder.layers.2.*``) and drops the others.
"""

import contextlib
from typing import List, Optional

from omegaconf import OmegaConf, open_dict

from ..files.errors import InvalidValue
from .transformer_config import SIDES


def layers_to_keep(value, layers: int, option: str) -> Optional[List[int]]:
    """The layer indices of ``--{side}-layers-to-keep`` ("0,2,4" or a list), checked against
    the ``layers`` the stack has; None when the option is not set."""
    if value is None or value == "" or value == []:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        kept = [int(str(item).strip()) for item in items]
    except ValueError:
        raise InvalidValue(
            f"vaswani_transformer: {option} takes comma-separated layer numbers, got {value!r}"
        ) from None
    if len(set(kept)) != len(kept) or not all(0 <= i < layers for i in kept):
        raise InvalidValue(
            f"vaswani_transformer: {option} {value!r} must name distinct layers among the "
            f"{layers} of the stack (0 to {layers - 1})"
        )
    return sorted(kept)


def prune_to_kept_layers(cfg) -> None:
    """Apply ``--{side}-layers-to-keep``: the stack is built with that many layers, and
    fairseq's ``prune_state_dict`` maps the kept layers of a loaded checkpoint onto them (the
    option is normalised to the "0,2,4" form that function reads)."""
    for side in SIDES:
        name = f"{side}_layers_to_keep"
        kept = layers_to_keep(getattr(cfg, name), getattr(cfg, f"{side}_layers"),
                              f"--{side}-layers-to-keep")
        if kept is not None:
            setattr(cfg, name, ",".join(map(str, kept)))
            setattr(cfg, f"{side}_layers", len(kept))


def keep_whole_or_pruned_sides(state_dict, model_cfg) -> None:
    """Adjust ``model_cfg``'s ``*_layers_to_keep`` to ``state_dict`` before fairseq prunes it:
    None for a side whose checkpoint already has exactly the kept number of layers, every
    layer ("0,1,...") for a side without the option while the other side has it."""
    stored = {side: _stored_layers(state_dict, side) for side in SIDES}
    kept = {side: getattr(model_cfg, f"{side}_layers_to_keep", None) for side in SIDES}
    for side in SIDES:
        if kept[side] and len(str(kept[side]).split(",")) == stored[side]:
            kept[side] = None
    if any(kept.values()):
        for side in SIDES:
            if not kept[side]:
                kept[side] = ",".join(str(i) for i in range(stored[side]))
    context = open_dict(model_cfg) if OmegaConf.is_config(model_cfg) else contextlib.nullcontext()
    with context:
        for side in SIDES:
            if hasattr(model_cfg, f"{side}_layers_to_keep"):
                setattr(model_cfg, f"{side}_layers_to_keep", kept[side] or None)


def _stored_layers(state_dict, side: str) -> int:
    """How many layers of the ``side`` stack ``state_dict`` holds (``<side>.layers.<i>.``)."""
    prefix = f"{side}.layers."
    indices = {key[len(prefix):].split(".", 1)[0] for key in state_dict if key.startswith(prefix)}
    return len(indices)
