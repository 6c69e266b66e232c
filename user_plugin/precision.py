"""Reduced-precision training on CUDA GPUs and CPUs: fairseq's ``--bf16`` as bfloat16
autocast, and float16 loss-scale overflows on a CPU.

What fairseq 0.12 does with ``--bf16`` (and ``--memory-efficient-bf16``), and why it fails
everywhere but on a TPU:

* ``options.py`` turns ``--tpu`` on with it. The trainer then asks torch_xla for its device, and
  without torch_xla dies with ``'NoneType' object has no attribute 'xla_device'``: on a CPU, and
  on a CUDA GPU too, since the trainer tries the TPU before CUDA.
* Without ``--tpu``, the trainer would cast the model to bfloat16 and wrap the optimizer in
  ``FP16Optimizer`` (fp32 master weights), which allocates the masters with
  ``torch.cuda.current_device()`` (no CPU) and saves the rounded bfloat16 weights in the
  checkpoints, so that every resume restarts from rounded masters.

What the plugin does instead, when torch_xla is not installed (a TPU keeps fairseq's path):

* ``--tpu`` is turned off again before fairseq's launcher (``distributed_utils.call_main``) and
  the trainer read it;
* the weights, their gradients and the optimizer state stay float32, and the criterion's forward
  pass (the model's forward and the loss) runs under ``torch.autocast(dtype=torch.bfloat16)`` on
  the trainer's device, CUDA or CPU alike; the backward pass follows the dtypes autocast chose.
  bfloat16 has float32's exponent range, so there is no loss scaling.

Why autocast rather than bfloat16 weights with fp32 masters: the checkpoints hold the float32
weights themselves (they load wherever an fp32 checkpoint loads, and a resume continues from
exactly the weights it stopped at); the same code runs on a CPU, so CI trains through it; and
weights, gradients and Adam's moments take 16 bytes per parameter instead of ``FP16Optimizer``'s
20. The matrix products, which dominate the step, run in bfloat16 either way.

The checkpoints keep ``common.bf16 = True`` in their configuration: it records how the run was
trained. ``scripts/benchmark.py --dtype bf16`` uses :func:`autocast_forward_bf16` and
:func:`bf16_autocast` as training does.

float16: fairseq's ``--fp16`` needs CUDA (``FP16Optimizer`` asks for the current CUDA device;
fairseq alone fails at the first update with a 147-line ``AssertionError: Torch not compiled
with CUDA enabled``); the trainer refuses it on a CPU in one line, before anything is built,
naming what works there (:func:`refuse_fp16_without_cuda`). ``--memory-efficient-fp16 --cpu``
trains on a CPU: float16 weights, dynamic loss scaling.
When the scaled gradients overflow, fairseq's trainer lowers the scale, skips the update, and
then sets the step's gradient norm with ``torch.tensor(0.0).cuda()``, which fails without CUDA.
During a CPU trainer's float16 step, ``Tensor.cuda`` returns the tensor itself, so that the
overflow is handled on a CPU as on a GPU and training goes on.

:mod:`user_plugin.fairseq_patches` installs both (rows ``bf16_autocast`` and
``fp16_overflow_on_cpu``): the launcher ``distributed_utils.call_main`` and four methods of
fairseq's ``Trainer`` are wrapped. ``torch.Tensor.cuda`` is replaced only within one CPU
float16 training step, in a ``with`` block that puts torch's own method back.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
from argparse import Namespace
from typing import Any, Iterator

import torch
from torch import nn

logger = logging.getLogger(__name__)

# what fairseq's --bf16 and --memory-efficient-bf16 set in the configuration's "common" group
_BF16_FLAGS = ("bf16", "memory_efficient_bf16")


def torch_xla_installed() -> bool:
    """Whether torch_xla (a TPU's runtime, which fairseq's own ``--bf16`` path needs) is
    installed."""
    return importlib.util.find_spec("torch_xla") is not None


def bf16_autocast(device_type: str) -> torch.autocast:
    """A context in which ``device_type``'s ("cuda" or "cpu") autocast runs the operations that
    benefit (matrix products, attention) in bfloat16 and keeps the others in float32."""
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)


def autocast_forward_bf16(module: nn.Module, device_type: str) -> nn.Module:
    """Make every call of ``module`` (a criterion: the model's forward and the loss) run under
    :func:`bf16_autocast`; its parameters and everything outside the call stay as they are.
    Returns ``module``. Idempotent."""
    forward = module.forward
    if getattr(forward, "bf16_autocast_device", None) is not None:
        return module

    @functools.wraps(forward)
    def forward_under_bf16_autocast(*args: Any, **kwargs: Any) -> Any:
        with bf16_autocast(device_type):
            return forward(*args, **kwargs)

    forward_under_bf16_autocast.bf16_autocast_device = device_type  # type: ignore[attr-defined]
    module.forward = forward_under_bf16_autocast  # an instance attribute: this module only
    return module


def uses_bf16_autocast(cfg: Any) -> bool:
    """Whether a fairseq configuration asks for bfloat16 that the plugin serves by autocast:
    ``--bf16`` or ``--memory-efficient-bf16`` while not on a TPU."""
    common = cfg.common
    return bool(common.bf16 or common.memory_efficient_bf16) and not common.tpu


def release_bf16_from_tpu(cfg: Any) -> None:
    """Undo the ``--tpu`` that fairseq's option parser sets with ``--bf16`` when torch_xla is not
    installed (it could not have worked); refuse ``--bf16`` combined with ``--amp``, another
    mixed-precision mode, with one error line."""
    common = cfg.common
    if not (common.bf16 or common.memory_efficient_bf16):
        return
    if common.tpu and not torch_xla_installed():
        for group in ("common", "distributed_training", "optimizer"):
            section = cfg.get(group) if hasattr(cfg, "get") else getattr(cfg, group, None)
            if section is not None and "tpu" in section and section.tpu:
                section.tpu = False
    if not common.tpu and (common.amp or common.fp16):
        other = "--amp" if common.amp else "--fp16"
        raise SystemExit(f"error: --bf16 and {other} exclude each other; choose one precision")


@contextlib.contextmanager
def _fairseq_sees_fp32(cfg: Any) -> Iterator[None]:
    """Within the block, the configuration's bfloat16 flags read False, so that fairseq's own
    code keeps the model in float32 and builds its plain float32 optimizer."""
    common = cfg.common
    saved = {flag: common[flag] for flag in _BF16_FLAGS}
    try:
        for flag in _BF16_FLAGS:
            common[flag] = False
        yield
    finally:
        for flag, value in saved.items():
            common[flag] = value


@contextlib.contextmanager
def _tensor_cuda_stays_on_cpu() -> Iterator[None]:
    """Within the block, ``Tensor.cuda()`` returns the tensor itself (for a CPU trainer, where
    fairseq's float16 overflow handling calls it)."""
    cuda = torch.Tensor.cuda

    def stay(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self

    torch.Tensor.cuda = stay  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = cuda  # type: ignore[method-assign]


# -- the replacements of fairseq's functions, installed by :mod:`user_plugin.fairseq_patches`
# (rows ``bf16_autocast`` and ``fp16_overflow_on_cpu``): each takes fairseq's original and
# returns the function that goes in its place.


def trainer_train_step_fp16_on_cpu(train_step: Any) -> Any:
    """``Trainer.train_step`` that handles a float16 loss-scale overflow on a CPU (see the
    module's description): the step runs with ``Tensor.cuda`` returning the tensor itself, only
    within the step, when the trainer is on a CPU in float16."""

    @functools.wraps(train_step)
    def trainer_train_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.device.type != "cpu" or not self.cfg.common.fp16:
            return train_step(self, *args, **kwargs)
        with _tensor_cuda_stays_on_cpu():
            return train_step(self, *args, **kwargs)

    return trainer_train_step


def call_main_bf16_without_tpu(call_main: Any) -> Any:
    """fairseq's launcher ``distributed_utils.call_main``, after undoing the ``--tpu`` that
    ``--bf16`` implies when torch_xla is not installed."""

    @functools.wraps(call_main)
    def call_main_without_tpu(cfg: Any, main: Any, **kwargs: Any) -> Any:
        release_bf16_from_tpu(cfg)
        return call_main(cfg, main, **kwargs)

    return call_main_without_tpu


def refuse_fp16_without_cuda(cfg: Any) -> None:
    """One line (:class:`~user_plugin.files.errors.UserError`) for ``--fp16`` on a CPU:
    fairseq's ``FP16Optimizer`` keeps its float32 master weights on the current CUDA device,
    so the run would fail at its first update; ``--memory-efficient-fp16`` and ``--bf16`` train
    on a CPU."""
    from .files.errors import UserError

    common = cfg.common
    if not common.fp16 or common.memory_efficient_fp16 or common.bf16 or common.amp:
        return
    if common.cpu or not torch.cuda.is_available():
        where = "--cpu was given" if common.cpu else "this machine has no CUDA device"
        raise UserError(f"--fp16 needs a CUDA GPU (fairseq keeps its float32 master weights "
                        f"there) and {where}; on a CPU, train with --memory-efficient-fp16 "
                        "(float16 weights, loss scaling) or --bf16 (bfloat16 autocast), or "
                        "without either (float32)")


def trainer_init_bf16_autocast(init: Any) -> Any:
    """``Trainer.__init__`` without the bfloat16 cast of the model, the criterion's forward
    under bfloat16 autocast (runs without ``--bf16``, and on a TPU, are untouched)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    @functools.wraps(init)
    def trainer_init(self: Any, cfg: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(cfg, Namespace):
            cfg = convert_namespace_to_omegaconf(cfg)
        refuse_fp16_without_cuda(cfg)
        release_bf16_from_tpu(cfg)
        if not uses_bf16_autocast(cfg):
            init(self, cfg, *args, **kwargs)
            return
        with _fairseq_sees_fp32(cfg):
            init(self, cfg, *args, **kwargs)
        autocast_forward_bf16(self._criterion, self.device.type)
        logger.info(
            "bf16: weights, gradients and optimizer state in float32; the forward pass and "
            "the loss under torch.autocast(bfloat16) on %s", self.device.type,
        )

    return trainer_init


def trainer_build_optimizer_fp32(build_optimizer: Any) -> Any:
    """``Trainer._build_optimizer`` that builds the plain float32 optimizer under ``--bf16``."""

    @functools.wraps(build_optimizer)
    def trainer_build_optimizer(self: Any) -> None:
        if not uses_bf16_autocast(self.cfg):
            build_optimizer(self)
            return
        with _fairseq_sees_fp32(self.cfg):
            build_optimizer(self)

    return trainer_build_optimizer


def trainer_fp_convert_sample_bf16(fp_convert_sample: Any) -> Any:
    """``Trainer._fp_convert_sample`` that leaves the batch alone under ``--bf16``: autocast
    casts what it runs in bfloat16."""

    @functools.wraps(fp_convert_sample)
    def trainer_fp_convert_sample(self: Any, sample: Any) -> Any:
        if uses_bf16_autocast(self.cfg):
            return sample
        return fp_convert_sample(self, sample)

    return trainer_fp_convert_sample
