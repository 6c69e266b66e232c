"""Our label-smoothed cross-entropy (§5.4) equals fairseq's ``label_smoothed_cross_entropy``."""

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY, build_vaswani, make_dictionary, random_batch
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    label_smoothed_nll_loss,
)
from fairseq.logging import metrics

from user_plugin.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropy,
    label_smoothed_loss_from_logits,
)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_and_gradient_equal_fairseq_formula_on_random_logits(eps):
    torch.manual_seed(0)
    logits = (3 * torch.randn(50, 37)).requires_grad_()
    target = torch.randint(0, 37, (50,))
    target[::7] = 1  # padding
    ours, ours_nll = label_smoothed_loss_from_logits(logits, target, eps, padding_idx=1)
    (g_ours,) = torch.autograd.grad(ours, logits)
    lprobs = torch.log_softmax(logits, dim=-1)
    theirs, theirs_nll = label_smoothed_nll_loss(lprobs, target, eps, ignore_index=1)
    (g_theirs,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ours_nll, theirs_nll, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-4, atol=1e-6)


def test_uniform_smoothing_value_against_a_hand_computation():
    # two classes besides the target: q = (1 - eps) on the target, eps / 2 on each other one
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    eps = 0.2
    logp = torch.log_softmax(logits, -1)[0]
    expected = -((1 - eps) * logp[0] + eps / 2 * (logp[1] + logp[2]))
    loss, _ = label_smoothed_loss_from_logits(logits, torch.tensor([0]), eps, padding_idx=9)
    assert math.isclose(loss.item(), expected.item(), rel_tol=1e-6)


def test_criterion_matches_fairseq_criterion_on_a_model_batch_and_logs_the_same():
    torch.manual_seed(1)
    dictionary = make_dictionary(30)
    model = build_vaswani(dictionary, "vaswani_base", **TINY)
    src, src_lengths, prev = random_batch(dictionary, batch=4, src_len=6, tgt_len=5)
    target = torch.cat([prev[:, 1:], torch.full((4, 1), dictionary.pad())], dim=1)
    target[:, -1] = torch.where(prev[:, -1].eq(dictionary.pad()), dictionary.pad(),
                                dictionary.eos())
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": prev},
        "target": target,
        "ntokens": int(target.ne(dictionary.pad()).sum()),
    }
    task = SimpleNamespace(target_dictionary=dictionary)
    ours = LabelSmoothedCrossEntropy(task, sentence_avg=False, label_smoothing=0.1,
                                     report_accuracy=True)
    theirs = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                report_accuracy=True)
    model.eval()
    loss_a, size_a, log_a = ours(model, sample)
    loss_b, size_b, log_b = theirs(model, sample)
    assert size_a == size_b == sample["ntokens"]
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-4)
    for key in ("nll_loss", "n_correct", "total", "ntokens", "nsentences"):
        assert math.isclose(float(log_a[key]), float(log_b[key]), rel_tol=1e-5), key
    logged = []
    for criterion, log in ((ours, log_a), (theirs, log_b)):
        with metrics.aggregate() as agg:
            type(criterion).reduce_metrics([log])
            logged.append(agg.get_smoothed_values())
    for key in ("loss", "nll_loss", "ppl", "accuracy"):
        assert math.isclose(logged[0][key], logged[1][key], rel_tol=1e-3), key


def test_paper_default_and_bad_value():
    from user_plugin.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyConfig,
    )

    assert LabelSmoothedCrossEntropyConfig().label_smoothing == 0.1
    task = SimpleNamespace(target_dictionary=make_dictionary(10))
    with pytest.raises(ValueError, match="--label-smoothing"):
        LabelSmoothedCrossEntropy(task, sentence_avg=False, label_smoothing=1.5)
