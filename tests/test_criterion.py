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

from user_plugin.criterions.fused_projection_loss import fused_projection_label_smoothed_loss
from user_plugin.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropy,
    _fusable_output_weight,
    label_smoothed_loss_from_logits,
)


def make_sample(dictionary, src, src_lengths, prev, target):
    return {
        "net_input": {"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": prev},
        "target": target,
        "ntokens": int(target.ne(dictionary.pad()).sum()),
    }


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
    sample = make_sample(dictionary, src, src_lengths, prev, target)
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


@pytest.mark.parametrize("eps,chunk_rows", [(0.0, 7), (0.1, 7), (0.1, 1000)])
def test_fused_projection_loss_equals_logits_then_fairseq_loss(eps, chunk_rows):
    """Chunked projection + loss: same loss, NLL, argmax count and gradients (h and W)."""
    torch.manual_seed(3)
    features = torch.randn(45, 16, requires_grad=True)
    weight = torch.randn(37, 16, requires_grad=True)
    target = torch.randint(0, 37, (45,))
    loss, nll, correct = fused_projection_label_smoothed_loss(
        features, weight, target, eps, count_correct=True, chunk_rows=chunk_rows
    )
    (2.5 * loss).backward()
    plain_h = features.detach().clone().requires_grad_()
    plain_w = weight.detach().clone().requires_grad_()
    logits = plain_h @ plain_w.t()
    lprobs = torch.log_softmax(logits, dim=-1)
    theirs, theirs_nll = label_smoothed_nll_loss(lprobs, target, eps, ignore_index=None)
    (2.5 * theirs).backward()
    torch.testing.assert_close(loss, theirs, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(nll, theirs_nll, rtol=1e-5, atol=1e-4)
    assert int(correct) == int(logits.argmax(-1).eq(target).sum())
    torch.testing.assert_close(features.grad, plain_h.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weight.grad, plain_w.grad, rtol=1e-4, atol=1e-5)


def test_fused_projection_loss_without_gradient_and_in_bf16():
    torch.manual_seed(4)
    features, weight = torch.randn(30, 8), torch.randn(21, 8)
    target = torch.randint(0, 21, (30,))
    reference, _, _ = fused_projection_label_smoothed_loss(features, weight, target, 0.1)
    with torch.no_grad():
        loss, _, _ = fused_projection_label_smoothed_loss(features, weight, target, 0.1)
    torch.testing.assert_close(loss, reference)
    leaf_h, leaf_w = features.requires_grad_(), weight.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _, _ = fused_projection_label_smoothed_loss(leaf_h, leaf_w, target, 0.1,
                                                         chunk_rows=8)
    low.backward()
    assert leaf_h.grad.dtype == torch.float32 and leaf_w.grad.dtype == torch.float32
    torch.testing.assert_close(low, reference, rtol=2e-2, atol=0.0)
    with pytest.raises(ValueError, match="weight"):
        fused_projection_label_smoothed_loss(features, weight[:, :4], target, 0.1)


def test_fused_projection_loss_with_bf16_weights():
    """bf16 features and weight (a --bf16 run's model): the loss and the gradients are those of
    float32 on the same values, to bf16's precision (dL/dz is rounded to bf16 for the products),
    whatever the chunking; the gradients come back in bf16."""
    torch.manual_seed(6)
    features = torch.randn(45, 16).bfloat16().requires_grad_()
    weight = torch.randn(37, 16).bfloat16().requires_grad_()
    target = torch.randint(0, 37, (45,))
    wide_h = features.detach().float().requires_grad_()
    wide_w = weight.detach().float().requires_grad_()
    reference, reference_nll, _ = fused_projection_label_smoothed_loss(wide_h, wide_w, target, 0.1)
    (3.0 * reference).backward()
    for chunk_rows in (7, 45, 1000):
        h, w = features.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
        loss, nll, _ = fused_projection_label_smoothed_loss(h, w, target, 0.1,
                                                            chunk_rows=chunk_rows)
        (3.0 * loss).backward()
        assert h.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
        torch.testing.assert_close(loss, reference, rtol=1e-2, atol=0.0)
        torch.testing.assert_close(nll, reference_nll, rtol=1e-2, atol=0.0)
        for low, wide in ((h.grad, wide_h.grad), (w.grad, wide_w.grad)):
            assert (low.float() - wide).norm() < 1e-2 * wide.norm()


def test_criterion_gradients_equal_fairseq_criterion_on_our_model():
    """The fused path (our model) gives every parameter the gradient fairseq's criterion
    gives it through the full logits."""
    torch.manual_seed(5)
    dictionary = make_dictionary(30)
    model = build_vaswani(dictionary, "vaswani_base", **TINY)
    src, src_lengths, prev = random_batch(dictionary, batch=4, src_len=6, tgt_len=5)
    target = torch.cat([prev[:, 1:], torch.full((4, 1), dictionary.pad())], dim=1)
    sample = make_sample(dictionary, src, src_lengths, prev, target)
    task = SimpleNamespace(target_dictionary=dictionary)
    model.eval()  # no dropout: both passes see the same network
    grads = []
    for criterion in (
        LabelSmoothedCrossEntropy(task, sentence_avg=False, label_smoothing=0.1),
        LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1),
    ):
        model.zero_grad()
        loss, _, _ = criterion(model, sample)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert _fusable_output_weight(model) is model.decoder.output_projection.weight
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_decoder_with_its_own_output_layer_goes_through_its_logits():
    """The fused path is only taken for our plain pre-softmax linear; a subclass that changes
    ``output_layer`` gets the loss of its own logits."""
    from user_plugin.models.decoder import VaswaniDecoder

    class HalvedLogits(VaswaniDecoder):
        def output_layer(self, features):
            return 0.5 * super().output_layer(features)

    torch.manual_seed(6)
    dictionary = make_dictionary(30)
    model = build_vaswani(dictionary, "vaswani_base", **TINY).eval()
    halved = HalvedLogits(model.decoder.cfg, dictionary, model.decoder.embed_tokens)
    halved.load_state_dict(model.decoder.state_dict())
    model.decoder = halved
    assert _fusable_output_weight(model) is None
    src, src_lengths, prev = random_batch(dictionary, batch=3, src_len=5, tgt_len=4)
    target = torch.cat([prev[:, 1:], torch.full((3, 1), dictionary.pad())], dim=1)
    sample = make_sample(dictionary, src, src_lengths, prev, target)
    task = SimpleNamespace(target_dictionary=dictionary)
    loss, _, _ = LabelSmoothedCrossEntropy(task, sentence_avg=False, label_smoothing=0.1)(
        model, sample
    )
    logits = model(src, src_lengths, prev)[0]
    lprobs = torch.log_softmax(logits, dim=-1).view(-1, logits.size(-1))
    expected, _ = label_smoothed_nll_loss(lprobs, target.view(-1), 0.1,
                                          ignore_index=dictionary.pad())
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)


def test_float16_gradients_are_not_fused():
    """fp16 loss scaling must scale dL/dz before it is cast to float16: no fused pass then
    (bf16, which has float32's range, is fused: see the test above)."""
    torch.manual_seed(7)
    model = build_vaswani(make_dictionary(20), "vaswani_base", **TINY)
    assert _fusable_output_weight(model) is model.decoder.output_projection.weight
    with torch.autocast("cpu", dtype=torch.float16):
        assert _fusable_output_weight(model) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _fusable_output_weight(model) is not None
    assert _fusable_output_weight(model.half()) is None
