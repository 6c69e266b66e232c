"""Label-smoothed cross-entropy (paper §5.4, "Label Smoothing", epsilon_ls = 0.1).

The smoothed target puts ``1 - eps`` on the reference token and spreads ``eps`` uniformly over
the other ``V - 1`` types (the same definition as fairseq's ``label_smoothed_cross_entropy``)::

    loss = (1 - eps) * NLL + eps / (V - 1) * sum_{v != y} -log p_v

Computed from the logits ``z`` without building the log-probability tensor:
``-log p_v = logsumexp(z) - z_v``, so ``NLL = lse - z_y`` and
``sum_v -log p_v = V * lse - sum_v z_v``. Only the logits (which exist anyway) and one value per
token are kept for the backward pass, instead of an extra [tokens x V] tensor.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II
from torch import Tensor

from ..files.errors import InvalidValue
from ..paper import LABEL_SMOOTHING
from .fused_projection_loss import fused_projection_label_smoothed_loss
from .label_smoothing import logit_gradient_, smoothing_coefficients

CRITERION_NAME = "vaswani_label_smoothed_cross_entropy"


@dataclass
class LabelSmoothedCrossEntropyConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=LABEL_SMOOTHING,
        metadata={"help": f"epsilon_ls, the label smoothing value (paper: {LABEL_SMOOTHING})"},
    )
    report_accuracy: bool = field(
        default=False, metadata={"help": "also log token accuracy"}
    )
    sentence_avg: bool = II("optimization.sentence_avg")


def label_smoothed_loss_from_logits(
    logits: Tensor, target: Tensor, epsilon: float, padding_idx: int
) -> Tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL over non-pad targets.

    ``logits``: [N, V] (any float dtype; the arithmetic is in float32), ``target``: [N].
    The NLL is for logging and carries no gradient.
    """
    return _LabelSmoothedLoss.apply(logits, target, epsilon, padding_idx)


class _LabelSmoothedLoss(torch.autograd.Function):
    """The loss with a hand-written gradient (:mod:`~user_plugin.criterions.label_smoothing`),
    one [N, V] temporary in the backward pass."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, padding_idx: int):
        scores = logits.float()
        vocab = scores.size(-1)
        log_normalizer = torch.logsumexp(scores, dim=-1)
        keep = target.ne(padding_idx)
        nll = log_normalizer - scores.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        smooth = vocab * log_normalizer - scores.sum(dim=-1)
        nll = nll.masked_fill(~keep, 0.0).sum()
        smooth = smooth.masked_fill(~keep, 0.0).sum()
        on_target, eps_other = smoothing_coefficients(epsilon, vocab)
        loss = on_target * nll + eps_other * smooth
        ctx.save_for_backward(logits, target, log_normalizer, keep)
        ctx.coefficients = (on_target, eps_other)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        logits, target, log_normalizer, keep = ctx.saved_tensors
        row_grad = keep.to(torch.float32) * grad_loss.float()
        softmax = logits.float().sub(log_normalizer.unsqueeze(-1)).exp_()
        grad = logit_gradient_(softmax, target.unsqueeze(-1), ctx.coefficients, 1.0,
                               row_grad.unsqueeze(-1))
        return grad.to(logits.dtype), None, None, None


def non_pad_rows(keep: Tensor, count: Optional[int]) -> Tensor:
    """The indices of the True entries of ``keep`` ([N], bool), in order.

    With ``count``, the number of True entries known on the host (a translation batch's
    ``ntokens``: its non-pad target tokens), they are found without reading ``keep`` on the
    host: a stable sort puts the kept rows first, and the first ``count`` are taken (boolean
    indexing or ``nonzero`` would wait for the device to say how many there are). The count is
    checked on the device, asynchronously. Without it, ``nonzero``.
    """
    if not isinstance(count, int) or isinstance(count, bool):
        return keep.nonzero().squeeze(1)
    torch._assert_async(keep.sum() == count,
                        "the batch's ntokens differs from its number of non-pad targets")
    return torch.argsort(keep.logical_not().to(torch.uint8), stable=True)[:count]


def _fusable_output_weight(model) -> Optional[Tensor]:
    """The pre-softmax weight when ``model``'s decoder is ours with its plain output layer
    (no adaptive softmax, no overridden ``output_layer``) and gradients are not float16,
    else None."""
    from ..models.decoder import VaswaniDecoder

    decoder = getattr(model, "decoder", None)
    if not isinstance(decoder, VaswaniDecoder):
        return None
    if type(decoder).output_layer is not VaswaniDecoder.output_layer:
        return None
    projection = decoder.output_projection
    if not isinstance(projection, torch.nn.Linear) or projection.bias is not None:
        return None
    weight = projection.weight
    device = weight.device.type
    autocast_fp16 = (torch.is_autocast_enabled(device)
                     and torch.get_autocast_dtype(device) == torch.float16)
    if weight.dtype == torch.float16 or autocast_fp16:
        # the fused pass forms dL/dz before the loss scale is known: small float16 gradients
        # would underflow, which fp16 loss scaling exists to prevent
        return None
    return weight


@register_criterion(CRITERION_NAME, dataclass=LabelSmoothedCrossEntropyConfig)
class LabelSmoothedCrossEntropy(FairseqCriterion):
    def __init__(
        self, task, sentence_avg: bool, label_smoothing: float, report_accuracy: bool = False
    ) -> None:
        super().__init__(task)
        if not 0.0 <= label_smoothing < 1.0:
            raise InvalidValue(f"--label-smoothing must be in [0, 1), got {label_smoothing}")
        self.sentence_avg = sentence_avg
        self.eps = label_smoothing
        self.report_accuracy = report_accuracy

    def forward(self, model, sample: Dict, reduce: bool = True):
        """Loss of one batch, its sample size (tokens or sentences) and logging outputs.

        For our decoder, the pre-softmax linear and the loss run fused over the non-pad target
        positions (:mod:`~user_plugin.criterions.fused_projection_loss`); any other model goes
        through its logits.
        """
        weight = _fusable_output_weight(model) if reduce else None
        if weight is not None:
            features, extra = model(**sample["net_input"], features_only=True)
            target = model.get_targets(sample, (features, extra)).reshape(-1)
            keep = target.ne(self.padding_idx)
            rows = non_pad_rows(keep, sample.get("ntokens"))
            loss, nll_loss, correct = fused_projection_label_smoothed_loss(
                features.reshape(-1, features.size(-1)).index_select(0, rows), weight,
                target.index_select(0, rows), self.eps, count_correct=self.report_accuracy,
            )
        else:
            net_output = model(**sample["net_input"])
            target = model.get_targets(sample, net_output).reshape(-1)
            logits = self._logits(model, net_output)
            keep = target.ne(self.padding_idx)
            loss, nll_loss = label_smoothed_loss_from_logits(
                logits, target, self.eps, self.padding_idx
            )
            if self.report_accuracy:
                correct = (logits.argmax(dim=-1).eq(target) & keep).sum()
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            # tensors: read on the host by reduce_metrics, after the backward pass
            logging_output["n_correct"] = correct.detach()
            logging_output["total"] = keep.sum()
        return loss, sample_size, logging_output

    @staticmethod
    def _logits(model, net_output) -> Tensor:
        """[N, V] logits; under an adaptive softmax, the log-probabilities of every type
        (log-probabilities are valid logits)."""
        adaptive_softmax = getattr(getattr(model, "decoder", None), "adaptive_softmax", None)
        if adaptive_softmax is not None:
            return adaptive_log_probs(adaptive_softmax, net_output[0])
        scores = net_output[0]
        return scores.reshape(-1, scores.size(-1))

    @classmethod
    def reduce_metrics(cls, logging_outputs: List[Dict]) -> None:
        """Loss per sample-size unit and NLL per token, in bits, and perplexity (base 2)."""
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        nll_sum = sum(log.get("nll_loss", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss_sum / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", nll_sum / ntokens / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))
        total = utils.item(sum(log.get("total", 0) for log in logging_outputs))
        if total > 0:
            metrics.log_scalar("total", total)
            metrics.log_scalar("n_correct", utils.item(sum(log.get("n_correct", 0)
                                                           for log in logging_outputs)))
            metrics.log_derived(
                "accuracy",
                lambda meters: round(meters["n_correct"].sum * 100.0 / meters["total"].sum, 3),
            )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def adaptive_log_probs(adaptive_softmax, features: Tensor) -> Tensor:
    """[N, V] log-probabilities of every type under fairseq's ``AdaptiveSoftmax``, differentiable.

    A type of the head has its head log-softmax; a type of tail cluster i has the head's
    log-probability of the cluster plus its log-softmax within the cluster. fairseq's
    ``get_log_prob`` computes the same in place, for decoding only (autograd refuses it); the
    input dropout is that of the module's training forward.
    """
    x = adaptive_softmax.dropout_module(features.reshape(-1, features.size(-1)))
    head = torch.log_softmax(adaptive_softmax.head(x).float(), dim=-1)
    first = adaptive_softmax.cutoff[0]
    parts = [head[:, :first]]
    for i, tail in enumerate(adaptive_softmax.tail):
        parts.append(torch.log_softmax(tail(x).float(), dim=-1) + head[:, first + i, None])
    return torch.cat(parts, dim=-1)
