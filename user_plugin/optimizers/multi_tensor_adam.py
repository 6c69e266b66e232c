"""Adam (paper §5.3: beta_1 = 0.9, beta_2 = 0.98, epsilon = 1e-9) as multi-tensor operations,
registered as the fairseq optimizer ``vaswani_adam``.

What it replaces, and why: without NVIDIA's apex (not installable on current CUDA and Python
versions), fairseq's ``--optimizer adam`` runs its own Python ``Adam``, a loop over every
parameter tensor with about ten tensor operations each, and fairseq's gradient-norm function
computes one norm per tensor. A base Transformer has about 190 parameter tensors, so one update
launches some 2,000 small operations (CUDA kernels on a GPU) before the model's next forward
pass can start. Under fairseq's ``--fp16`` and the plugin's ``--fp16`` / ``--bf16`` the float32
master weights are one flat tensor and the loop runs once; in float32 and under the plugin's
``--bf16 --amp`` (autocast over float32 weights) it runs in full. Here the update is PyTorch's
``AdamW`` over all tensors at once (its ``fused`` form by default: one operation for the whole
update; ``foreach``: one per step of the formula) and the norm is PyTorch's multi-tensor norm,
so an update costs five operator calls whatever the number of tensors. On a 2-core CPU it is
also 2.2 times faster than fairseq's for the base model's 253 tensors
(``scripts/benchmark_optimizer.py``); ``foreach`` is slower there (PyTorch runs it tensor by
tensor on a CPU) and is offered for GPUs.

The update is fairseq's, to rounding: weight decay, if any, is decoupled (fairseq's ``adam`` is
AdamW too), with no AMSGrad. The two codes place epsilon differently: fairseq's divides by
``sqrt(v) + eps`` and folds both bias corrections into the step size (the "more efficient"
ordering of Kingma and Ba, §2); PyTorch divides by ``sqrt(v / (1 - beta_2^t)) + eps``
(their Algorithm 1). Before each update epsilon is therefore given to PyTorch as
``eps / sqrt(1 - beta_2^t)``, which makes the two updates the same function of the gradients;
without it, weights whose gradients are near epsilon would move differently
(``tests/test_multi_tensor_adam.py`` compares both step by step).

``--memory-efficient-fp16`` keeps float16 weights and expects the optimizer to hold float32
state of its own; PyTorch's ``AdamW`` keeps its state in the weights' type, so that mode is
refused (use ``--fp16``, ``--bf16`` or fairseq's ``adam``).
"""

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

from ..files.errors import UserError
from ..paper import ADAM_BETAS, ADAM_EPS

OPTIMIZER_NAME = "vaswani_adam"
IMPLEMENTATIONS = ("fused", "foreach")
ADAM_IMPLEMENTATION = ChoiceEnum(IMPLEMENTATIONS)


@dataclass
class MultiTensorAdamConfig(FairseqDataclass):
    adam_betas: Any = field(
        default=f"({ADAM_BETAS[0]}, {ADAM_BETAS[1]})",
        metadata={"help": "beta_1, beta_2 (paper §5.3: (0.9, 0.98))"},
    )
    adam_eps: float = field(default=ADAM_EPS, metadata={"help": "epsilon (paper: 1e-9)"})
    weight_decay: float = field(
        default=0.0, metadata={"help": "decoupled weight decay, as fairseq's adam (paper: 0)"}
    )
    adam_implementation: ADAM_IMPLEMENTATION = field(
        default="fused",
        metadata={"help": "PyTorch's multi-tensor form: fused (one operation per update, on "
                          "CUDA and CPU) or foreach (one per step of the formula)"},
    )
    lr: List[float] = II("optimization.lr")
    memory_efficient_fp16: bool = II("common.memory_efficient_fp16")


def parse_betas(value: Any) -> tuple:
    """``"(0.9, 0.98)"`` (fairseq's spelling on the command line) or a sequence -> a pair of
    floats; a one-line :class:`UserError` naming the option otherwise."""
    if isinstance(value, str):
        parts = value.strip().strip("()[]").split(",")
    else:
        parts = list(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
    try:
        betas = tuple(float(part) for part in parts if str(part).strip())
    except ValueError:
        betas = ()
    if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
        raise UserError(f"--adam-betas {value!r}: expected two numbers in [0, 1), "
                        "e.g. '(0.9, 0.98)'")
    return betas


@register_optimizer(OPTIMIZER_NAME, dataclass=MultiTensorAdamConfig)
class MultiTensorAdam(FairseqOptimizer):
    """fairseq's optimizer interface over ``torch.optim.AdamW`` (module docstring)."""

    def __init__(self, cfg: MultiTensorAdamConfig, params: Iterable) -> None:
        super().__init__(cfg)
        if getattr(cfg, "memory_efficient_fp16", False):
            raise UserError(f"--optimizer {OPTIMIZER_NAME} does not support "
                            "--memory-efficient-fp16 (its state would be float16): use --fp16, "
                            "--bf16 or --optimizer adam")
        if cfg.adam_implementation not in IMPLEMENTATIONS:
            raise UserError(f"--adam-implementation {cfg.adam_implementation!r}: one of "
                            f"{', '.join(IMPLEMENTATIONS)}")
        fused = cfg.adam_implementation == "fused"
        self._optimizer = torch.optim.AdamW(params, **self.optimizer_config,
                                            foreach=not fused, fused=fused)
        self._updates = 0  # the t of the next update is this + 1

    def step(self, closure: Optional[Callable] = None, scale: float = 1.0,
             groups: Optional[Any] = None) -> None:
        """One Adam update, epsilon placed as fairseq's adam places it (module docstring)."""
        self._updates += 1
        for group in self.param_groups:
            beta2 = group["betas"][1]
            group["eps"] = self.cfg.adam_eps / math.sqrt(1.0 - beta2 ** self._updates)
        super().step(closure, scale=scale, groups=groups)

    def load_state_dict(self, state_dict: dict, optimizer_overrides: Optional[dict] = None
                        ) -> None:
        """Resume: the update count continues from the saved state's."""
        super().load_state_dict(state_dict, optimizer_overrides)
        # every tensor has taken the same updates: one read (on a GPU, one synchronisation)
        state = next((s for s in self.optimizer.state.values() if "step" in s), None)
        self._updates = 0 if state is None else int(state["step"])

    @property
    def optimizer_config(self) -> Dict[str, Any]:
        """The settings a resumed run takes from the command line, not from the checkpoint."""
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        return {"lr": lr, "betas": parse_betas(self.cfg.adam_betas), "eps": self.cfg.adam_eps,
                "weight_decay": self.cfg.weight_decay}

    def clip_grad_norm(self, max_norm: float,
                       aggregate_norm_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                       ) -> torch.Tensor:
        """The gradients' total L2 norm (float32), computed over all tensors at once; when
        ``max_norm`` > 0 and the norm exceeds it, the gradients are scaled down to it, as
        fairseq's ``clip_grad_norm_`` does."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        norms = torch._foreach_norm([g.float() if g.dtype != torch.float32 else g
                                     for g in grads])
        total = torch.linalg.vector_norm(torch.stack(norms))
        if aggregate_norm_fn is not None:
            total = aggregate_norm_fn(total)
        if max_norm > 0:
            torch._foreach_mul_(grads, (float(max_norm) / (total + 1e-6)).clamp_(max=1.0))
        return total

    @property
    def supports_flat_params(self) -> bool:
        """One flat float32 tensor (fairseq's ``--fp16`` masters) is a valid parameter list."""
        return True

    @property
    def supports_memory_efficient_fp16(self) -> bool:
        """No: the state would be kept in float16 (module docstring)."""
        return False
