"""Resuming a checkpoint whose optimizer state another precision mode wrote: the plugin's runs
convert it to the layout of the optimizer they build, instead of refusing.

fairseq resumes an optimizer state only under the optimizer class that wrote it
(``Trainer.load_checkpoint`` asserts the class names: ``AssertionError: Optimizer does not
match; please reset the optimizer (--reset-optimizer). FairseqAdam vs
Float32MasterOptimizer``). The precision options of a plugin run choose that class, and the
state comes in two layouts for the same trainer parameters (the model's, then the
criterion's, those that require gradients, in that order):

* **per tensor**: one state per parameter tensor (Adam's ``exp_avg`` and ``exp_avg_sq`` shaped
  like it, its ``step``), written by the plain ``--optimizer`` (float32, ``--bf16 --amp``,
  and the plugin's ``--bf16`` before float32 masters), fairseq's
  ``MemoryEfficientFP16Optimizer`` (plus ``loss_scale``) and ``AMPOptimizer``, fairseq's
  ``FP16Optimizer`` with ``--fp16-no-flatten-grads``;
* **flat**: one state over a single float32 tensor, the parameters' masters end to end in that
  order, written by fairseq's ``FP16Optimizer`` (``--fp16`` before float32 masters; plus
  ``loss_scale``) and :class:`~.float32_masters.Float32MasterOptimizer` (plus ``loss_scale``
  and the scaler's counters under ``--fp16``).

A per-tensor state becomes a flat one by concatenating each tensor's moments (a tensor that
has no state yet, never updated, gets zeros) under the common update count (the largest, if
tensors differ); a flat one becomes per-tensor by cutting the moments back into the
parameters' shapes, each with the update count. The loss scale and the scaler's counters are
kept for the optimizer that reads them. The moments, the update count, the loss scale and the
learning-rate schedule (which fairseq keeps apart from the optimizer state) thus continue
where the checkpoint left them; the model's weights are the checkpoint's as always (float32,
or float16 for ``FP16Optimizer``, which never saved its masters).

What cannot be converted is one error line naming the cause and the way out: a state of
another ``--optimizer`` (the inner optimizer of a precision wrapper is not recorded, so there
only the tensors' sizes are checked), several parameter groups, a state whose tensors do not
match the model's parameters, an optimizer the plugin does not know how to lay out (BMUF,
sharded states).

How it reaches fairseq: row ``optimizer_state_layouts`` of :mod:`user_plugin.fairseq_patches`
(:mod:`user_plugin.fairseq_patches.optimizer_state`) wraps ``Trainer.load_checkpoint`` and
converts with :func:`convert_state`.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq import optim

from ..files.errors import UserError

#: The optimizers that wrap an inner ``--optimizer`` for a precision mode, by class name (the
#: name a checkpoint's optimizer history records).
PRECISION_WRAPPERS = ("FP16Optimizer", "MemoryEfficientFP16Optimizer", "AMPOptimizer",
                      "Float32MasterOptimizer")
#: The layouts of an optimizer state (module description).
PER_TENSOR, FLAT = "one state per parameter tensor", "one flat float32 tensor"
#: Keys of a state dict beside the inner optimizer's, kept as they are.
SCALER_KEYS = ("loss_scale", "loss_scaler_counters")


class LayoutError(UserError):
    """An optimizer state that cannot be converted to the layout a run needs."""


class OtherOptimizerError(LayoutError):
    """An optimizer state of another ``--optimizer`` than the run's."""


def optimizer_option(class_name: str) -> str:
    """``--optimizer NAME`` of a fairseq optimizer class name (``FairseqAdam``: ``--optimizer
    adam``), or the class name when no registered optimizer has it."""
    names = [name for name, cls in optim.OPTIMIZER_REGISTRY.items()
             if getattr(cls, "__name__", None) == class_name]
    return f"--optimizer {names[0]}" if names else class_name


def trainer_parameters(trainer: Any) -> List[torch.nn.Parameter]:
    """The parameters fairseq's trainer hands its optimizer, in its order: the model's, then
    the criterion's, those that require gradients."""
    return [p for p in chain(trainer.model.parameters(), trainer.criterion.parameters())
            if p.requires_grad]


def inner_optimizer_name(optimizer: Any) -> str:
    """The class name of the ``--optimizer`` inside ``optimizer``'s precision wrappers (its own
    class name when it wraps none)."""
    for attribute in ("fp32_optimizer", "wrapped_optimizer"):
        inner = getattr(optimizer, attribute, None)
        if isinstance(inner, optim.FairseqOptimizer):
            return inner_optimizer_name(inner)
    return type(optimizer).__name__


def layout_of(optimizer: Any, shapes: Sequence[torch.Size]) -> Optional[str]:
    """:data:`FLAT` or :data:`PER_TENSOR` for the tensors ``optimizer``'s torch optimizer updates,
    given the trainer's parameter shapes; None for anything else."""
    try:
        updated = [p for group in optimizer.optimizer.param_groups for p in group["params"]]
    except (AttributeError, KeyError, TypeError, NotImplementedError):
        return None
    if len(updated) == len(shapes) and all(p.shape == s for p, s in zip(updated, shapes)):
        return PER_TENSOR
    total = sum(s.numel() for s in shapes)
    if len(updated) == 1 and updated[0].dim() == 1 and updated[0].numel() == total:
        return FLAT
    return None


def _saved_layout(state_dict: Dict[str, Any], shapes: Sequence[torch.Size]) -> str:
    """The layout of a saved state, or :class:`LayoutError` saying how it differs from the
    trainer's parameters ``shapes``."""
    groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
    if not isinstance(groups, list) or not isinstance(state_dict.get("state"), dict):
        raise LayoutError("it is not a torch optimizer's state (no param_groups and state)")
    if len(groups) != 1:
        raise LayoutError(f"it has {len(groups)} parameter groups, the plugin converts one")
    ids = list(groups[0]["params"])
    total = sum(s.numel() for s in shapes)
    if len(ids) == len(shapes):
        for i, shape in zip(ids, shapes):
            for key, value in state_dict["state"].get(i, {}).items():
                if key != "step" and torch.is_tensor(value) and value.numel() != shape.numel():
                    raise LayoutError(f"its tensor {i} holds {value.numel()} values of "
                                      f"{key}, this model's parameter {i} {shape.numel()}")
        return PER_TENSOR
    if len(ids) == 1:
        for key, value in state_dict["state"].get(ids[0], {}).items():
            if key != "step" and torch.is_tensor(value) and value.numel() != total:
                raise LayoutError(f"its flat {key} holds {value.numel()} values, this model's "
                                  f"{len(shapes)} parameter tensors {total}")
        return FLAT
    raise LayoutError(f"it holds state for {len(ids)} tensors, this model has {len(shapes)} "
                      "parameter tensors")


def _carried(state_dict: Dict[str, Any], group: Dict[str, Any], state: Dict[int, Any]
             ) -> Dict[str, Any]:
    kept = {key: state_dict[key] for key in SCALER_KEYS if key in state_dict}
    return {"state": state, "param_groups": [group], **kept}


def per_tensor_to_flat(state_dict: Dict[str, Any], shapes: Sequence[torch.Size]
                       ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """A per-tensor optimizer state as one state over the flat concatenation of the tensors
    (module description), and what was carried over (``step``, ``fewer_updates``: how many
    tensors had taken fewer updates than the largest count)."""
    group = state_dict["param_groups"][0]
    entries = [state_dict["state"].get(i) or {} for i in group["params"]]
    present = [entry for entry in entries if entry]
    flat_group = {**group, "params": [0]}
    if not present:
        return _carried(state_dict, flat_group, {}), {"step": 0, "fewer_updates": 0}
    steps = [float(entry["step"]) for entry in present if "step" in entry]
    largest = max(steps) if steps else None
    flat: Dict[str, Any] = {}
    for key in dict.fromkeys(k for entry in present for k in entry):
        if key == "step":
            step = next(e["step"] for e in present if "step" in e and float(e["step"]) == largest)
            flat[key] = step.clone() if torch.is_tensor(step) else step
            continue
        values = [entry.get(key) for entry in entries]
        moment = next(v for v in values if v is not None)
        if torch.is_tensor(moment) and moment.is_floating_point():
            flat[key] = torch.cat([
                (torch.zeros(shape.numel(), dtype=moment.dtype) if v is None
                 else v.reshape(-1).to(moment.dtype))
                for v, shape in zip(values, shapes)])
        elif all(v is None or (v == moment if not torch.is_tensor(v) else torch.equal(v, moment))
                 for v in values):
            flat[key] = moment
        else:
            raise LayoutError(f"its per-tensor {key!r} differs between tensors and is not a "
                              "tensor of the parameter's size")
    fewer = len(entries) - sum(1 for entry in entries if "step" in entry
                               and float(entry["step"]) == largest)
    return _carried(state_dict, flat_group, {0: flat}), \
        {"step": largest or 0, "fewer_updates": fewer if largest is not None else 0}


def flat_to_per_tensor(state_dict: Dict[str, Any], shapes: Sequence[torch.Size]
                       ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """A flat optimizer state cut into one state per parameter tensor (module description),
    and what was carried over (``step``)."""
    group = state_dict["param_groups"][0]
    entry = state_dict["state"].get(group["params"][0]) or {}
    total = sum(s.numel() for s in shapes)
    per_tensor: Dict[int, Dict[str, Any]] = {}
    if entry:
        offsets = [0]
        for shape in shapes:
            offsets.append(offsets[-1] + shape.numel())
        for i, shape in enumerate(shapes):
            part = {}
            for key, value in entry.items():
                if key != "step" and torch.is_tensor(value) and value.numel() == total:
                    part[key] = value.reshape(-1)[offsets[i]:offsets[i + 1]].reshape(shape) \
                        .clone()
                else:
                    part[key] = value.clone() if torch.is_tensor(value) else value
            per_tensor[i] = part
    step = float(entry["step"]) if "step" in entry else 0
    return _carried(state_dict, {**group, "params": list(range(len(shapes)))}, per_tensor), \
        {"step": step, "fewer_updates": 0}


def convert_state(state_dict: Dict[str, Any], source: str, optimizer: Any,
                  params: Sequence[torch.Tensor]) -> Tuple[Dict[str, Any], str]:
    """The optimizer state ``state_dict`` written by the optimizer class ``source``, laid out
    for ``optimizer`` over the trainer's parameters ``params``; and a description of what was
    carried over. :class:`LayoutError` when it cannot be (module description)."""
    target = type(optimizer).__name__
    inner = inner_optimizer_name(optimizer)
    if source not in PRECISION_WRAPPERS and source != inner:
        raise OtherOptimizerError(f"it is the state of {optimizer_option(source)}, this run "
                                  f"has {optimizer_option(inner)}")
    shapes = [p.shape for p in params]
    wanted = layout_of(optimizer, shapes)
    if wanted is None:
        raise LayoutError(f"this run's optimizer {target} keeps its state in a layout the "
                          "plugin does not convert to")
    saved = _saved_layout(state_dict, shapes)
    if saved == wanted:
        converted, carried = state_dict, {"step": _any_step(state_dict), "fewer_updates": 0}
    elif wanted == FLAT:
        converted, carried = per_tensor_to_flat(state_dict, shapes)
    else:
        converted, carried = flat_to_per_tensor(state_dict, shapes)
    moments = sorted({key for entry in converted["state"].values() for key in entry
                      if key != "step"})
    said = [f"{', '.join(moments) or 'no moments yet'} and update count {carried['step']:g}"]
    if carried["fewer_updates"]:
        said.append(f"({carried['fewer_updates']} tensors had taken fewer updates)")
    if "loss_scale" in converted:
        said.append(f"loss scale {float(converted['loss_scale']):g}")
    return converted, (f"optimizer state of {source} ({saved}) converted to {target} "
                       f"({wanted}): {', '.join(said)} carried over")


def _any_step(state_dict: Dict[str, Any]) -> float:
    steps = [float(entry["step"]) for entry in state_dict["state"].values()
             if isinstance(entry, dict) and "step" in entry]
    return max(steps) if steps else 0
