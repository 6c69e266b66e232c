"""``vaswani_adam``: Adam over all parameter tensors at once (user_plugin/optimizers).

* step by step against fairseq's own ``adam`` on the same weights and gradients: the same
  updates, up to epsilon's placement (module docstring), with and without weight decay;
* the gradient norm and clipping against fairseq's ``clip_grad_norm_``;
* the work of one update does not grow with the number of tensors (the point of it);
* ``fairseq-train --optimizer vaswani_adam`` trains, saves, resumes the optimizer state, and
  refuses ``--memory-efficient-fp16`` in one line.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import SimpleNamespace

import forked_cli
import pytest
import torch
from cli import TINY_MODEL_ARGS, USER_DIR, fairseq_env, json_log_records, run_fairseq
from fairseq import utils as fairseq_utils
from fairseq.optim.adam import FairseqAdam

from user_plugin.files import UserError
from user_plugin.optimizers.multi_tensor_adam import (
    MultiTensorAdam,
    MultiTensorAdamConfig,
    parse_betas,
)


def parameter_set(seed: int, shapes) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=generator)) for shape in shapes]


SHAPES = [(64, 32), (32,), (128, 64), (64,), (7,), (300, 16)]


def both_optimizers(weight_decay: float, implementation: str):
    cfg = SimpleNamespace(lr=[3e-3], adam_betas="(0.9, 0.98)", adam_eps=1e-9,
                          weight_decay=weight_decay, use_old_adam=False, fp16_adam_stats=False,
                          tpu=False, adam_implementation=implementation)
    ours_params, theirs_params = parameter_set(0, SHAPES), parameter_set(0, SHAPES)
    return (MultiTensorAdam(cfg, ours_params), ours_params,
            FairseqAdam(cfg, theirs_params), theirs_params)


@pytest.mark.parametrize("implementation", ["foreach", "fused"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_updates_match_fairseqs_adam_step_by_step(weight_decay, implementation):
    ours, ours_params, theirs, theirs_params = both_optimizers(weight_decay, implementation)
    generator = torch.Generator().manual_seed(1)
    for step in range(30):
        for a, b in zip(ours_params, theirs_params):
            grad = torch.randn(a.shape, generator=generator) * (10.0 ** (step % 3 - 1))
            a.grad, b.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()
        for a, b in zip(ours_params, theirs_params):
            # the first update is where epsilon's placement shows most: placed as PyTorch
            # places it, weights with near-epsilon gradients would move ~1e-5 apart at once;
            # afterwards float32 roundings (of the decay, of sqrt) random-walk by a few ulps
            tolerance = 1e-6 if step == 0 else 1e-5
            assert torch.allclose(a, b, rtol=0, atol=tolerance), (step, (a - b).abs().max())
    moved = max(float((a - b).abs().max()) for a, b in zip(ours_params,
                                                             parameter_set(0, SHAPES)))
    assert moved > 1e-2  # the comparison is not between two optimizers that did nothing


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e6])
def test_gradient_norm_and_clipping_match_fairseq(max_norm):
    ours, ours_params, _, theirs_params = both_optimizers(0.0, "foreach")
    generator = torch.Generator().manual_seed(2)
    for a, b in zip(ours_params, theirs_params):
        grad = torch.randn(a.shape, generator=generator)
        a.grad, b.grad = grad.clone(), grad.clone()
    norm = ours.clip_grad_norm(max_norm)
    expected = fairseq_utils.clip_grad_norm_(theirs_params, max_norm)
    assert torch.allclose(norm, expected, rtol=1e-6)
    for a, b in zip(ours_params, theirs_params):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=1e-7)
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ours_params]))
    if 0 < max_norm < float(expected):
        assert abs(float(clipped) - max_norm) < 1e-4
    else:
        assert torch.allclose(clipped, expected, rtol=1e-6)


def operations_per_update(optimizer_class, implementation: str, tensors: int) -> Counter:
    """The operator calls made from Python (what a GPU would launch kernels for) that
    torch.profiler sees in one ``clip_grad_norm`` + ``step``, for ``tensors`` parameter tensors
    of 64 values: the calls at the top, not those an operator makes inside itself."""
    cfg = SimpleNamespace(lr=[1e-3], adam_betas="(0.9, 0.98)", adam_eps=1e-9, weight_decay=0.0,
                          use_old_adam=False, fp16_adam_stats=False, tpu=False,
                          adam_implementation=implementation)
    params = parameter_set(3, [(64,)] * tensors)
    optimizer = optimizer_class(cfg, params)
    for param in params:
        param.grad = torch.ones_like(param)
    optimizer.step()  # the state is created on the first update
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        optimizer.clip_grad_norm(0.0)
        optimizer.step()
    return Counter(event.name for event in profile.events() if event.name.startswith("aten::")
                   and (event.cpu_parent is None
                        or not event.cpu_parent.name.startswith("aten::")))


def test_one_update_costs_the_same_for_10_or_100_tensors_unlike_fairseqs_adam():
    theirs = [sum(operations_per_update(FairseqAdam, "fused", n).values()) for n in (10, 100)]
    assert theirs[1] > 9 * theirs[0] > 90  # fairseq's Python loop: ~12 calls per tensor
    fused = [operations_per_update(MultiTensorAdam, "fused", n) for n in (10, 100)]
    assert fused[0] == fused[1] and sum(fused[1].values()) <= 6, fused[1]
    assert fused[1]["aten::_fused_adamw_"] == 1
    # foreach: the same calls, plus reads of the per-tensor step counters, which PyTorch keeps
    # on the host (they launch nothing on a GPU)
    foreach = [operations_per_update(MultiTensorAdam, "foreach", n) for n in (10, 100)]
    for counts in foreach:
        del counts["aten::item"]
    assert foreach[0] == foreach[1] and sum(foreach[1].values()) < 20, foreach[1]


def test_betas_are_parsed_as_fairseq_spells_them_and_refused_otherwise():
    assert parse_betas("(0.9,0.98)") == parse_betas("(0.9, 0.98)") == (0.9, 0.98)
    assert parse_betas([0.9, 0.997]) == (0.9, 0.997)
    for bad in ("(0.9)", "(0.9, 1.5)", "(a, b)"):
        with pytest.raises(UserError, match="--adam-betas"):
            parse_betas(bad)
    assert MultiTensorAdamConfig().adam_betas == "(0.9, 0.98)"  # the paper's §5.3


def train_args(data_bin, save_dir, max_update: int, *extra) -> list:
    return [
        data_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1", *TINY_MODEL_ARGS,
        "--optimizer", "vaswani_adam", "--lr", "1", "--lr-scheduler", "vaswani_inverse_sqrt",
        "--warmup-updates", "20", "--criterion", "vaswani_label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--max-tokens", "1500", "--max-update", str(max_update),
        "--save-dir", save_dir, "--log-format", "json", "--log-interval", "5",
        "--required-batch-size-multiple", "1", "--num-workers", "0", "--no-epoch-checkpoints",
        *extra,
    ]


def test_fairseq_train_with_vaswani_adam_lowers_the_loss_and_resumes(multi30k_bin, tmp_path):
    save_dir = tmp_path / "checkpoints"
    first = run_fairseq("train", train_args(multi30k_bin.data_bin, save_dir, 20))
    losses = [float(r["loss"]) for r in json_log_records(first.stdout + first.stderr,
                                                           "train_inner")]
    assert len(losses) >= 3 and losses[-1] < losses[0] - 0.3, losses
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=False)
    assert state["last_optimizer_state"]["state"], "no Adam moments saved"
    assert state["extra_state"]["train_iterator"]["epoch"] >= 1
    resumed = run_fairseq("train", train_args(multi30k_bin.data_bin, save_dir, 30))
    log = resumed.stdout + resumed.stderr
    assert "Loaded checkpoint" in log and "@ 20 updates)" in log, log[-3000:]
    updates = [int(r["num_updates"]) for r in json_log_records(log, "train_inner")]
    assert updates and min(updates) > 20 and max(updates) == 30, updates
    # the Adam moments and update count went on from the checkpoint: 30 updates, not 10
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=False)
    steps = {int(s["step"]) for s in state["last_optimizer_state"]["state"].values()}
    assert steps == {30}, steps


def test_memory_efficient_fp16_is_refused_in_one_line(multi30k_bin, tmp_path):
    args = train_args(multi30k_bin.data_bin, tmp_path / "ckpt", 2, "--memory-efficient-fp16")
    proc = forked_cli.run([sys.executable, "-m", "fairseq_cli.train", *map(str, args)],
                          env=fairseq_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "memory" in last.lower() and "vaswani_adam" in last, proc.stderr[-2000:]
