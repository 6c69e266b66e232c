"""Resuming a checkpoint whose optimizer state another precision mode wrote
(``user_plugin/optimizers/state_layouts.py``, row ``optimizer_state_layouts``):

* a ``--bf16 --amp`` checkpoint (the layout the plugin's ``--bf16`` wrote before float32
  masters: fairseq's ``FairseqAdam``, one state per tensor) resumed with ``--bf16``: the flat
  moments are the per-tensor ones, parameter by parameter, the update count, learning rate and
  weights carry over, training goes on from update 4 with the losses of the run it continues;
  the new checkpoint resumed with ``--bf16 --amp`` again converts back;
* fairseq's ``FP16Optimizer`` state (flat float32 moments in fairseq's own flattening, a loss
  scale; fairseq's ``--fp16`` does not run on a CPU, so it is built from a real run's
  per-tensor state) and ``MemoryEfficientFP16Optimizer``'s (per tensor, a loss scale) resumed
  with ``--fp16``: moments, update count and loss scale carry over;
* another ``--optimizer``, or a state that does not fit the model: one error line naming the
  cause and the way out; ``--reset-optimizer`` resumes without converting;
* a stock ``--arch transformer`` run keeps fairseq's refusal.
"""

from __future__ import annotations

import logging
import math
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import forked_cli
import pytest
import torch
from cli import PAPER_OPTIMIZATION_ARGS, USER_DIR, fairseq_env, json_log_records, run_fairseq

from user_plugin.artifacts.checkpoints import save_checkpoint
from user_plugin.files.errors import UserError

MODEL_ARGS = [
    "--arch", "vaswani_base", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings",
]
RUN_ARGS = ["--cpu", "--seed", "1", *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", "40",
            "--max-tokens", "1000", "--required-batch-size-multiple", "1"]
CONVERTED = "user_plugin.fairseq_patches.optimizer_state"


def train_args(data_bin, save_dir, max_update: int, *flags) -> list:
    return [str(a) for a in (
        data_bin, "--user-dir", USER_DIR, *MODEL_ARGS, *RUN_ARGS,
        "--max-update", max_update, "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--log-format", "json", "--log-interval", "1", "--num-workers", "0", *flags)]


def train(data_bin, save_dir, max_update: int, *flags):
    return run_fairseq("train", train_args(data_bin, save_dir, max_update, *flags))


def trainer_for(data_bin, *flags, model_args=MODEL_ARGS) -> SimpleNamespace:
    """fairseq's option parsing, launcher and ``Trainer`` for ``flags`` (no step taken), and a
    batch of eight validation pairs to train on."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq.trainer import Trainer

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data_bin), "--user-dir", USER_DIR, *model_args, *RUN_ARGS, *flags])
    cfg = convert_namespace_to_omegaconf(args)
    made = SimpleNamespace()

    def main(cfg):
        task = tasks.setup_task(cfg.task)
        task.load_dataset("valid")
        model = task.build_model(cfg.model)
        made.trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
        dataset = task.dataset("valid")
        made.sample = dataset.collater([dataset[i] for i in range(8)])

    distributed_utils.call_main(cfg, main)
    return made


def segments(flat: torch.Tensor, params) -> list:
    """``flat`` cut into consecutive pieces shaped like ``params``."""
    pieces, offset = [], 0
    for p in params:
        pieces.append(flat[offset: offset + p.numel()].view(p.shape))
        offset += p.numel()
    assert offset == flat.numel()
    return pieces


@pytest.fixture(scope="module")
def autocast_checkpoint(multi30k_bin, tmp_path_factory) -> SimpleNamespace:
    """Three updates of ``--bf16 --amp``, the optimizer layout the plugin's ``--bf16`` wrote
    before float32 masters (``FairseqAdam``, one state per tensor), in ``save_dir``."""
    save_dir = tmp_path_factory.mktemp("layouts") / "autocast"
    train(multi30k_bin.data_bin, save_dir, 3, "--bf16", "--amp")
    path = save_dir / "checkpoint_last.pt"
    state = torch.load(path, weights_only=False)
    assert state["optimizer_history"][-1]["optimizer_name"] == "FairseqAdam"
    optimizer_state = state["last_optimizer_state"]
    assert len(optimizer_state["param_groups"][0]["params"]) > 1  # per tensor
    return SimpleNamespace(save_dir=save_dir, path=path, state=state,
                           data_bin=multi30k_bin.data_bin)


def fresh_copy(checkpoint, tmp_path, name: str = "run"):
    copy = tmp_path / name
    shutil.copytree(checkpoint.save_dir, copy)
    return copy


# --------------------------------------------------------------------------------------------
# the plugin's --bf16 before float32 masters


def test_an_autocast_checkpoint_resumes_under_bf16_with_its_moments(autocast_checkpoint,
                                                                   caplog):
    from user_plugin.optimizers.float32_masters import Float32MasterOptimizer

    saved = autocast_checkpoint.state
    per_tensor = saved["last_optimizer_state"]
    made = trainer_for(autocast_checkpoint.data_bin, "--bf16")
    trainer = made.trainer
    with caplog.at_level(logging.INFO, logger=CONVERTED):
        trainer.load_checkpoint(str(autocast_checkpoint.path))
    optimizer = trainer.optimizer
    assert isinstance(optimizer, Float32MasterOptimizer) and trainer.get_num_updates() == 3
    said = [r.getMessage() for r in caplog.records if r.name == CONVERTED]
    assert len(said) == 1 and "FairseqAdam (one state per parameter tensor) converted to " \
        "Float32MasterOptimizer (one flat float32 tensor)" in said[0], said
    assert "update count 3" in said[0]
    # the checkpoint's history still names the optimizer that wrote its state
    assert [h["optimizer_name"] for h in trainer._optim_history] == ["FairseqAdam"]

    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert len(names) == len(optimizer.model_params) == len(per_tensor["state"])
    flat = optimizer.fp32_optimizer.optimizer.state[optimizer.fp32_params]
    assert flat["step"] == 3
    for key in ("exp_avg", "exp_avg_sq"):
        pieces = segments(flat[key], optimizer.model_params)
        for i, (name, piece) in enumerate(zip(names, pieces)):
            old = per_tensor["state"][per_tensor["param_groups"][0]["params"][i]]
            assert old["step"] == 3
            assert torch.equal(piece, old[key]), (key, name)
            assert old[key].abs().max() > 0, (key, name)
    # the schedule and the weights carry over too
    assert trainer.get_lr() == pytest.approx(per_tensor["param_groups"][0]["lr"], rel=1e-12)
    masters = optimizer.master_of()
    for name, p in trainer.model.named_parameters():
        assert torch.equal(masters[id(p)], saved["model"][name]), name

    log = trainer.train_step([made.sample])
    assert trainer.get_num_updates() == 4 and math.isfinite(log["loss"])
    assert optimizer.fp32_optimizer.optimizer.state[optimizer.fp32_params]["step"] == 4


@pytest.fixture(scope="module")
def resumed_under_bf16(autocast_checkpoint, tmp_path_factory) -> SimpleNamespace:
    """The autocast checkpoint resumed by fairseq-train with ``--bf16`` up to update 6, and a
    straight six-update ``--bf16 --amp`` run to compare with."""
    root = tmp_path_factory.mktemp("resumed")
    resumed = root / "resumed"
    shutil.copytree(autocast_checkpoint.save_dir, resumed)
    data_bin = autocast_checkpoint.data_bin
    proc = train(data_bin, resumed, 6, "--bf16")
    straight = train(data_bin, root / "straight", 6, "--bf16", "--amp")
    return SimpleNamespace(save_dir=resumed, log=proc.stdout + proc.stderr,
                           straight=straight.stdout + straight.stderr, data_bin=data_bin)


def test_the_same_command_continues_the_run_and_its_losses(resumed_under_bf16):
    log = resumed_under_bf16.log
    assert log.count("converted to Float32MasterOptimizer") == 1
    assert "checkpoint_last.pt (epoch 1 @ 3 updates)" in log
    resumed = {int(r["num_updates"]): float(r["loss"])
               for r in json_log_records(log, "train_inner")}
    straight = {int(r["num_updates"]): float(r["loss"])
                for r in json_log_records(resumed_under_bf16.straight, "train_inner")}
    assert sorted(resumed) == [4, 5, 6] and sorted(straight) == [1, 2, 3, 4, 5, 6]
    # the same data, weights, moments and learning rates: within bfloat16's rounding of the
    # straight run, whose loss the resumed run carries on lowering
    for update, loss in resumed.items():
        assert loss == pytest.approx(straight[update], rel=5e-3), (update, resumed, straight)
    assert resumed[6] < straight[1]
    state = torch.load(resumed_under_bf16.save_dir / "checkpoint_last.pt", weights_only=False)
    assert [(h["optimizer_name"], h["num_updates"]) for h in state["optimizer_history"]] == [
        ("FairseqAdam", 3), ("Float32MasterOptimizer", 6)]
    assert state["last_optimizer_state"]["state"][0]["step"] == 6
    assert state["last_optimizer_state"]["param_groups"][0]["params"] == [0]


def test_a_float32_master_checkpoint_resumes_under_bf16_amp_per_tensor(resumed_under_bf16,
                                                                      autocast_checkpoint):
    flat = torch.load(resumed_under_bf16.save_dir / "checkpoint_last.pt", weights_only=False)
    proc = train(resumed_under_bf16.data_bin, resumed_under_bf16.save_dir, 8, "--bf16", "--amp")
    log = proc.stdout + proc.stderr
    assert log.count("optimizer state of Float32MasterOptimizer (one flat float32 tensor) "
                     "converted to FairseqAdam (one state per parameter tensor)") == 1
    assert [int(r["num_updates"]) for r in json_log_records(log, "train_inner")] == [7, 8]
    state = torch.load(resumed_under_bf16.save_dir / "checkpoint_last.pt", weights_only=False)
    groups = state["last_optimizer_state"]["param_groups"]
    before = autocast_checkpoint.state["last_optimizer_state"]["param_groups"]
    assert len(groups[0]["params"]) == len(before[0]["params"])
    assert {s["step"] for s in state["last_optimizer_state"]["state"].values()} == {8}
    assert flat["last_optimizer_state"]["state"][0]["step"] == 6


# --------------------------------------------------------------------------------------------
# fairseq's FP16Optimizer and MemoryEfficientFP16Optimizer


def fairseq_flattened(tensors) -> torch.Tensor:
    """``tensors`` end to end as fairseq's ``FP16Optimizer`` lays out its flat float32 master
    (its own ``build_fp32_params``; it asks CUDA for the device, which only names the flat
    tensor's entry here)."""
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "current_device", lambda: 0)
        flat = _FP16OptimizerMixin.build_fp32_params(SimpleNamespace(), list(tensors))
    (only,) = flat.values()
    return only.data


def fp16_wrapper_checkpoint(autocast_checkpoint, tmp_path, wrapper: str):
    """The autocast run's checkpoint as ``wrapper`` (fairseq's ``--fp16`` or
    ``--memory-efficient-fp16``) would have written it: float16 model weights, a loss scale,
    and for ``FP16Optimizer`` the inner Adam's state over fairseq's flat master."""
    state = torch.load(autocast_checkpoint.path, weights_only=False)
    state["model"] = {name: t.half() if t.is_floating_point() else t
                      for name, t in state["model"].items()}
    state["optimizer_history"][-1]["optimizer_name"] = wrapper
    optimizer_state = state["last_optimizer_state"]
    group = optimizer_state["param_groups"][0]
    if wrapper == "FP16Optimizer":
        entries = [optimizer_state["state"][i] for i in group["params"]]
        optimizer_state = {
            "state": {0: {"step": entries[0]["step"], **{
                key: fairseq_flattened(entry[key] for entry in entries)
                for key in ("exp_avg", "exp_avg_sq")}}},
            "param_groups": [{**group, "params": [0]}],
        }
    optimizer_state["loss_scale"] = 32.0
    state["last_optimizer_state"] = optimizer_state
    save_dir = fresh_copy(autocast_checkpoint, tmp_path, wrapper)
    # written as the wrapper's run would have saved its own state over the copied one
    save_checkpoint(state, save_dir / "checkpoint_last.pt", training_save=True)
    return save_dir, state


@pytest.mark.parametrize("wrapper", ["FP16Optimizer", "MemoryEfficientFP16Optimizer"])
def test_an_fp16_wrapper_checkpoint_resumes_under_fp16(autocast_checkpoint, tmp_path, caplog,
                                                       wrapper):
    save_dir, state = fp16_wrapper_checkpoint(autocast_checkpoint, tmp_path, wrapper)
    per_tensor = autocast_checkpoint.state["last_optimizer_state"]
    made = trainer_for(autocast_checkpoint.data_bin, "--fp16")
    trainer = made.trainer
    with caplog.at_level(logging.INFO, logger=CONVERTED):
        trainer.load_checkpoint(str(save_dir / "checkpoint_last.pt"))
    said = [r.getMessage() for r in caplog.records if r.name == CONVERTED]
    assert len(said) == 1 and f"optimizer state of {wrapper}" in said[0], said
    assert "loss scale 32" in said[0]
    optimizer = trainer.optimizer
    assert type(optimizer).__name__ == "Float32MasterOptimizer"
    assert optimizer.scaler.loss_scale == 32.0 and trainer.get_num_updates() == 3
    flat = optimizer.fp32_optimizer.optimizer.state[optimizer.fp32_params]
    assert flat["step"] == 3
    for key in ("exp_avg", "exp_avg_sq"):
        expected = fairseq_flattened(per_tensor["state"][i][key]
                                     for i in per_tensor["param_groups"][0]["params"])
        assert torch.equal(flat[key], expected), key
    # fairseq's wrappers never saved their masters: they restart from the float16 weights
    for name, p in trainer.model.named_parameters():
        assert torch.equal(optimizer.master_of()[id(p)], state["model"][name].float()), name

    log = trainer.train_step([made.sample])
    assert trainer.get_num_updates() == 4 and math.isfinite(log["loss"])
    assert optimizer.scaler.loss_scale == 32.0


def test_the_same_fp16_command_continues_an_fp16_optimizer_run(autocast_checkpoint, tmp_path):
    save_dir, _ = fp16_wrapper_checkpoint(autocast_checkpoint, tmp_path, "FP16Optimizer")
    proc = train(autocast_checkpoint.data_bin, save_dir, 5, "--fp16")
    log = proc.stdout + proc.stderr
    assert log.count("optimizer state of FP16Optimizer (one flat float32 tensor) converted "
                     "to Float32MasterOptimizer (one flat float32 tensor)") == 1
    records = json_log_records(log, "train_inner")
    assert [int(r["num_updates"]) for r in records] == [4, 5]
    assert {float(r["loss_scale"]) for r in records} == {32.0}
    assert all(math.isfinite(float(r["loss"])) for r in records)
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=False)
    assert state["last_optimizer_state"]["loss_scale"] == 32.0
    assert state["last_optimizer_state"]["state"][0]["step"] == 5


# --------------------------------------------------------------------------------------------
# what is not converted


def test_another_optimizers_state_is_one_line_naming_the_way_out(autocast_checkpoint,
                                                                 tmp_path):
    made = trainer_for(autocast_checkpoint.data_bin, "--bf16", "--optimizer", "vaswani_adam")
    with pytest.raises(UserError) as caught:
        made.trainer.load_checkpoint(str(autocast_checkpoint.path))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{autocast_checkpoint.path}: cannot resume its optimizer state "
                              "(FairseqAdam) with this run's Float32MasterOptimizer: ")
    assert "it is the state of --optimizer adam, this run has --optimizer vaswani_adam" \
        in message
    assert message.endswith("add --reset-optimizer to resume the weights with a new optimizer "
                            "state, or resume with --optimizer adam")
    assert made.trainer._optim_history[-1]["optimizer_name"] == "FairseqAdam"

    # the command line: that one line, status 1, no traceback
    save_dir = fresh_copy(autocast_checkpoint, tmp_path)
    proc = forked_cli.run(
        [str(Path(sys.executable).parent / "fairseq-train"), *train_args(
            autocast_checkpoint.data_bin, save_dir, 6, "--bf16", "--optimizer",
            "vaswani_adam")],
        env=fairseq_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr + proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    in_save_dir = message.replace(str(autocast_checkpoint.path),
                                  str(save_dir / "checkpoint_last.pt"))
    assert last == f"fairseq-train: error: {in_save_dir}"


def test_a_state_that_does_not_fit_the_model_is_one_line(autocast_checkpoint, tmp_path):
    state = torch.load(autocast_checkpoint.path, weights_only=False)
    group = state["last_optimizer_state"]["param_groups"][0]
    group["params"] = group["params"][:-1]
    path = tmp_path / "checkpoint_last.pt"
    save_checkpoint(state, path)
    made = trainer_for(autocast_checkpoint.data_bin, "--bf16")
    with pytest.raises(UserError, match=r"it holds state for \d+ tensors, this model has \d+ "
                       r"parameter tensors; add --reset-optimizer .*, or resume with "
                       r"--bf16 --amp \(bfloat16 autocast"):
        made.trainer.load_checkpoint(str(path))


def test_reset_optimizer_resumes_the_weights_without_converting(autocast_checkpoint, caplog):
    made = trainer_for(autocast_checkpoint.data_bin, "--bf16")
    with caplog.at_level(logging.INFO, logger=CONVERTED):
        made.trainer.load_checkpoint(str(autocast_checkpoint.path), reset_optimizer=True)
    assert not [r for r in caplog.records if r.name == CONVERTED]
    optimizer = made.trainer.optimizer
    assert not optimizer.fp32_optimizer.optimizer.state  # a new optimizer state
    for name, p in made.trainer.model.named_parameters():
        assert torch.equal(optimizer.master_of()[id(p)],
                           autocast_checkpoint.state["model"][name]), name


def test_a_stock_run_keeps_fairseqs_refusal(multi30k_bin, tmp_path):
    """``--arch transformer --task translation`` is no run of ours: its float32 checkpoint
    resumed with ``--bf16`` (fairseq's ``FP16Optimizer``) stops at fairseq's assertion."""
    stock = ["--arch", "transformer", "--task", "translation", "--encoder-layers", "1",
             "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
             "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
             "--share-all-embeddings"]
    first = trainer_for(multi30k_bin.data_bin, model_args=stock)
    first.trainer.train_step([first.sample])
    first.trainer.consolidate_optimizer()  # as fairseq does before saving
    path = tmp_path / "checkpoint_last.pt"
    first.trainer.save_checkpoint(str(path), {"train_iterator": {"epoch": 1}})
    second = trainer_for(multi30k_bin.data_bin, "--bf16", model_args=stock)
    with pytest.raises(AssertionError, match="Optimizer does not match; please reset the "
                       "optimizer \\(--reset-optimizer\\). FairseqAdam vs FP16Optimizer"):
        second.trainer.load_checkpoint(str(path))
    assert "_build_optimizer" not in vars(second.trainer)


def test_tensors_without_state_or_with_fewer_updates_join_the_flat_state():
    """A tensor never updated has no state (zeros in the flat moments); one updated less often
    takes the largest count; cut back, every tensor has its moments again."""
    from user_plugin.optimizers.state_layouts import flat_to_per_tensor, per_tensor_to_flat

    shapes = [torch.Size([2, 3]), torch.Size([4]), torch.Size([5])]
    moments = [torch.arange(s.numel(), dtype=torch.float32).view(s) + 1 for s in shapes]
    per_tensor = {
        "state": {0: {"step": 7, "exp_avg": moments[0], "exp_avg_sq": moments[0] ** 2},
                  2: {"step": 5, "exp_avg": moments[2], "exp_avg_sq": moments[2] ** 2}},
        "param_groups": [{"lr": 0.1, "params": [0, 1, 2]}],
        "loss_scale": 8.0,
    }
    flat, carried = per_tensor_to_flat(per_tensor, shapes)
    assert carried == {"step": 7, "fewer_updates": 2}
    assert flat["param_groups"] == [{"lr": 0.1, "params": [0]}] and flat["loss_scale"] == 8.0
    state = flat["state"][0]
    assert state["step"] == 7
    assert torch.equal(state["exp_avg"], torch.cat([moments[0].flatten(), torch.zeros(4),
                                                    moments[2]]))
    back, _ = flat_to_per_tensor(flat, shapes)
    assert back["param_groups"] == [{"lr": 0.1, "params": [0, 1, 2]}]
    assert [back["state"][i]["step"] for i in range(3)] == [7, 7, 7]
    for i, shape in enumerate(shapes):
        expected = torch.zeros(shape) if i == 1 else moments[i]
        assert torch.equal(back["state"][i]["exp_avg"], expected)
        assert torch.equal(back["state"][i]["exp_avg_sq"], expected ** 2)
