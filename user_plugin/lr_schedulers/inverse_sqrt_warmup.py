"""The learning-rate schedule of the paper (§5.3, equation 3)::

    lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)

a linear rise for ``warmup_steps`` updates, then decay with the inverse square root of the step.
The peak, at ``step_num = warmup_steps``, is ``d_model^-0.5 * warmup_steps^-0.5``:
6.99e-4 for the base model (d_model 512) and 4.94e-4 for the big one (1024), warmup 4000.

fairseq calls ``step_update(0)`` before the first update and ``step_update(k)`` after update k,
so the update about to run is number ``k + 1``: that is the paper's ``step_num``.

``--lr`` does not act: equation 3 sets every update's rate, and ``--lr-scale`` multiplies it. A
``--lr`` other than fairseq's default (0.25) or 1 (the recipes' neutral value) is refused in one
line that gives the ``--lr-scale`` of the same peak, so that a command line ported from fairseq's
``inverse_sqrt`` (``--lr 5e-4``: a peak) is not trained at the paper's rate without a word.

``d_model`` is the model's ``--decoder-embed-dim`` unless ``--d-model`` is given, read from the
model configuration in each form fairseq trains with: ours (a flat dataclass), fairseq's own
``transformer`` under ``fairseq-train`` (an argparse namespace of flat options) or as a nested
``TransformerConfig`` (``decoder.embed_dim``), so the schedule drives either architecture.
"""

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II, DictConfig, OmegaConf

from ..files.errors import InvalidValue
from ..paper import WARMUP_STEPS

logger = logging.getLogger(__name__)

SCHEDULER_NAME = "vaswani_inverse_sqrt"
#: The ``--lr`` values taken as not given: fairseq's default and the recipes' neutral 1.
UNUSED_LR_VALUES = (0.25, 1.0)


@dataclass
class InverseSqrtWarmupConfig(FairseqDataclass):
    warmup_updates: int = field(
        default=WARMUP_STEPS,
        metadata={"help": f"warmup_steps of the paper's schedule ({WARMUP_STEPS})"},
    )
    lr_scale: float = field(
        default=1.0, metadata={"help": "multiplies the paper's learning rate (1.0 = the paper)"}
    )
    d_model: Optional[int] = field(
        default=None, metadata={"help": "d_model of the formula; default: the model's"}
    )
    # The model's width, when the model config is a flat or nested container; null otherwise
    # (then read from the model configuration object itself, see ``model_dimension``).
    # fairseq's --lr, only to refuse one given to a schedule that does not use it
    lr: Any = II("oc.select:optimization.lr,null")
    model_embed_dim: Optional[int] = II(
        "oc.select:model.decoder_embed_dim,${oc.select:model.decoder.embed_dim,null}"
    )


def refuse_given_lr(lr: Any, paper_peak: float, warmup_updates: int) -> None:
    """An :class:`InvalidValue` naming ``--lr-scale`` when ``--lr`` was given a value the schedule
    would ignore (see the module docstring); ``paper_peak`` is equation 3's peak at scale 1."""
    if lr is None or isinstance(lr, str):  # none, or the interpolation outside a fairseq run
        return
    values = list(lr) if isinstance(lr, (list, tuple)) or OmegaConf.is_list(lr) else [lr]
    given = [float(value) for value in values if float(value) not in UNUSED_LR_VALUES]
    if given:
        raise InvalidValue(
            f"--lr {given[0]:g} is not used by --lr-scheduler {SCHEDULER_NAME}: equation 3 "
            f"sets every update's rate (peak {paper_peak:.3e} at update {warmup_updates}); for a "
            f"peak of {given[0]:g} give --lr-scale {given[0] / paper_peak:.4g} (and --lr 1)")


def paper_learning_rate(
    step_num: int, d_model: int, warmup_steps: int, scale: float = 1.0
) -> float:
    """Equation 3 of §5.3 (``step_num`` counts from 1)."""
    if step_num < 1:
        raise ValueError(f"step_num counts from 1, got {step_num}")
    return scale * d_model**-0.5 * min(step_num**-0.5, step_num * warmup_steps**-1.5)


@register_lr_scheduler(SCHEDULER_NAME, dataclass=InverseSqrtWarmupConfig)
class InverseSqrtWarmupSchedule(FairseqLRScheduler):
    """Sets the learning rate of every update to equation 3; ``--lr`` is not used."""

    def __init__(self, cfg: InverseSqrtWarmupConfig, optimizer) -> None:
        super().__init__(cfg, optimizer)
        if cfg.warmup_updates < 1:
            raise InvalidValue(f"--warmup-updates must be at least 1, got {cfg.warmup_updates}")
        if not 0 < cfg.lr_scale < math.inf:
            raise InvalidValue(f"--lr-scale must be a positive finite number, got {cfg.lr_scale}")
        if cfg.d_model is not None and cfg.d_model < 1:
            raise InvalidValue(f"--d-model must be at least 1, got {cfg.d_model}")
        d_model = cfg.d_model if cfg.d_model is not None else model_dimension(cfg)
        if d_model is None or d_model < 1:
            raise InvalidValue(
                "vaswani_inverse_sqrt: the model has no --decoder-embed-dim; pass --d-model"
            )
        self.d_model = int(d_model)
        self.warmup_updates = cfg.warmup_updates
        self.scale = cfg.lr_scale
        peak = self.lr_at(self.warmup_updates - 1)
        refuse_given_lr(getattr(cfg, "lr", None), peak / self.scale, self.warmup_updates)
        logger.info(
            f"paper LR schedule: d_model {self.d_model}, warmup {self.warmup_updates}, "
            f"scale {self.scale}: peak lr {peak:.3e} at update {self.warmup_updates}"
        )
        self.step_update(0)

    def lr_at(self, num_updates: int) -> float:
        """The learning rate of the update that follows ``num_updates`` finished ones."""
        return paper_learning_rate(num_updates + 1, self.d_model, self.warmup_updates, self.scale)

    def step_update(self, num_updates: int) -> float:
        lr = self.lr_at(num_updates)
        self.optimizer.set_lr(lr)
        return lr

    def step(self, epoch: int, val_loss: Optional[float] = None) -> float:
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()


def model_dimension(cfg) -> Optional[int]:
    """d_model of the model trained alongside the scheduler configuration ``cfg``: its
    ``model_embed_dim`` interpolation, else the width read from the root configuration's
    ``model`` object (fairseq keeps a legacy model's options there as an argparse namespace,
    which interpolations cannot reach); None outside a full fairseq configuration."""
    try:
        width = getattr(cfg, "model_embed_dim", None)
    except Exception:  # an unresolvable interpolation outside a full fairseq config
        width = None
    if width is None and isinstance(cfg, DictConfig):
        width = model_width(OmegaConf.select(cfg._get_root(), "model", default=None))
    return width


def model_width(model_cfg: Any) -> Optional[int]:
    """``--decoder-embed-dim`` of a model configuration: flat (``decoder_embed_dim``) or nested
    (``decoder.embed_dim``), as a mapping or attributes; None when it has neither."""
    for path in (("decoder_embed_dim",), ("decoder", "embed_dim")):
        value = model_cfg
        for name in path:
            if value is None:
                break
            value = value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)
        if value is not None:
            return int(value)
    return None
