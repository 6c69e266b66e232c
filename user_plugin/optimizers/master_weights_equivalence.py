"""What :class:`~.float32_masters.Float32MasterOptimizer` must equal, measured step by step on
any device: the tests run these on a CPU, the GPU check on CUDA (``scripts/gpu_check/
equivalence.py``).

* :func:`fp16_against_fairseq`: float16 parameters with fairseq's ``FP16Optimizer`` and with
  ours, driven as fairseq's trainer drives them (zero the gradients, backward of the scaled
  loss, divide by the sample size, the norm and the overflow check, the update) through
  gradients that sometimes overflow, with a short scale window: the same overflows, the same
  loss scales, and the same weights (to the last bit with fairseq's ``adam`` inside both and no
  clipping: the masters only differ in layout, flat or per tensor);
* :func:`bf16_against_fairseq`: the same for bfloat16 against fairseq's non-TPU bf16 path
  (``FP16Optimizer`` without a loss scaler);
* :func:`bf16_against_float32`: a small Transformer trained a few steps in float32 and with
  bfloat16 weights and float32 masters, from the same float32 weights: how far the losses and
  the weights' paths differ (:data:`BF16_TOLERANCES`).

On a CPU fairseq's flat ``FP16Optimizer`` needs ``torch.cuda.current_device()``; there its
per-tensor form (``--fp16-no-flatten-grads``) is the reference, which updates every element as
the flat form does.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq import optim
from omegaconf import OmegaConf

from ..paper import ADAM_EPS, adam_betas_option
from .float32_masters import Float32MasterOptimizer

SHAPES = ((96, 64), (64,), (128, 96), (128,), (7,), (300, 16))
#: bfloat16 weights and float32 masters against float32 training, after
#: :func:`bf16_against_float32`'s steps: the largest relative difference of a step's loss, and
#: of the weights' change from their start (|w_bf16 - w_fp32| / |w_fp32 - w_0|, over all
#: weights). bfloat16 keeps 8 significant bits: each forward differs by about 2^-8 relative.
BF16_TOLERANCES = {"loss": 3e-2, "weight_path": 0.2}


def training_config(precision: str, optimizer: str = "adam", lr: float = 1e-3,
                    scale_window: Optional[int] = 4, init_scale: float = 128.0,
                    min_loss_scale: float = 1e-4, flatten: bool = True) -> Any:
    """The configuration sections fairseq's precision wrappers and ``optimizer`` read."""
    if optimizer == "vaswani_adam":
        from . import multi_tensor_adam  # noqa: F401  (registers vaswani_adam)

        section = {"_name": "vaswani_adam", "adam_betas": adam_betas_option(), "adam_eps": ADAM_EPS,
                   "weight_decay": 0.0, "adam_implementation": "fused", "lr": [lr],
                   "memory_efficient_fp16": False}
    else:
        section = {"_name": "adam", "adam_betas": adam_betas_option(), "adam_eps": ADAM_EPS,
                   "weight_decay": 0.0, "use_old_adam": False, "fp16_adam_stats": False,
                   "tpu": False, "lr": [lr]}
    return OmegaConf.create({
        "common": {"fp16": precision == "fp16", "bf16": precision == "bf16",
                   "memory_efficient_fp16": False, "memory_efficient_bf16": False,
                   "fp16_no_flatten_grads": not flatten, "fp16_init_scale": init_scale,
                   "fp16_scale_window": scale_window, "fp16_scale_tolerance": 0.0,
                   "threshold_loss_scale": None, "min_loss_scale": min_loss_scale,
                   "model_parallel_size": 1, "tpu": False},
        "optimization": {"update_freq": [1], "lr": [lr], "clip_norm": 0.0},
        "distributed_training": {"distributed_world_size": 1},
        "optimizer": section,
    })


def _parameters(shapes: Sequence[Tuple[int, ...]], dtype: torch.dtype, device: str,
                seed: int) -> List[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=generator).to(device, dtype))
            for s in shapes]


def _drive(optimizer: Any, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
           sample_size: float, max_norm: float) -> Dict[str, Any]:
    """One update as fairseq's trainer makes it; ``grads`` are the loss's float32 gradients."""
    optimizer.zero_grad()
    loss = sum((p.float() * g).sum() for p, g in zip(params, grads))
    optimizer.backward(loss)
    optimizer.multiply_grads(1.0 / sample_size)
    try:
        norm = float(optimizer.clip_grad_norm(max_norm))
    except OverflowError:
        optimizer.zero_grad()
        return {"overflow": True, "norm": None}
    optimizer.step()
    return {"overflow": False, "norm": norm}


def _reference(precision: str, params: List[torch.nn.Parameter], device: str, **config: Any
               ) -> Any:
    """fairseq's ``FP16Optimizer`` (flat on CUDA; per tensor on a CPU, module description)."""
    flatten = device != "cpu" and precision == "fp16"
    cfg = training_config(precision, flatten=flatten, **config)
    return optim.FP16Optimizer.build_optimizer(cfg, params)


def _against_fairseq(precision: str, device: str, optimizer: str, steps: int, max_norm: float,
                     overflow_every: int, seed: int) -> Dict[str, Any]:
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    ours_params = _parameters(SHAPES, dtype, device, seed)
    theirs_params = _parameters(SHAPES, dtype, device, seed)
    ours = Float32MasterOptimizer.build_optimizer(
        training_config(precision, optimizer=optimizer), ours_params)
    theirs = _reference(precision, theirs_params, device)
    generator = torch.Generator().manual_seed(seed + 1)
    start = [p.detach().float().clone() for p in ours_params]
    history = []
    for step in range(steps):
        scale = 10.0 ** (step % 3 - 1)
        grads = [torch.randn(p.shape, generator=generator).mul_(scale).to(device)
                 for p in ours_params]
        if overflow_every and step % overflow_every == overflow_every - 1:
            grads[step % len(grads)][..., 0] = 1e6  # overflows float16 once scaled
        a = _drive(ours, ours_params, grads, 250.0, max_norm)
        b = _drive(theirs, theirs_params, grads, 250.0, max_norm)
        difference = max(float((p.detach().float() - q.detach().float()).abs().max())
                         for p, q in zip(ours_params, theirs_params))
        history.append({
            "overflow": [a["overflow"], b["overflow"]],
            "loss_scale": [getattr(ours.scaler, "loss_scale", None),
                           getattr(theirs.scaler, "loss_scale", None)],
            "norm_relative_difference": None if a["norm"] is None or b["norm"] is None
            else abs(a["norm"] - b["norm"]) / max(abs(b["norm"]), 1e-30),
            "weight_difference": difference,
        })
    moved = max(float((p.detach().float() - s).abs().max())
                for p, s in zip(ours_params, start))
    return {
        "precision": precision, "optimizer": optimizer, "device": device, "steps": steps,
        "max_norm": max_norm,
        "same_overflows": all(h["overflow"][0] == h["overflow"][1] for h in history),
        "overflows": sum(h["overflow"][1] for h in history),
        "same_loss_scales": all(h["loss_scale"][0] == h["loss_scale"][1] for h in history),
        "loss_scales": sorted({h["loss_scale"][1] for h in history if h["loss_scale"][1]}),
        "max_weight_difference": max(h["weight_difference"] for h in history),
        "max_norm_relative_difference": max((h["norm_relative_difference"] for h in history
                                             if h["norm_relative_difference"] is not None),
                                            default=0.0),
        "weights_moved": moved,
    }


def fp16_against_fairseq(device: str = "cpu", optimizer: str = "adam", steps: int = 30,
                         max_norm: float = 0.0, overflow_every: int = 7, seed: int = 0
                         ) -> Dict[str, Any]:
    """Ours against fairseq's ``FP16Optimizer`` in float16 (module description)."""
    return _against_fairseq("fp16", device, optimizer, steps, max_norm, overflow_every, seed)


def bf16_against_fairseq(device: str = "cpu", optimizer: str = "adam", steps: int = 30,
                         max_norm: float = 0.0, seed: int = 0) -> Dict[str, Any]:
    """Ours against fairseq's non-TPU bfloat16 path (``FP16Optimizer``, no loss scaler)."""
    return _against_fairseq("bf16", device, optimizer, steps, max_norm, 0, seed)


def _small_transformer(vocabulary: int, seed: int) -> Tuple[Any, Any]:
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from user_plugin.models.transformer_config import VaswaniTransformerConfig
    from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

    from .. import models  # noqa: F401  (registers our architectures)

    dictionary = Dictionary()
    for i in range(vocabulary - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    args = argparse.Namespace(encoder_layers=2, decoder_layers=2, encoder_embed_dim=64,
                              decoder_embed_dim=64, encoder_ffn_embed_dim=128,
                              decoder_ffn_embed_dim=128, encoder_attention_heads=4,
                              decoder_attention_heads=4, dropout=0.0, share_all_embeddings=True)
    ARCH_CONFIG_REGISTRY["vaswani_base"](args)
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(seed)
    model = VaswaniTransformerModel.build_model(VaswaniTransformerConfig.from_namespace(args),
                                                task)
    return model, dictionary


def _batches(dictionary: Any, count: int, device: str, seed: int) -> List[Dict[str, Any]]:
    """Translation batches (left-padded sources, right-padded targets) with ``ntokens``."""
    generator = torch.Generator().manual_seed(seed)
    pad, eos, first = dictionary.pad(), dictionary.eos(), dictionary.nspecial
    batches = []
    for _ in range(count):
        rows, src_len, tgt_len = 8, 12, 10
        src = torch.full((rows, src_len), pad)
        target = torch.full((rows, tgt_len), pad)
        prev = torch.full((rows, tgt_len), pad)
        for i in range(rows):
            n = int(torch.randint(3, src_len + 1, (1,), generator=generator))
            m = int(torch.randint(3, tgt_len + 1, (1,), generator=generator))
            src[i, src_len - n:] = torch.randint(first, len(dictionary), (n,),
                                                 generator=generator)
            src[i, -1] = eos
            words = torch.randint(first, len(dictionary), (m - 1,), generator=generator)
            target[i, :m] = torch.cat([words, torch.tensor([eos])])
            prev[i, :m] = torch.cat([torch.tensor([eos]), words])
        batches.append({"net_input": {"src_tokens": src.to(device),
                                      "src_lengths": src.ne(pad).sum(1).to(device),
                                      "prev_output_tokens": prev.to(device)},
                        "target": target.to(device), "ntokens": int(target.ne(pad).sum())})
    return batches


def bf16_against_float32(device: str = "cpu", steps: int = 8, seed: int = 0,
                         lr: float = 3e-3) -> Dict[str, Any]:
    """A 2+2-layer Transformer trained ``steps`` updates in float32 (fairseq's ``adam``) and
    with bfloat16 weights and float32 masters (ours, fairseq's ``adam`` inside), from the same
    float32 weights, on the same batches; the differences against :data:`BF16_TOLERANCES`."""
    from user_plugin.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropy

    reference, dictionary = _small_transformer(120, seed)
    model = copy.deepcopy(reference)
    initial = [p.detach().clone() for p in reference.parameters()]
    reference.to(device).train()
    model.to(device=device, dtype=torch.bfloat16).train()
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    criterion = LabelSmoothedCrossEntropy(task, False, 0.1)
    fp32 = optim.build_optimizer(training_config("fp32", lr=lr).optimizer,
                                 list(reference.parameters()))
    masters = Float32MasterOptimizer.build_optimizer(
        training_config("bf16", lr=lr), list(model.parameters()), initial_weights=initial)
    losses = []
    for sample in _batches(dictionary, steps, device, seed + 1):
        pair = []
        for net, optimizer in ((reference, fp32), (model, masters)):
            optimizer.zero_grad()
            loss, sample_size, _ = criterion(net, sample)
            optimizer.backward(loss)
            optimizer.multiply_grads(1.0 / sample_size)
            optimizer.clip_grad_norm(0.0)
            optimizer.step()
            pair.append(float(loss) / sample_size)
        losses.append(pair)
    by_param = masters.master_of()
    path = sum(float((p.detach() - w.to(device)).float().norm() ** 2)
               for p, w in zip(reference.parameters(), initial)) ** 0.5
    apart = sum(float((by_param[id(q)] - p.detach()).norm() ** 2)
                for p, q in zip(reference.parameters(), model.parameters())) ** 0.5
    rounded = max(float((by_param[id(q)].to(torch.bfloat16) - q.detach()).abs().max())
                  for q in model.parameters())
    result = {
        "device": device, "steps": steps, "losses": losses,
        "loss_relative_difference": max(abs(a - b) / abs(a) for a, b in losses),
        "weight_path_relative_difference": apart / path,
        "model_is_rounded_masters": rounded == 0.0,
        "tolerances": BF16_TOLERANCES,
    }
    result["passed"] = (result["loss_relative_difference"] <= BF16_TOLERANCES["loss"]
                        and result["weight_path_relative_difference"]
                        <= BF16_TOLERANCES["weight_path"]
                        and result["model_is_rounded_masters"])
    return result
