"""Alignments between each output token and the source (``--print-alignment``, ``--replace-unk``).

fairseq reads alignments from the encoder-decoder attention, as "Jointly Learning to Align and
Translate with Transformer Models" (Garg et al. 2019) does: one decoder layer's attention,
averaged over heads (``--alignment-layer``, ``--alignment-heads``: model options, see
:mod:`user_plugin.models.decoder`), recorded step by step by beam search into each
hypothesis' ``attention`` ([S, |Y|]); a *hard* alignment links each output token to the source
token it attends to most (token indices counted without EOS and padding), a *soft* one prints
the scores.

Our decoder computes attention probabilities only when asked (otherwise PyTorch's fused
scaled dot-product attention runs, which returns none), so alignments are switched on
explicitly: by the model's ``prepare_for_inference_`` when a generation configuration asks for
them (:func:`alignment_requested`: this serves fairseq's own generator under ``--task
translation`` too), and by :class:`GNMTSequenceGeneratorWithAlignment` for the models it
decodes with (:func:`set_alignment_output`).

:class:`GNMTSequenceGeneratorWithAlignment` is the paper's beam search (GNMT penalty, source +
50 limit) with fairseq's alignment extraction after it. A model with ``full_context_alignment``
gets its alignments from a forward pass over each finished hypothesis instead, as in fairseq.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from fairseq import utils
from fairseq.data import data_utils
from torch import Tensor

from .decoding_options import DecodingOptionError
from .gnmt_sequence_generator import GNMTSequenceGenerator

ALIGNMENT_FORMS = ("hard", "soft")


def alignment_requested(generation_cfg) -> bool:
    """Whether a generation configuration needs alignments: ``--print-alignment`` or
    ``--replace-unk`` (which copies the aligned source word in place of ``<unk>``)."""
    return bool(getattr(generation_cfg, "print_alignment", None)) or (
        getattr(generation_cfg, "replace_unk", None) is not None
    )


def check_replace_unk(cfg) -> None:
    """Refuse ``--replace-unk`` without ``--print-alignment`` under a task that builds its
    generator as fairseq's tasks do (``--task translation``): fairseq's generator computes no
    alignments then, and every ``<unk>`` would fail to be replaced. Our task aligns for it."""
    from fairseq.tasks import TASK_REGISTRY, FairseqTask

    generation = cfg.generation
    if getattr(generation, "replace_unk", None) is None or generation.print_alignment:
        return
    task = TASK_REGISTRY.get(getattr(cfg.task, "_name", None))
    if task is not None and task.build_generator is FairseqTask.build_generator:
        raise DecodingOptionError(
            f"--replace-unk needs --print-alignment under --task {cfg.task._name} (fairseq's "
            "generator computes alignments only then); --task vaswani_translation needs neither"
        )


def set_alignment_output(models: Iterable[torch.nn.Module], on: bool = True) -> None:
    """Make the decoders of ``models`` that compute attention only on request (ours:
    ``decoder.return_alignment``) return their alignment scores at every call, or stop."""
    for model in models:
        decoder = getattr(model, "decoder", None)
        if hasattr(decoder, "return_alignment"):
            decoder.return_alignment = on


class GNMTSequenceGeneratorWithAlignment(GNMTSequenceGenerator):
    """:class:`GNMTSequenceGenerator` that also fills each hypothesis' ``alignment``.

    Args (besides :class:`GNMTSequenceGenerator`'s):
        print_alignment: ``"hard"`` (``(source word, target word)`` index pairs) or ``"soft"``
            (per target token, the scores over the source tokens, as strings).
        left_pad_target: how finished hypotheses are batched for a full-context pass.
    """

    def __init__(self, models, tgt_dict, print_alignment: str = "hard",
                 left_pad_target: bool = False, **kwargs) -> None:
        print_alignment = "hard" if print_alignment is True else print_alignment
        if print_alignment not in ALIGNMENT_FORMS:
            raise ValueError(
                f"--print-alignment must be one of {ALIGNMENT_FORMS}, got {print_alignment!r}"
            )
        super().__init__(models, tgt_dict, **kwargs)
        set_alignment_output(self.model.models, True)
        self.print_alignment = print_alignment
        self.left_pad_target = left_pad_target
        self.extract_alignment = (
            utils.extract_hard_alignment if print_alignment == "hard"
            else utils.extract_soft_alignment
        )

    @torch.no_grad()
    def generate(self, models, sample, **kwargs):
        """Beam search, then the alignment of every finished hypothesis."""
        return add_alignments(self, sample, self._generate(sample, **kwargs))


def add_alignments(generator, sample: dict, finalized: list) -> list:
    """Fill the ``alignment`` of every hypothesis of ``finalized`` (any number per sentence),
    as fairseq's ``SequenceGeneratorWithAlignment`` does: from the attention recorded step by
    step, or, when a model has ``full_context_alignment``, from a forward pass of the ensemble
    over the finished hypotheses. ``generator`` provides ``model.models``, ``pad``, ``eos``,
    ``left_pad_target`` and ``extract_alignment`` (fairseq's hard or soft extraction)."""
    rows = [sentence for sentence, hypos in enumerate(finalized) for _ in hypos]
    if not rows:
        return finalized
    hypos = [hypo for sentence_hypos in finalized for hypo in sentence_hypos]
    net_input = sample["net_input"]
    index = torch.tensor(rows, device=net_input["src_tokens"].device)
    src_tokens = net_input["src_tokens"].index_select(0, index)
    tokens = [hypo["tokens"] for hypo in hypos]
    pad, eos, left_pad = generator.pad, generator.eos, generator.left_pad_target
    targets = data_utils.collate_tokens(tokens, pad, eos, left_pad)
    models = generator.model.models
    if any(getattr(model, "full_context_alignment", False) for model in models):
        prev_output_tokens = data_utils.collate_tokens(
            tokens, pad, eos, left_pad, move_eos_to_beginning=True
        )
        src_lengths = net_input["src_lengths"].index_select(0, index)
        scores = list(full_context_scores(models, src_tokens, src_lengths, prev_output_tokens))
    else:
        scores = [hypo_scores(hypo) for hypo in hypos]
    src_tokens, targets = src_tokens.cpu(), targets.cpu()
    for k, hypo in enumerate(hypos):
        hypo["alignment"] = generator.extract_alignment(
            scores[k].float().cpu(), src_tokens[k], targets[k], pad, eos
        )
    return finalized


def full_context_scores(models, src_tokens: Tensor, src_lengths: Tensor,
                        prev_output_tokens: Tensor) -> Tensor:
    """The alignment scores ``[N, T, S]`` of a teacher-forced pass of every model over the
    finished hypotheses, averaged over the ensemble (fairseq's ``forward_align``)."""
    total = None
    for model in models:
        attn = model(src_tokens, src_lengths, prev_output_tokens)[1]["attn"][0]
        if attn is None:
            raise ValueError(f"{type(model).__name__} returned no attention to align with")
        total = attn.float() if total is None else total + attn.float()
    return total / len(models)


def hypo_scores(hypo: dict) -> Tensor:
    """A finished hypothesis' recorded attention as ``[|Y|, S]``."""
    attention = hypo["attention"]
    if attention.dim() != 2:
        raise ValueError(
            "a model of the ensemble recorded no encoder-decoder attention, so there is "
            "nothing to align with"
        )
    return attention.transpose(0, 1)
