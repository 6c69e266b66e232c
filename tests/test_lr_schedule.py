"""The paper's learning-rate schedule (§5.3, equation 3) under fairseq's calling convention."""

import math

import pytest
import torch
from fairseq.optim import FairseqOptimizer

from user_plugin.lr_schedulers.inverse_sqrt_warmup import (
    InverseSqrtWarmupConfig,
    InverseSqrtWarmupSchedule,
    paper_learning_rate,
)


class SGDOptimizer(FairseqOptimizer):
    """A real fairseq optimizer wrapper around plain SGD: ``lr`` reads the param group's lr."""

    def __init__(self):
        super().__init__(None)
        self._optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)

    @property
    def lr(self):
        return self.get_lr()


def schedule(d_model=512, warmup=4000, scale=1.0):
    cfg = InverseSqrtWarmupConfig(warmup_updates=warmup, lr_scale=scale, d_model=d_model,
                                  model_embed_dim=None)
    return InverseSqrtWarmupSchedule(cfg, SGDOptimizer())


@pytest.mark.parametrize("step", [1, 4000, 100000])
def test_formula_at_the_papers_steps(step):
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert math.isclose(paper_learning_rate(step, 512, 4000), expected, rel_tol=1e-12)


def test_peaks_quoted_by_the_paper():
    assert round(paper_learning_rate(4000, 512, 4000), 6) == 6.99e-4
    assert round(paper_learning_rate(4000, 1024, 4000), 6) == 4.94e-4
    assert paper_learning_rate(3999, 512, 4000) < paper_learning_rate(4000, 512, 4000)
    assert paper_learning_rate(4001, 512, 4000) < paper_learning_rate(4000, 512, 4000)


def test_fairseq_calls_map_to_the_papers_step_num():
    sched = schedule()
    # fairseq: step_update(0) before update 1, step_update(k) after update k
    assert math.isclose(sched.optimizer.lr, paper_learning_rate(1, 512, 4000))
    assert sched.optimizer.lr > 0
    sched.step_update(3999)
    assert math.isclose(sched.optimizer.lr, 6.9877e-4, rel_tol=1e-4)
    sched.step_update(99999)
    assert math.isclose(sched.optimizer.lr, 512**-0.5 * 100000**-0.5)


def test_scale_and_validation():
    assert math.isclose(schedule(scale=2.0).lr_at(10), 2 * schedule().lr_at(10))
    with pytest.raises(ValueError, match="--warmup-updates"):
        schedule(warmup=0)
    with pytest.raises(ValueError, match="--d-model"):
        schedule(d_model=None)
    # a given --d-model of 0 is blamed on itself, not on the model's width
    with pytest.raises(ValueError, match="^--d-model must be at least 1, got 0$"):
        schedule(d_model=0)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_lr_scale_must_be_positive(scale):
    with pytest.raises(ValueError, match=f"--lr-scale must be a positive finite number, got "
                                         f"{scale}"):
        schedule(scale=scale)


def test_model_width_from_every_form_of_model_configuration():
    from argparse import Namespace

    from omegaconf import OmegaConf

    from user_plugin.lr_schedulers.inverse_sqrt_warmup import model_width

    assert model_width(Namespace(decoder_embed_dim=64)) == 64  # legacy: fairseq's transformer
    assert model_width(OmegaConf.create({"decoder_embed_dim": 48})) == 48  # ours
    assert model_width(OmegaConf.create({"decoder": {"embed_dim": 32}})) == 32  # nested
    assert model_width({"decoder": {"embed_dim": 16}}) == 16
    assert model_width(Namespace(encoder_embed_dim=8)) is None
    assert model_width(None) is None


@pytest.mark.parametrize("arch, extra", [
    ("transformer", []),
    ("transformer_wmt_en_de_big", []),
    ("vaswani_base", []),
    ("transformer", ["--d-model", "256"]),
])
def test_fairseq_builds_the_schedule_with_each_architectures_width(arch, extra):
    """The scheduler built by fairseq from a full training configuration reads d_model from
    the model's options (an argparse namespace for fairseq's own transformer)."""
    from cli import USER_DIR
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim.lr_scheduler import build_lr_scheduler

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "data", "--user-dir", USER_DIR, "--arch", arch, "--optimizer", "adam", "--lr", "1",
        "--lr-scheduler", "vaswani_inverse_sqrt", "--decoder-embed-dim", "128",
        "--encoder-embed-dim", "128", *extra])
    cfg = convert_namespace_to_omegaconf(args)
    sched = build_lr_scheduler(cfg.lr_scheduler, SGDOptimizer())
    assert sched.d_model == (256 if extra else 128)


def test_fairseq_train_of_fairseqs_transformer_logs_the_formulas_lr(multi30k_bin, tmp_path):
    from cli import USER_DIR, json_log_records, run_fairseq

    proc = run_fairseq("train", [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1",
        "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--share-all-embeddings", "--optimizer", "adam", "--lr", "1",
        "--lr-scheduler", "vaswani_inverse_sqrt", "--warmup-updates", "40", "--lr-scale", "0.5",
        "--criterion", "label_smoothed_cross_entropy", "--max-tokens", "1500",
        "--max-update", "6", "--log-format", "json", "--log-interval", "1", "--no-save",
        "--num-workers", "0", "--save-dir", tmp_path,
    ])
    log = proc.stdout + proc.stderr
    assert "paper LR schedule: d_model 64" in log
    records = json_log_records(log, "train_inner")
    assert len(records) == 6
    for record in records:
        step = int(record["num_updates"]) + 1  # the update about to run (fairseq's convention)
        expected = 0.5 * 64**-0.5 * min(step**-0.5, step * 40**-1.5)
        assert float(record["lr"]) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("lr", [[5e-4], [0.001, 0.002]])
def test_a_given_lr_the_schedule_ignores_is_refused_naming_the_scale(lr):
    """A command line ported from fairseq's inverse_sqrt (--lr 5e-4, a peak) trained at the
    paper's rate without a word: --lr is refused, with the --lr-scale of that peak."""
    from user_plugin.files.errors import InvalidValue

    cfg = InverseSqrtWarmupConfig(warmup_updates=4000, d_model=512, model_embed_dim=None, lr=lr)
    with pytest.raises(InvalidValue, match=r"--lr-scale 0\.7155") if lr == [5e-4] else \
            pytest.raises(InvalidValue, match=r"--lr 0\.001 is not used"):
        InverseSqrtWarmupSchedule(cfg, SGDOptimizer())
    for neutral in ([0.25], [1.0], None):  # fairseq's default, the recipes' 1, no value
        cfg = InverseSqrtWarmupConfig(warmup_updates=4000, d_model=512, model_embed_dim=None,
                                      lr=neutral)
        InverseSqrtWarmupSchedule(cfg, SGDOptimizer())
