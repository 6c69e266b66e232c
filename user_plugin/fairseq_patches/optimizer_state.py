"""Resuming an optimizer state that another precision mode wrote (row
``optimizer_state_layouts``): ``Trainer.load_checkpoint`` converts it
(:func:`~user_plugin.optimizers.state_layouts.convert_state`) instead of refusing it.

During the call, and only without ``--reset-optimizer``, the trainer's ``_build_optimizer``
(which fairseq calls between reading the checkpoint and comparing the optimizer names) also
lets the name check pass when the names differ, and makes the new optimizer's next
``load_state_dict`` convert the state first; the checkpoint's optimizer history is given back
unchanged as soon as the state is loaded (at the latest when the call ends), so the history
saved later still names the optimizer that wrote each state. What cannot be converted is one
error line naming the cause and the way out.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Dict, Optional, Sequence

from ..files.errors import UserError, first_line

logger = logging.getLogger(__name__)


def _way_out(trainer: Any, source: str, error: Optional[Exception] = None) -> str:
    """What the user can do when a state cannot be converted: a new optimizer state, or the
    checkpoint's ``--optimizer``, or (a per-tensor state under ``--bf16``) the autocast
    that wrote it."""
    from ..optimizers.state_layouts import (
        PRECISION_WRAPPERS,
        OtherOptimizerError,
        optimizer_option,
    )

    common = trainer.cfg.common
    out = "add --reset-optimizer to resume the weights with a new optimizer state"
    if isinstance(error, OtherOptimizerError):
        out += f", or resume with {optimizer_option(source)}"
    elif source not in PRECISION_WRAPPERS and common.bf16 and not common.amp:
        out += (", or resume with --bf16 --amp (bfloat16 autocast over float32 weights, as "
                "the checkpoint was trained)")
    return out


class _Conversion:
    """One ``Trainer.load_checkpoint`` call of a plugin run: lets fairseq's name check pass
    and converts the state when the checkpoint's optimizer is not the one built (module
    description)."""

    def __init__(self, trainer: Any, filename: str) -> None:
        self.trainer = trainer
        self.filename = filename
        self.history: Optional[list] = None  # the checkpoint's, while a copy stands in for it

    def build_optimizer(self) -> None:
        """The trainer's ``_build_optimizer``, then the name check's stand-in if needed."""
        trainer = self.trainer
        type(trainer)._build_optimizer(trainer)
        history = trainer._optim_history
        if self.history is not None or not history or not isinstance(history[-1], dict):
            return
        source = history[-1].get("optimizer_name")
        optimizer = trainer._optimizer
        target = type(optimizer).__name__
        if source is None or source == target:
            return
        self.history = history
        trainer._optim_history = [*history[:-1], {**history[-1], "optimizer_name": target}]
        self._convert_on_load(optimizer, source)

    def _convert_on_load(self, optimizer: Any, source: str) -> None:
        """Make ``optimizer``'s next ``load_state_dict`` convert the state it is given."""
        from ..optimizers.state_layouts import (
            LayoutError,
            convert_state,
            inner_optimizer_name,
            trainer_parameters,
        )

        conversion = self

        def load_state_dict(state_dict: Dict[str, Any],
                            optimizer_overrides: Optional[Dict[str, Any]] = None) -> None:
            del optimizer.__dict__["load_state_dict"]
            conversion.restore_history()
            params = trainer_parameters(conversion.trainer)
            name = conversion.filename
            try:
                converted, said = convert_state(state_dict, source, optimizer, params)
            except LayoutError as error:
                raise UserError(
                    f"{name}: cannot resume its optimizer state ({source}) with this run's "
                    f"{type(optimizer).__name__}: {error}; "
                    f"{_way_out(conversion.trainer, source, error)}") from None
            try:
                optimizer.load_state_dict(converted, optimizer_overrides)
            except (KeyError, ValueError, TypeError, RuntimeError, AttributeError) as error:
                raise UserError(
                    f"{name}: its optimizer state ({source}) does not load into this run's "
                    f"{inner_optimizer_name(optimizer)} ({first_line(error, with_type=True)}); "
                    f"{_way_out(conversion.trainer, source)}") from None
            logger.info("%s: %s", name, said)

        optimizer.load_state_dict = load_state_dict

    def restore_history(self) -> None:
        """Give the trainer back the checkpoint's own optimizer history."""
        if self.history is not None:
            self.trainer._optim_history = self.history
            self.history = None


def _reset_optimizer(args: Sequence[Any], kwargs: Dict[str, Any]) -> bool:
    """``reset_optimizer`` of a ``Trainer.load_checkpoint(filename, reset_optimizer, ...)``
    call, from what followed ``filename``."""
    if "reset_optimizer" in kwargs:
        return bool(kwargs["reset_optimizer"])
    return bool(args[0]) if args else False


def trainer_load_checkpoint_converting_layouts(load_checkpoint: Any) -> Any:
    """``Trainer.load_checkpoint`` that converts an optimizer state of another layout to the
    optimizer the run builds (module description); fairseq's own under ``--reset-optimizer``
    (the row applies to our runs only)."""

    @functools.wraps(load_checkpoint)
    def trainer_load_checkpoint(self: Any, filename: str, *args: Any, **kwargs: Any) -> Any:
        if _reset_optimizer(args, kwargs):
            return load_checkpoint(self, filename, *args, **kwargs)
        conversion = _Conversion(self, filename)
        self._build_optimizer = conversion.build_optimizer  # this trainer, this call only
        try:
            return load_checkpoint(self, filename, *args, **kwargs)
        finally:
            self.__dict__.pop("_build_optimizer", None)
            conversion.restore_history()
            optimizer = self.__dict__.get("_optimizer")
            if optimizer is not None:
                optimizer.__dict__.pop("load_state_dict", None)

    return trainer_load_checkpoint
