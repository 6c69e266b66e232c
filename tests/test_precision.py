"""Reduced-precision training (``user_plugin/precision.py``, ``recipes/steps/train.sh``):

* fairseq's ``--bf16`` trains on a CPU (fairseq alone dies asking torch_xla for a TPU): for our
  runs bfloat16 weights with float32 masters, saved as the checkpoint's weights, and a resume
  that continues from them to the last bit (``--fp16`` too, which now runs on a CPU);
  ``--bf16 --amp`` keeps bfloat16 autocast over float32 weights; a stock run in the same
  process keeps fairseq's own path; through the recipe's train step with ``DEVICE=cpu
  PRECISION=bf16`` the loss falls, a killed run resumes where it stopped, and the float32
  checkpoint decodes in fairseq-generate;
* ``--memory-efficient-fp16 --cpu`` with our model and criterion: a loss scale far too large
  overflows, is halved on each overflow (logged), and training goes on with the loss falling;
* the criterion's float16 path: why it stays unfused (``scripts/fp16_loss_accuracy.py``);
* ``scripts/benchmark.py --dtype bf16`` trains through the same mechanism.

No test here runs on a GPU: the CUDA path is the same code with ``device_type="cuda"``.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import forked_cli
import pytest
import torch
from cli import (
    PAPER_OPTIMIZATION_ARGS,
    TINY_MODEL_ARGS,
    USER_DIR,
    fairseq_env,
    hypotheses,
    json_log_records,
    run_fairseq,
)
from conftest import MULTI30K, REPO, require_data

TRAIN_STEP = REPO / "recipes" / "steps" / "train.sh"
RECIPE_TINY_MODEL = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 4 "
    "--decoder-attention-heads 4 --num-workers 0 --log-format json --max-valid-steps 2"
)


# what the train step reads from the environment besides what the tests set (and Slurm's)
CALLER_SETTINGS = ("MODEL", "ARCH", "RUN_DIR", "LABEL_SMOOTHING", "UPDATE_FREQ", "NUM_GPUS",
                   "SEED", "TRAIN_TASK", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                   "PAIR", "STEP_NAME", "VENV")


def recipe_environment(**settings) -> dict:
    """The environment of a recipe run: this interpreter's bin first on PATH, none of the
    caller's recipe or Slurm settings, then ``settings``."""
    env = {key: value for key, value in fairseq_env().items()
           if not key.startswith("SLURM_") and key not in CALLER_SETTINGS}
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}"
    env.update({key: str(value) for key, value in settings.items()})
    return env


def losses_fall(records) -> bool:
    losses = [float(r["loss"]) for r in records]
    return len(losses) >= 4 and sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 1.0


# --------------------------------------------------------------------------------------------
# bf16


def trainer_after_one_step(data_bin, *flags, arch: str = "vaswani_base", extra=()) -> dict:
    """fairseq's own option parsing of ``flags`` with ``--cpu`` (``--bf16`` sets ``--tpu``),
    fairseq's launcher and Trainer, one training and one validation step: the trainer and the
    dtypes our linear layers produced in each."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq.trainer import Trainer

    parser = options.get_training_parser()
    model_args = [*TINY_MODEL_ARGS] if arch == "vaswani_base" else [
        "--arch", arch, "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--share-all-embeddings"]
    args = options.parse_args_and_arch(parser, [
        str(data_bin), "--user-dir", USER_DIR, "--cpu", *flags, "--seed", "1",
        *model_args, *PAPER_OPTIMIZATION_ARGS, "--max-tokens", "600", *extra,
    ])
    cfg = convert_namespace_to_omegaconf(args)
    seen = {"tpu_as_parsed": cfg.common.tpu}

    def main(cfg):
        task = tasks.setup_task(cfg.task)
        task.load_dataset("valid")
        model = task.build_model(cfg.model)
        seen["initial"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
        dtypes = set()
        hooks = [m.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
                 for m in model.modules() if isinstance(m, torch.nn.Linear)]
        dataset = task.dataset("valid")
        sample = dataset.collater([dataset[i] for i in range(8)])
        log = trainer.train_step([sample])
        seen["train_dtypes"], seen["loss"] = set(dtypes), log["loss"]
        dtypes.clear()
        trainer.valid_step(sample)
        seen["valid_dtypes"] = set(dtypes)
        for hook in hooks:
            hook.remove()
        trainer.consolidate_optimizer()  # as fairseq does before saving
        seen["trainer"] = trainer

    distributed_utils.call_main(cfg, main)
    return seen


def test_bf16_trains_bfloat16_weights_with_float32_masters_saved_as_the_model(multi30k_bin):
    from user_plugin.optimizers.float32_masters import Float32MasterOptimizer

    seen = trainer_after_one_step(multi30k_bin.data_bin, "--bf16")
    assert seen["tpu_as_parsed"]  # fairseq's reading of --bf16: a TPU, hence torch_xla
    trainer = seen["trainer"]
    assert trainer.device.type == "cpu" and trainer.get_num_updates() == 1
    assert seen["train_dtypes"] == {torch.bfloat16} == seen["valid_dtypes"]
    assert math.isfinite(seen["loss"])
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    optimizer = trainer.optimizer
    assert isinstance(optimizer, Float32MasterOptimizer) and optimizer.scaler is None
    assert optimizer.fp32_params.dtype == torch.float32 and optimizer.fp32_params.dim() == 1
    masters = optimizer.master_of()
    # the masters started from the float32 weights the model was built with (not their
    # rounding), took one update, and the model holds them rounded
    named = dict(trainer.model.named_parameters())
    moved = max(float((masters[id(p)] - seen["initial"][n]).abs().max())
                for n, p in named.items())
    assert 0 < moved < 1e-2
    for p in named.values():
        assert torch.equal(masters[id(p)].to(torch.bfloat16), p.detach())
    state = trainer.state_dict()
    assert state["cfg"]["common"]["bf16"] is True and state["cfg"]["common"]["tpu"] is False
    assert {t.dtype for t in state["model"].values()} == {torch.float32}
    for name, p in named.items():
        assert torch.equal(state["model"][name], masters[id(p)])
    # more than bfloat16's 8 bits: the checkpoint holds the masters, not the model's weights
    assert any(not torch.equal(t, t.to(torch.bfloat16).float()) for t in state["model"].values())


def test_bf16_amp_keeps_bfloat16_autocast_over_float32_state(multi30k_bin):
    seen = trainer_after_one_step(multi30k_bin.data_bin, "--bf16", "--amp")
    trainer = seen["trainer"]
    assert trainer.get_num_updates() == 1 and math.isfinite(seen["loss"])
    assert seen["train_dtypes"] == {torch.bfloat16} == seen["valid_dtypes"]
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert type(trainer.optimizer).__name__ == "FairseqAdam"  # no master copy, no scaler
    moments = {t.dtype for state in trainer.optimizer.optimizer.state.values()
               for t in state.values() if torch.is_tensor(t) and t.dim() > 0}
    assert moments == {torch.float32}
    state = trainer.state_dict()
    assert state["cfg"]["common"]["amp"] is True and state["cfg"]["common"]["bf16"] is True
    assert {t.dtype for t in state["model"].values()} == {torch.float32}


def test_a_stock_run_in_a_plugin_process_keeps_fairseqs_bf16_path(multi30k_bin):
    """``--arch transformer --task translation`` is no run of ours: fairseq's own non-TPU
    bfloat16 path (its FP16Optimizer, bfloat16 weights in the checkpoint); only the crash on
    --tpu is fixed."""
    seen = trainer_after_one_step(multi30k_bin.data_bin, "--bf16", arch="transformer",
                                  extra=["--task", "translation"])
    trainer = seen["trainer"]
    assert trainer.get_num_updates() == 1
    assert type(trainer.optimizer).__name__ == "FP16Optimizer"
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert {t.dtype for t in trainer.state_dict()["model"].values()} == {torch.bfloat16}


def train(data_bin, save_dir, max_update: int, *flags) -> subprocess.CompletedProcess:
    return run_fairseq("train", [
        data_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1", *TINY_MODEL_ARGS,
        *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", "40", "--lr-scale", "0.5",
        "--max-tokens", "1000", "--max-update", str(max_update), "--save-dir", save_dir,
        "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1",
        "--required-batch-size-multiple", "1", "--num-workers", "0", *flags])


@pytest.mark.parametrize("flags", [["--bf16"], ["--fp16", "--fp16-scale-window", "3"]],
                         ids=["bf16", "fp16"])
def test_half_precision_resume_continues_from_the_exact_float32_masters(multi30k_bin,
                                                                       tmp_path, flags):
    """Six updates in one run, and three then three more after a resume, give the same
    checkpoint to the last bit: model weights (the masters), Adam's moments, the loss scale
    and its counters (fp16, whose window of 3 makes the scale grow across the resume)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(multi30k_bin.data_bin, straight, 6, *flags)
    train(multi30k_bin.data_bin, resumed, 3, *flags)
    second = train(multi30k_bin.data_bin, resumed, 6, *flags)
    assert "@ 3 updates)" in second.stdout + second.stderr
    a = torch.load(straight / "checkpoint_last.pt", weights_only=True)
    b = torch.load(resumed / "checkpoint_last.pt", weights_only=True)
    assert a["optimizer_history"][-1]["optimizer_name"] == "Float32MasterOptimizer"
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert a["model"][name].dtype == torch.float32
        assert torch.equal(a["model"][name], b["model"][name]), name
    sa, sb = a["last_optimizer_state"], b["last_optimizer_state"]
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(sa["state"][0][key], sb["state"][0][key])
    if "--fp16" in flags:
        assert sa["loss_scale"] == sb["loss_scale"] > 128  # grew every 3 updates
        assert sa["loss_scaler_counters"] == sb["loss_scaler_counters"]


def bf16_recipe_settings(tmp_path, data_bin) -> dict:
    return dict(WORK_DIR=tmp_path / "work", DATA_BIN=data_bin, DEVICE="cpu", PRECISION="bf16",
                MAX_UPDATE=40, SAVE_INTERVAL_UPDATES=10, AVERAGE_LAST=2, MAX_TOKENS=1500,
                TOKENS_PER_STEP=1500, WARMUP_UPDATES=10, LOG_INTERVAL=5,
                EXTRA_ARGS=RECIPE_TINY_MODEL)


def test_bf16_recipe_trains_resumes_and_its_checkpoint_decodes(multi30k_bin, tmp_path):
    env = recipe_environment(**bf16_recipe_settings(tmp_path, multi30k_bin.data_bin))
    checkpoints = tmp_path / "work" / "base" / "checkpoints"
    last = checkpoints / "checkpoint_last.pt"
    # a run killed (process group, SIGKILL) once its first checkpoint is there
    first = subprocess.Popen(["bash", str(TRAIN_STEP), "wmt14_en_de"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    deadline = time.monotonic() + 600
    while not last.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert first.poll() is None, first.stderr.read()[-3000:]
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate(timeout=60)
    stopped_at = torch.load(last, weights_only=True)["optimizer_history"][-1]["num_updates"]
    assert stopped_at in (10, 20, 30) and not (checkpoints / ".done").exists()

    rerun = forked_cli.run(["bash", str(TRAIN_STEP), "wmt14_en_de"], env=env,
                           capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming in {checkpoints} (from its newest intact checkpoint)" in rerun.stderr
    assert f"@ {stopped_at} updates)" in rerun.stdout, rerun.stdout[-3000:]
    resumed = [int(r["num_updates"]) for r in json_log_records(rerun.stdout, "train_inner")]
    assert resumed and min(resumed) > stopped_at and max(resumed) == 40, resumed
    assert "bf16_masters: bfloat16 weights and gradients, float32 master weights" in rerun.stdout
    assert (checkpoints / ".done").is_file()
    # both runs' records are in train.log: the loss falls across them
    assert losses_fall(json_log_records((checkpoints / "train.log").read_text(), "train_inner"))

    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 40
    assert state["cfg"]["common"]["bf16"] is True
    assert {t.dtype for t in state["model"].values()} == {torch.float32}
    generate = run_fairseq("generate", [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--path", last, "--gen-subset", "test",
        "--beam", "4", "--batch-size", "16", "--required-batch-size-multiple", "1", "--cpu",
    ])
    assert sorted(hypotheses(generate.stdout)) == list(range(100))


def test_recipe_precision_settings_fail_with_one_line(tmp_path):
    env = recipe_environment(WORK_DIR=tmp_path / "w", DEVICE="cpu", PRECISION="fp8")
    result = forked_cli.run(["bash", str(TRAIN_STEP), "wmt14_en_de"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "train: error: PRECISION must be fp16, bf16 or fp32, got 'fp8'")


def test_a_cpu_trains_bf16_where_it_multiplies_bf16_in_hardware_and_says_why():
    """The recipes' default precision on a CPU follows its flags (AVX-512 bf16 or AMX: bf16,
    else fp32); ``detect_device`` takes it unless PRECISION is set, with the reason the train
    step logs."""
    from test_recipes import run_with_common

    from user_plugin.measurement.cpu import cpu_flags
    from user_plugin.training_defaults import cpu_precision

    assert cpu_precision(["avx2", "avx512f"])[0] == "fp32"
    for flags in (["avx512_bf16"], ["amx_tile", "amx_bf16"]):
        precision, why = cpu_precision(flags)
        assert precision == "bf16" and flags[-1] in why and "PRECISION=fp32" in why
    script = ('source "$COMMON"; activate_venv; DEVICE=cpu; unset PRECISION; detect_device; '
              'echo "$PRECISION|${PRECISION_ARGS[*]}|$PRECISION_WHY"')
    chosen = run_with_common(script)
    precision, why = cpu_precision(cpu_flags())
    assert chosen.stdout.strip() == (f"{precision}|{'--bf16' if precision == 'bf16' else ''}|"
                                     f"{why}"), chosen.stderr
    given = run_with_common(script.replace("unset PRECISION", "PRECISION=fp32"))
    assert given.stdout.strip() == "fp32||PRECISION=fp32", given.stderr


def test_the_gpu_probe_imports_torch_only_where_a_gpus_device_node_exists(tmp_path):
    """``detect_device`` asks ``training_defaults gpus``, which imports torch (3 s) to count
    GPUs only where a GPU's device node exists; elsewhere torch could not see one."""
    from test_recipes import run_with_common

    from user_plugin.training_defaults import visible_gpus

    code = ("import sys; from pathlib import Path; from user_plugin.training_defaults import "
            "visible_gpus; print(*visible_gpus(Path(sys.argv[1])), 'torch' in sys.modules)")
    for node in (None, "nvidia0", "kfd", "dxg"):
        dev = tmp_path / f"dev-{node}"
        dev.mkdir()
        if node:
            (dev / node).touch()
        # a new process (a forked one has torch imported already)
        proc = subprocess.run([sys.executable, "-c", code, str(dev)], cwd=REPO,
                              capture_output=True, text=True, check=True)
        counted = proc.stdout.split()
        assert counted[2] == str(node is not None), (node, proc.stdout)
        expected = visible_gpus() if node else (0, 0)
        assert counted[:2] == [str(v) for v in expected], (node, proc.stdout)
    script = 'source "$COMMON"; activate_venv; unset DEVICE; detect_device; echo "$VISIBLE_GPUS"'
    assert run_with_common(script).stdout.strip() == str(visible_gpus()[0])


def test_bf16_cpu_training_attention_is_written_out_and_computes_the_same():
    """bf16 training on a CPU bypasses the fused attention kernel (its backward is slow there)
    for the written-out formula: the same context and gradients, to bf16's precision;
    float32, and bf16 without gradients, keep the fused kernel."""
    from user_plugin.modules import scaled_dot_product as sdp

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8, generator=generator) for _ in range(3))
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., 5:] = False

    def run(dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        assert sdp.fused_is_slow(leaves[0]) == (dtype == torch.bfloat16)
        context, weights = sdp.attend(*leaves, mask=mask, is_causal=True)
        assert weights is None
        context.float().pow(2).sum().backward()
        return [context.float(), *(leaf.grad.float() for leaf in leaves)]

    for ours, reference in zip(run(torch.bfloat16), run(torch.float32)):
        assert torch.allclose(ours, reference, atol=0.06, rtol=0.05)
    with torch.no_grad():
        assert not sdp.fused_is_slow(q.bfloat16().requires_grad_())


# --------------------------------------------------------------------------------------------
# fp16

OVERFLOW = re.compile(r"gradient overflow detected, ignoring gradient, setting loss scale to: "
                      r"([0-9.]+)")


def test_memory_efficient_fp16_on_cpu_lowers_the_scale_on_overflow_and_trains(
        multi30k_bin, tmp_path):
    """A loss scale of 2^20 makes the float16 gradients overflow: each overflow skips the
    update and halves the scale (fairseq's dynamic loss scaler), then training goes on."""
    init_scale = 2.0 ** 20
    proc = run_fairseq("train", [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--cpu", "--memory-efficient-fp16",
        "--fp16-init-scale", str(int(init_scale)), "--seed", "1", *TINY_MODEL_ARGS,
        *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", "40", "--lr-scale", "0.5",
        "--max-tokens", "1500", "--max-update", "30", "--save-dir", tmp_path / "fp16",
        "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1",
        "--required-batch-size-multiple", "1", "--num-workers", "0",
    ])
    log = proc.stdout + proc.stderr
    scales = [float(s) for s in OVERFLOW.findall(log)]
    assert scales and scales[0] == init_scale / 2, log[-3000:]
    assert all(lowered == scale / 2 for scale, lowered in zip(scales, scales[1:]))
    records = json_log_records(log, "train_inner")
    assert [int(r["num_updates"]) for r in records] == list(range(1, 31))
    # the first update is made at the scale that the overflows before it left; logged
    before_first_update = log[:log.index("| train_inner |")]
    assert float(records[0]["loss_scale"]) == float(OVERFLOW.findall(before_first_update)[-1])
    assert losses_fall(records)
    state = torch.load(tmp_path / "fp16" / "checkpoint_last.pt", weights_only=True)
    assert state["last_optimizer_state"]["loss_scale"] == float(records[-1]["loss_scale"])


def fp16_gradient_errors(loss_scales: str) -> dict:
    """``scripts/fp16_loss_accuracy.py`` run as the command it is (N 256, d 64, V 32000):
    ``{loss scale: {path: {"dh", "dW", "dW_other_rows"}}}`` read from its table."""
    proc = forked_cli.run(
        [sys.executable, str(REPO / "scripts" / "fp16_loss_accuracy.py"), "--rows", "256",
         "--dim", "64", "--vocab", "32000", "--loss-scale", loss_scales],
        env=fairseq_env(), capture_output=True, text=True, check=True, timeout=600)
    errors: dict = {}
    for line in proc.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] == "32000":
            errors.setdefault(float(cells[1]), {})[cells[2]] = {
                "dh": float(cells[3]), "dW": float(cells[4]), "dW_other_rows": float(cells[5])}
    return errors


def test_fused_loss_would_lose_what_the_fp16_loss_scale_protects():
    """Why the criterion stays unfused in float16: the fused pass forms dL/dz before the loss
    scale exists, so its float16 gradient is that of an unscaled loss (same error at scale 1
    and 128), while the unfused path (and a fused pass that formed dL/dz in backward) gains
    from the scale on the small gradient rows of the types that are no reference."""
    errors = fp16_gradient_errors("1,128")
    scaled, unscaled = errors[128.0], errors[1.0]
    small = "dW_other_rows"
    assert scaled["fused"][small] == pytest.approx(unscaled["fused"][small], rel=0.02)
    assert scaled["unfused"][small] < scaled["fused"][small] / 4
    assert scaled["fused-in-backward"][small] == pytest.approx(scaled["unfused"][small],
                                                               rel=0.05)
    for path in ("unfused", "fused", "fused-in-backward"):  # the large entries: all alike
        assert scaled[path]["dh"] == pytest.approx(scaled["unfused"]["dh"], rel=0.05)


# --------------------------------------------------------------------------------------------
# benchmark


def test_benchmark_bf16_trains_through_the_training_mechanism(tmp_path):
    require_data(MULTI30K / "train.en")
    first_losses = {}
    for dtype in ("fp32", "bf16"):
        out = tmp_path / f"{dtype}.json"
        command = [
            sys.executable, "scripts/benchmark.py", "--model", "tiny", "--pairs", "300",
            "--vocab", "600", "--train-batches", "2", "--max-tokens", "400", "--dropout", "0",
            "--repeats", "1", "--skip", "decode,sweep,decode-sweep", "--dtype", dtype,
            "--work-dir", str(tmp_path / "work"), "--json-out", str(out),
        ]
        proc = forked_cli.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs = json.loads(out.read_text())["runs"]["train"]
        first_losses[dtype] = {impl: runs[impl][0]["first_loss"] for impl in runs}
    for impl, loss in first_losses["bf16"].items():
        reference = first_losses["fp32"][impl]
        # bfloat16 arithmetic: close to float32 (8-bit mantissa), and not the same
        assert loss == pytest.approx(reference, rel=2e-2) and loss != reference
