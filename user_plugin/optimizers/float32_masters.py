"""Half-precision training with float32 master weights in one flat tensor: the plugin's
``--fp16`` and ``--bf16``.

The model's weights and gradients are float16 or bfloat16; the optimizer updates float32
copies of them, the *master weights*, and the model takes the rounded result after each update
(Micikevicius et al. 2018, "Mixed Precision Training", §3.1). fairseq's ``FP16Optimizer`` does
the same with a Python loop over the parameter tensors to move gradients in and weights out:
for a base Transformer about 500 copy and 2,500 view operations per update, each a kernel
launch or a dispatch on a GPU, whichever optimizer runs inside it.

Here the masters are one flat float32 tensor, and each parameter's master and master gradient
are views of it, so that:

* gradients move in with one multi-tensor copy (``torch._foreach_copy_``, casting to float32),
  and the rounded weights move out with another;
* the gradient norm is one reduction over the flat gradient, the unscaling one multiplication;
* the inner optimizer (``--optimizer``, e.g. the plugin's ``vaswani_adam``: one fused
  operation) sees a single tensor.

An update thus costs a handful of operator calls whatever the number of tensors.

float16 keeps fairseq's dynamic loss scaling, with fairseq's own ``DynamicLossScaler`` (scale
window, tolerance, threshold, minimum scale; an overflow skips the update). Deciding whether the
scaled gradients overflowed needs their norm on the host: that read is the only host-device
synchronisation of an update here, and the norm is returned as a host tensor so that the
trainer's own finiteness check does not wait for the device a second time. bfloat16 has
float32's exponent range: no loss scaling, and no synchronisation of its own.

The masters are what a checkpoint stores as the model's weights (the plugin's trainer patch,
:mod:`user_plugin.fairseq_patches.precision`), so that a resumed run continues from exactly the
float32 weights it stopped at, and a checkpoint of a half-precision run is a float32 checkpoint
like any other.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from fairseq import optim
from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler

from ..files.errors import UserError

logger = logging.getLogger(__name__)

#: fairseq's default loss-scale window for one process and no gradient accumulation
#: (``FP16Optimizer``: 2^14 updates divided by the data-parallel size and --update-freq).
SCALE_WINDOW_UPDATES = 2**14
#: The counters of fairseq's ``DynamicLossScaler`` that decide when the scale grows.
SCALER_COUNTERS = ("_iter", "_last_overflow_iter", "_last_rescale_iter",
                   "_overflows_since_rescale")


def scale_window(cfg: Any) -> int:
    """``--fp16-scale-window``, or fairseq's default for the run's data-parallel size and
    gradient accumulation."""
    window = getattr(cfg.common, "fp16_scale_window", None)
    if window is not None:
        return int(window)
    update_freq = list(cfg.optimization.update_freq)
    if len(update_freq) > 1:
        raise UserError("--fp16-scale-window must be given with an --update-freq schedule "
                        f"({','.join(map(str, update_freq))})")
    data_parallel = cfg.distributed_training.distributed_world_size \
        / cfg.common.model_parallel_size
    return int(SCALE_WINDOW_UPDATES / data_parallel / update_freq[0])


class Float32MasterOptimizer(optim.FairseqOptimizer):
    """fairseq's optimizer interface over half-precision parameters with flat float32 masters
    (module description). ``fp32_optimizer`` is the inner optimizer, built over the single
    flat master ``fp32_params``; ``scaler`` is fairseq's ``DynamicLossScaler`` for float16,
    None for bfloat16."""

    def __init__(self, cfg: Any, params: Sequence[torch.nn.Parameter],
                 fp32_optimizer: optim.FairseqOptimizer, fp32_params: torch.nn.Parameter,
                 loss_scaling: bool) -> None:
        super().__init__(cfg.optimizer)
        self.model_params: List[torch.nn.Parameter] = list(params)
        self.fp32_optimizer = fp32_optimizer
        self.fp32_params = fp32_params
        self._master_views = _views(fp32_params.data, self.model_params)
        self._master_grad_views = _views(fp32_params.grad, self.model_params)
        self.scaler: Optional[DynamicLossScaler] = None
        if loss_scaling:
            self.scaler = DynamicLossScaler(
                init_scale=cfg.common.fp16_init_scale,
                scale_window=scale_window(cfg),
                tolerance=cfg.common.fp16_scale_tolerance,
                threshold=cfg.common.threshold_loss_scale,
                min_loss_scale=cfg.common.min_loss_scale,
            )
        self._multiply_factor: Any = 1.0
        # "zeroed": no backward since zero_grad (the flat gradient is stale); "model": the
        # model holds new gradients; "masters": they have been copied into the flat gradient
        self._gradients = "zeroed"

    @classmethod
    def build_optimizer(cls, cfg: Any, params: Sequence[torch.nn.Parameter],
                        initial_weights: Optional[Sequence[Optional[torch.Tensor]]] = None,
                        **unused: Any) -> "Float32MasterOptimizer":
        """The masters of ``params`` (float16 or bfloat16), the inner ``--optimizer`` over them.

        ``initial_weights``: for each parameter, the float32 weights it was rounded from (the
        model before the trainer cast it, or a checkpoint being resumed), or None to start from
        the parameter itself.
        """
        params = [p for p in params if p.requires_grad]
        if not params:
            raise UserError("no trainable parameters to optimize")
        device = params[0].device
        total = sum(p.numel() for p in params)
        master = torch.empty(total, dtype=torch.float32, device=device)
        views = _views(master, params)
        initial = list(initial_weights) if initial_weights is not None else [None] * len(params)
        with torch.no_grad():
            torch._foreach_copy_(views, [p if w is None else w.to(device)
                                         for p, w in zip(params, initial)])
        master = torch.nn.Parameter(master)
        master.grad = torch.zeros_like(master)
        inner = optim.build_optimizer(cfg.optimizer, [master])
        if not inner.supports_flat_params:
            raise UserError(f"--optimizer {cfg.optimizer._name} does not accept one flat tensor "
                            "of parameters; add --fp16-no-flatten-grads to use fairseq's "
                            "FP16Optimizer with it")
        return cls(cfg, params, inner, master,
                   loss_scaling=not getattr(cfg.common, "bf16", False))

    # -- what fairseq's trainer calls ----------------------------------------------------------

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.fp32_optimizer.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.fp32_optimizer.optimizer = optimizer

    @property
    def lr_scheduler(self) -> Any:
        return getattr(self.fp32_optimizer, "lr_scheduler", None)

    @property
    def optimizer_config(self) -> Dict[str, Any]:
        return self.fp32_optimizer.optimizer_config

    def get_lr(self) -> float:
        return self.fp32_optimizer.get_lr()

    def set_lr(self, lr: float) -> None:
        self.fp32_optimizer.set_lr(lr)

    def state_dict(self) -> Dict[str, Any]:
        """The inner optimizer's state (over the flat master), the loss scale (as fairseq saves
        it) and the scaler's counters (fairseq does not save them: its resumed runs restart the
        scale window). The masters themselves go into the checkpoint as the model's weights
        (module description)."""
        state = self.fp32_optimizer.state_dict()
        if self.scaler is not None:
            state["loss_scale"] = self.scaler.loss_scale
            state["loss_scaler_counters"] = {name: getattr(self.scaler, name)
                                             for name in SCALER_COUNTERS}
        return state

    def load_state_dict(self, state_dict: Dict[str, Any],
                        optimizer_overrides: Optional[Dict[str, Any]] = None) -> None:
        state_dict = dict(state_dict)
        counters = state_dict.pop("loss_scaler_counters", None)
        if "loss_scale" in state_dict and self.scaler is not None:
            self.scaler.loss_scale = state_dict["loss_scale"]
            for name, value in (counters or {}).items():
                if name in SCALER_COUNTERS:
                    setattr(self.scaler, name, value)
        self.fp32_optimizer.load_state_dict(state_dict, optimizer_overrides)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss``, multiplied by the loss scale under float16."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()
        self._gradients = "model"

    def multiply_grads(self, c: Any) -> None:
        """Multiply the gradients by ``c``: deferred and folded into one multiplication of the
        flat gradient before the update (the norm is read through the same factor)."""
        self._multiply_factor = self._multiply_factor * c

    def clip_grad_norm(self, max_norm: float,
                       aggregate_norm_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                       ) -> torch.Tensor:
        """The gradients' L2 norm; with ``max_norm`` > 0 they are scaled down to it. Under
        float16 the norm is read once on the host, fairseq's scaler checks it for an overflow
        (raising ``OverflowError``: the trainer skips the update and lowers the scale), and it
        is returned as a host tensor."""
        self._gather_gradients()
        norm = self._multiply_factor * self.fp32_optimizer.clip_grad_norm(0, aggregate_norm_fn)
        if self.scaler is None:
            if max_norm > 0.0:
                self._multiply_factor = self._multiply_factor \
                    * (max_norm / (norm + 1e-6)).clamp_(max=1.0)
            return norm
        value = float(norm)  # the one host-device synchronisation of a float16 update
        if value > max_norm > 0.0:
            self._multiply_factor = self._multiply_factor * (max_norm / value)
        self.scaler.check_overflow(value)
        return torch.tensor(value)

    def step(self, closure: Optional[Callable] = None, groups: Optional[Any] = None,
             **unused: Any) -> None:
        """Unscale the flat gradient (one multiplication), update the masters with the inner
        optimizer, give the model the rounded weights (one multi-tensor copy)."""
        self._gather_gradients()
        factor = self._multiply_factor
        if torch.is_tensor(factor) or factor != 1.0:
            self.fp32_params.grad.mul_(factor)
        self._multiply_factor = 1.0
        self.fp32_optimizer.step(closure, groups=groups)
        if self.scaler is not None:
            self.scaler.update()
        self.copy_masters_to_model()

    def zero_grad(self) -> None:
        for p in self.model_params:
            p.grad = None
        self._gradients = "zeroed"
        self._multiply_factor = 1.0 if self.scaler is None \
            else 1.0 / float(self.scaler.loss_scale)

    @property
    def supports_flat_params(self) -> bool:
        return True

    # -- the masters ---------------------------------------------------------------------------

    def master_of(self) -> Dict[int, torch.Tensor]:
        """``id(parameter)`` -> its float32 master (a view of the flat tensor)."""
        return {id(p): view for p, view in zip(self.model_params, self._master_views)}

    def copy_masters_to_model(self) -> None:
        """The model's weights become the masters, rounded (one multi-tensor copy)."""
        with torch.no_grad():
            torch._foreach_copy_(self.model_params, self._master_views)

    def load_masters(self, weights: Dict[int, torch.Tensor]) -> int:
        """Set the masters of the parameters ``weights`` names (``id(parameter)`` -> float32
        weights), then the model's weights from them; returns how many were set."""
        pairs = [(view, weights[id(p)]) for p, view in zip(self.model_params,
                                                            self._master_views)
                 if id(p) in weights]
        if pairs:
            with torch.no_grad():
                torch._foreach_copy_([v for v, _ in pairs],
                                     [w.to(v.device) for v, w in pairs])
            self.copy_masters_to_model()
        return len(pairs)

    def _gather_gradients(self) -> None:
        """Copy the model's new gradients into the flat float32 gradient (once per backward);
        parameters without a gradient get zeros."""
        if self._gradients == "masters":
            return
        with torch.no_grad():
            if self._gradients == "zeroed":
                self.fp32_params.grad.zero_()
            else:
                present = [(view, p.grad) for p, view in zip(self.model_params,
                                                             self._master_grad_views)
                           if p.grad is not None]
                absent = [view for p, view in zip(self.model_params, self._master_grad_views)
                          if p.grad is None]
                if absent:
                    torch._foreach_zero_(absent)
                if present:
                    torch._foreach_copy_([v for v, _ in present], [g for _, g in present])
        self._gradients = "masters"


def _views(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Consecutive views of ``flat`` shaped like ``params``."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset: offset + p.numel()].view(p.shape))
        offset += p.numel()
    return views
