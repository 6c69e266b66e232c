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
