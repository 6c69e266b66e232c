"""Reduced-precision training of the plugin's runs: ``--fp16`` and ``--bf16`` with float32
master weights, ``--bf16 --amp`` as bfloat16 autocast, and float16 overflows on a CPU.

What fairseq 0.12 does, and why the plugin changes it:

* ``--bf16`` (and ``--memory-efficient-bf16``) turns ``--tpu`` on in ``options.py``; without
  torch_xla the trainer dies with ``'NoneType' object has no attribute 'xla_device'``, on a CPU
  and on a CUDA GPU alike (the trainer tries the TPU before CUDA). When torch_xla is not
  installed the plugin turns ``--tpu`` off again before fairseq's launcher and trainer read it,
  for every run (row ``bf16_without_tpu``, which wraps ``distributed_utils.call_main`` and
  ``Trainer.__init__``): that only turns a crash into fairseq's own non-TPU bfloat16 path.
* ``--fp16`` (and fairseq's non-TPU ``--bf16``) wrap the optimizer in ``FP16Optimizer``, which
  copies gradients and weights between the model and the float32 masters tensor by tensor
  (about 3,000 operator calls per update for a base Transformer), allocates the masters with
  ``torch.cuda.current_device()`` (no CPU), and saves the rounded half-precision weights in the
  checkpoints, so that every resume restarts from rounded masters.

For runs of the plugin's model or task (row ``mixed_precision``, scoped to our runs: a stock
run in the same process keeps fairseq's paths; five methods of fairseq's ``Trainer`` are
wrapped):

* ``--fp16`` and ``--bf16``: half-precision weights with float32 masters in one flat tensor,
  moved with multi-tensor copies (:mod:`user_plugin.optimizers.float32_masters`), the inner
  ``--optimizer`` over that one tensor (``vaswani_adam``: one fused operation). float16 keeps
  fairseq's dynamic loss scaler with one host read per update; bfloat16 has no scaler. The masters
  start from the float32 weights the model was built with (fairseq would start from their
  rounding), and checkpoints store them as the model's weights: a checkpoint of a half-precision
  run is a float32 checkpoint, and a resume continues from exactly the weights it stopped at.
  This runs on a CPU too (fairseq's ``--fp16`` does not).
* ``--bf16 --amp``: the previous meaning of the plugin's ``--bf16``, kept as an option (and
  for resuming runs that began with it): float32 weights, gradients and optimizer state, the
  criterion's forward pass (model and loss) under ``torch.autocast(dtype=torch.bfloat16)``;
  the backward follows the dtypes autocast chose. fairseq's ``--amp`` alone (float16 autocast
  with a gradient scaler) is fairseq's.
* ``--memory-efficient-fp16``, ``--memory-efficient-bf16``, ``--fp16-no-flatten-grads``: fairseq's
  own optimizer wrappers.

float16 on a CPU: fairseq's trainer handles a loss-scale overflow by setting the step's gradient
norm to ``torch.tensor(0.0).cuda()``, which fails without CUDA. During a CPU trainer's float16
step, ``Tensor.cuda`` returns the tensor itself (row ``fp16_overflow_on_cpu``, every run: it
turns a crash into fairseq's own overflow handling), in a ``with`` block that puts torch's own
method back.

``--fp16`` on fairseq's own path (a stock run) without CUDA fails in fairseq at its first
update with a 147-line ``AssertionError: Torch not compiled with CUDA enabled``; the
trainer refuses it in one line before anything is built, naming what works there
(:func:`refuse_fp16_without_cuda`; row ``fp16_without_cuda``, every run: fairseq would fail
anyway).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
from argparse import Namespace
from typing import TYPE_CHECKING, Any, ContextManager, Dict, Iterator, Optional

from .scope import is_our_run
from .temporary import replaced

if TYPE_CHECKING:  # torch is imported where it is used: loading the table stays cheap
    import torch
    from torch import nn

logger = logging.getLogger(__name__)

#: How a run trains, by :func:`precision_mode`.
FAIRSEQ, FP16_MASTERS, BF16_MASTERS, BF16_AUTOCAST = (
    "fairseq", "fp16_masters", "bf16_masters", "bf16_autocast")
MASTER_MODES = (FP16_MASTERS, BF16_MASTERS)

# what fairseq's --bf16 and --memory-efficient-bf16 set in the configuration's "common" group,
# and its --amp: the flags fairseq must not see while the plugin serves --bf16 --amp
_AUTOCAST_FLAGS = ("bf16", "memory_efficient_bf16", "amp")


def torch_xla_installed() -> bool:
    """Whether torch_xla (a TPU's runtime, which fairseq's own ``--bf16`` path needs) is
    installed."""
    return importlib.util.find_spec("torch_xla") is not None


def _mode_of(trainer: Any) -> str:
    """The trainer's :func:`precision_mode`, decided once, when it was made (the wrappers hide
    flags from fairseq for a while; the mode must not follow them)."""
    mode = trainer.__dict__.get("_vaswani_precision_mode")
    if mode is None:
        mode = trainer.__dict__["_vaswani_precision_mode"] = precision_mode(trainer.cfg)
    return mode


def precision_mode(cfg: Any) -> str:
    """How the run of configuration ``cfg`` trains: :data:`FP16_MASTERS` (``--fp16``),
    :data:`BF16_MASTERS` (``--bf16``), :data:`BF16_AUTOCAST` (``--bf16 --amp``) for the plugin's
    runs; :data:`FAIRSEQ` (fairseq's own paths) for every other run and option."""
    common = cfg.common
    if common.tpu or not is_our_run(cfg):
        return FAIRSEQ
    if common.memory_efficient_fp16 or common.memory_efficient_bf16 \
            or getattr(common, "fp16_no_flatten_grads", False):
        return FAIRSEQ
    if common.bf16:
        return BF16_AUTOCAST if common.amp else BF16_MASTERS
    if common.fp16 and not common.amp:
        return FP16_MASTERS
    return FAIRSEQ


def bf16_autocast(device_type: str) -> torch.autocast:
    """A context in which ``device_type``'s ("cuda" or "cpu") autocast runs the operations that
    benefit (matrix products, attention) in bfloat16 and keeps the others in float32."""
    import torch

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


def release_bf16_from_tpu(cfg: Any) -> None:
    """Undo the ``--tpu`` that fairseq's option parser sets with ``--bf16`` when torch_xla is not
    installed (it could not have worked); refuse ``--bf16`` with ``--fp16`` in one error line."""
    common = cfg.common
    if not (common.bf16 or common.memory_efficient_bf16):
        return
    if common.tpu and not torch_xla_installed():
        for group in ("common", "distributed_training", "optimizer"):
            section = cfg.get(group) if hasattr(cfg, "get") else getattr(cfg, group, None)
            if section is not None and "tpu" in section and section.tpu:
                section.tpu = False
    if not common.tpu and common.fp16:
        raise SystemExit("error: --bf16 and --fp16 exclude each other; choose one precision")


@contextlib.contextmanager
def _fairseq_sees_fp32(cfg: Any) -> Iterator[None]:
    """Within the block, the configuration's bfloat16 and autocast flags read False, so that
    fairseq's own code keeps the model in float32, builds its plain float32 optimizer and takes
    no ``--amp`` branch of its trainer."""
    common = cfg.common
    saved = {flag: common[flag] for flag in _AUTOCAST_FLAGS}
    try:
        for flag in _AUTOCAST_FLAGS:
            common[flag] = False
        yield
    finally:
        for flag, value in saved.items():
            common[flag] = value


def _fp16_optimizer_is(builder: Any) -> ContextManager[None]:
    """Within the block, the ``FP16Optimizer`` that fairseq's trainer builds for ``--fp16`` and
    ``--bf16`` is ``builder`` (its ``build_optimizer(cfg, params)`` is called)."""
    from fairseq import optim

    return replaced(optim, "FP16Optimizer", builder)


def _stay(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``Tensor.cuda`` on a CPU trainer: the tensor itself."""
    return tensor


def _tensor_cuda_stays_on_cpu() -> ContextManager[None]:
    """Within the block, ``Tensor.cuda()`` returns the tensor itself (for a CPU trainer, where
    fairseq's float16 overflow handling calls it)."""
    import torch

    return replaced(torch.Tensor, "cuda", _stay)


class _MasterWeights:
    """What the trainer keeps for its float32 masters until the optimizer exists: the float32
    weights each parameter was rounded from (at start, the model as built; on a resume, the
    checkpoint's), by ``id(parameter)``."""

    def __init__(self, model: nn.Module) -> None:
        import torch

        self.model = model
        self.pending: Optional[Dict[int, torch.Tensor]] = {
            id(p): p.data for p in model.parameters() if p.dtype == torch.float32}

    def on_load(self, module: nn.Module, state_dict: Dict[str, Any], prefix: str, *args: Any
                ) -> None:
        """``load_state_dict`` pre-hook of the model: remember the float32 weights loaded."""
        import torch

        by_name = {name: p for name, p in self.model.named_parameters(remove_duplicate=False)}
        found = {}
        for name, tensor in state_dict.items():
            p = by_name.get(name[len(prefix):]) if name.startswith(prefix) else None
            if p is not None and torch.is_tensor(tensor) and tensor.dtype == torch.float32 \
                    and tensor.shape == p.shape:
                found[id(p)] = tensor
        self.pending = found

    def initial(self, params: Any) -> list:
        """For each of ``params``, the float32 weights to start its master from, or None."""
        pending, self.pending = self.pending or {}, None
        return [pending.get(id(p)) for p in params]


# -- the replacements of fairseq's functions, installed by :mod:`user_plugin.fairseq_patches`:
# each takes fairseq's original and returns the function that goes in its place.


def _omegaconf(cfg: Any) -> Any:
    """``cfg`` as the omegaconf configuration fairseq's trainer converts it to."""
    if isinstance(cfg, Namespace):
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        return convert_namespace_to_omegaconf(cfg)
    return cfg


def call_main_bf16_without_tpu(call_main: Any) -> Any:
    """fairseq's launcher ``distributed_utils.call_main``, after undoing the ``--tpu`` that
    ``--bf16`` implies when torch_xla is not installed."""

    @functools.wraps(call_main)
    def call_main_without_tpu(cfg: Any, main: Any, **kwargs: Any) -> Any:
        release_bf16_from_tpu(cfg)
        return call_main(cfg, main, **kwargs)

    return call_main_without_tpu


def trainer_init_bf16_without_tpu(init: Any) -> Any:
    """``Trainer.__init__`` after undoing the ``--tpu`` that ``--bf16`` implies when torch_xla
    is not installed (a trainer made without fairseq's launcher: from Python)."""

    @functools.wraps(init)
    def trainer_init(self: Any, cfg: Any, *args: Any, **kwargs: Any) -> None:
        cfg = _omegaconf(cfg)
        release_bf16_from_tpu(cfg)
        init(self, cfg, *args, **kwargs)

    return trainer_init


def trainer_init_refusing_fp16_without_cuda(init: Any) -> Any:
    """``Trainer.__init__`` that refuses, in one line, ``--fp16`` on fairseq's own path
    without CUDA (:func:`refuse_fp16_without_cuda`), before anything is built."""

    @functools.wraps(init)
    def trainer_init(self: Any, cfg: Any, *args: Any, **kwargs: Any) -> None:
        cfg = _omegaconf(cfg)
        if precision_mode(cfg) == FAIRSEQ:
            refuse_fp16_without_cuda(cfg)
        init(self, cfg, *args, **kwargs)

    return trainer_init


def trainer_init_mixed_precision(init: Any) -> Any:
    """``Trainer.__init__``: for ``--bf16 --amp``, no bfloat16 cast of the model and the
    criterion's forward under bfloat16 autocast; for ``--fp16`` / ``--bf16`` (the plugin's
    runs), fairseq's cast, after keeping the float32 weights the masters start from."""

    @functools.wraps(init)
    def trainer_init(self: Any, cfg: Any, task: Any, model: nn.Module, *args: Any,
                     **kwargs: Any) -> None:
        cfg = _omegaconf(cfg)
        release_bf16_from_tpu(cfg)
        mode = self._vaswani_precision_mode = precision_mode(cfg)
        if mode == BF16_AUTOCAST:
            with _fairseq_sees_fp32(cfg):
                init(self, cfg, task, model, *args, **kwargs)
            autocast_forward_bf16(self._criterion, self.device.type)
            logger.info("bf16 autocast (--bf16 --amp): weights, gradients and optimizer state "
                        "in float32; the forward pass and the loss under "
                        "torch.autocast(bfloat16) on %s", self.device.type)
            return
        if mode not in MASTER_MODES:
            init(self, cfg, task, model, *args, **kwargs)
            return
        masters = _MasterWeights(model)
        init(self, cfg, task, model, *args, **kwargs)
        self._vaswani_master_weights = masters
        self._model.register_load_state_dict_pre_hook(masters.on_load)
        self._model.register_load_state_dict_post_hook(
            lambda module, keys: _masters_follow_loaded_weights(self))
        logger.info("%s: %s weights and gradients, float32 master weights in one flat tensor "
                    "(multi-tensor copies), %s", mode, "float16" if mode == FP16_MASTERS
                    else "bfloat16", "fairseq's dynamic loss scaling"
                    if mode == FP16_MASTERS else "no loss scaling")

    return trainer_init


def _masters_follow_loaded_weights(trainer: Any) -> None:
    """After the model loaded a state dict: an optimizer already built takes the loaded float32
    weights as its masters (otherwise its next update would bring back the old weights)."""
    from ..optimizers.float32_masters import Float32MasterOptimizer

    optimizer = trainer._optimizer
    masters = trainer._vaswani_master_weights
    if isinstance(optimizer, Float32MasterOptimizer) and masters.pending:
        optimizer.load_masters(masters.pending)
        masters.pending = None


def trainer_build_optimizer_mixed_precision(build_optimizer: Any) -> Any:
    """``Trainer._build_optimizer``: under ``--bf16 --amp`` the plain float32 optimizer; under
    the float32-master modes, :class:`Float32MasterOptimizer` where fairseq would build its
    ``FP16Optimizer`` (everything else of fairseq's method, the LR scheduler included, runs as
    it is)."""

    @functools.wraps(build_optimizer)
    def trainer_build_optimizer(self: Any) -> None:
        mode = _mode_of(self)
        if mode == BF16_AUTOCAST:
            with _fairseq_sees_fp32(self.cfg):
                build_optimizer(self)
            return
        if mode not in MASTER_MODES:
            build_optimizer(self)
            return
        from ..optimizers.float32_masters import Float32MasterOptimizer

        masters = getattr(self, "_vaswani_master_weights", None)

        class _Builder:
            @staticmethod
            def build_optimizer(cfg: Any, params: Any, **kwargs: Any) -> Any:
                params = list(params)
                initial = masters.initial(params) if masters is not None else None
                return Float32MasterOptimizer.build_optimizer(cfg, params, initial, **kwargs)

        with _fp16_optimizer_is(_Builder):
            build_optimizer(self)

    return trainer_build_optimizer


def trainer_state_dict_float32_masters(state_dict: Any) -> Any:
    """``Trainer.state_dict`` whose model weights are the float32 masters under the plugin's
    ``--fp16`` / ``--bf16`` (a float32 checkpoint; exact resumes)."""

    @functools.wraps(state_dict)
    def trainer_state_dict(self: Any) -> Dict[str, Any]:
        from ..optimizers.float32_masters import Float32MasterOptimizer

        state = state_dict(self)
        optimizer = self._optimizer
        if isinstance(optimizer, Float32MasterOptimizer) and isinstance(state.get("model"), dict):
            masters = optimizer.master_of()
            for name, tensor in self.model.state_dict(keep_vars=True).items():
                master = masters.get(id(tensor))
                if master is not None and name in state["model"]:
                    state["model"][name] = master.detach()
        return state

    return trainer_state_dict


def trainer_fp_convert_sample_bf16(fp_convert_sample: Any) -> Any:
    """``Trainer._fp_convert_sample`` that leaves the batch alone under ``--bf16 --amp``:
    autocast casts what it runs in bfloat16."""

    @functools.wraps(fp_convert_sample)
    def trainer_fp_convert_sample(self: Any, sample: Any) -> Any:
        if _mode_of(self) == BF16_AUTOCAST:
            return sample
        return fp_convert_sample(self, sample)

    return trainer_fp_convert_sample


def trainer_train_step_mixed_precision(train_step: Any) -> Any:
    """``Trainer.train_step``: under ``--bf16 --amp`` fairseq does not see its ``--amp`` (whose
    branches expect fairseq's float16 gradient scaler); a CPU float16 step survives an
    overflow (module description)."""

    @functools.wraps(train_step)
    def trainer_train_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _mode_of(self) == BF16_AUTOCAST:
            with _fairseq_sees_fp32(self.cfg):
                return train_step(self, *args, **kwargs)
        return train_step(self, *args, **kwargs)

    return trainer_train_step


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


def refuse_fp16_without_cuda(cfg: Any) -> None:
    """One line (:class:`~user_plugin.files.errors.UserError`) for ``--fp16`` on fairseq's own
    path without CUDA: fairseq's ``FP16Optimizer`` keeps its float32 master weights on the
    current CUDA device, so the run would fail at its first update."""
    import torch

    from ..files.errors import UserError

    common = cfg.common
    if not common.fp16 or common.memory_efficient_fp16 or common.bf16 or common.amp:
        return
    if common.cpu or not torch.cuda.is_available():
        where = "--cpu was given" if common.cpu else "this machine has no CUDA device"
        raise UserError(f"--fp16 of fairseq's own trainer needs a CUDA GPU (it keeps its float32 "
                        f"master weights there) and {where}; on a CPU, train with "
                        "--memory-efficient-fp16 (float16 weights, loss scaling), in float32, or "
                        "with the plugin's model (--arch vaswani_*), whose --fp16 and --bf16 run "
                        "on a CPU")
