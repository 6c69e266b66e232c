"""Translating with a loaded ensemble: encoded lines through the task's beam search, raw text
through the :class:`~user_plugin.hub.text_codec.TextCodec` around it."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Sequence

import torch

from .text_codec import TextCodec


def max_source_tokens(max_positions) -> int | None:
    """The source part of fairseq's resolved ``max_positions`` (an int or a (source, target)
    pair, None when unlimited)."""
    if isinstance(max_positions, (tuple, list)):
        max_positions = max_positions[0]
    return None if max_positions is None else int(max_positions)


class TextTranslator:
    """Raw text in, raw text out, around a :meth:`translate_tokens` of model tokens: the text
    pipeline shared by the hub's backends (fairseq's beam search, CTranslate2)."""

    codec: TextCodec

    def translate_tokens(
        self, lines: Sequence[str], nbest: int = 1, beam: int | None = None,
        lenpen: float | None = None,
    ) -> list[list[dict]]:
        """Per encoded line, ``nbest`` dicts best first with the ``tokens`` string."""
        raise NotImplementedError

    def translate(
        self, sentences: str | Sequence[str], nbest: int = 1, beam: int | None = None,
        lenpen: float | None = None,
    ):
        """Translate raw text.

        ``translate("s")`` -> str; ``translate("s", nbest=k)`` -> k strings (best first);
        ``translate([...])`` -> one str (or one list of k strings) per sentence. An empty (or
        blank) sentence gives an empty translation without decoding. A sentence longer than the
        model's source positions is a ``ValueError`` naming it, raised before any decoding.
        """
        single = isinstance(sentences, str)
        lines = [sentences] if single else list(sentences)
        encoded = [self.codec.encode(line) for line in lines]
        # An empty line translates to an empty line (not decoded), so outputs stay aligned.
        kept = [i for i, line in enumerate(encoded) if line.strip()]
        hypos = self.translate_tokens(
            [encoded[i] for i in kept], nbest=nbest, beam=beam, lenpen=lenpen
        )
        outputs = [[""] * nbest for _ in lines]
        for i, per_line in zip(kept, hypos):
            outputs[i] = [self.codec.decode(h["tokens"]) for h in per_line]
        if nbest == 1:
            outputs = [per_line[0] for per_line in outputs]
        return outputs[0] if single else outputs


class Translator(TextTranslator):
    """An ensemble of checkpoints with its task, dictionaries and text pre/post-processing.

    :meth:`translate_tokens` decodes lines of model tokens; :meth:`translate` wraps it with the
    codec, for raw text. The generator is built per (beam, lenpen) by the task, so the
    ``vaswani_translation`` task's GNMT penalty and source + N length limit apply.
    """

    def __init__(
        self,
        task,
        models: Sequence[torch.nn.Module],
        codec: TextCodec,
        beam: int = 4,
        lenpen: float = 0.6,
        batch_size: int = 64,
        max_tokens: int | None = None,
    ) -> None:
        from fairseq import utils

        self.task = task
        self.models = list(models)
        self.codec = codec
        self.beam = beam
        self.lenpen = lenpen
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.max_positions = utils.resolve_max_positions(
            task.max_positions(), *[model.max_positions() for model in self.models]
        )
        self._generators: dict = {}

    @property
    def device(self) -> torch.device:
        return next(self.models[0].parameters()).device

    def generator(self, beam: int, lenpen: float):
        """The task's sequence generator for these decoding settings (built once, then kept)."""
        key = (beam, lenpen)
        if key not in self._generators:
            args = Namespace(beam=beam, lenpen=lenpen, max_len_a=0, max_len_b=200, min_len=1)
            self._generators[key] = self.task.build_generator(self.models, args)
        return self._generators[key]

    def translate_tokens(
        self, lines: Sequence[str], nbest: int = 1, beam: int | None = None,
        lenpen: float | None = None,
    ) -> list[list[dict]]:
        """Decode already encoded source lines (model tokens, space separated).

        Returns, per line, ``nbest`` dicts best first: ``tokens`` (target token string),
        ``score`` (length-normalized log-probability), ``positional_scores`` (tensor).
        """
        from fairseq import utils

        beam = self.beam if beam is None else beam
        lenpen = self.lenpen if lenpen is None else lenpen
        if not 1 <= nbest <= beam:
            raise ValueError(f"nbest must be between 1 and the beam size {beam}, got {nbest}")
        generator = self.generator(beam, lenpen)
        src_dict, tgt_dict = self.task.source_dictionary, self.task.target_dictionary
        tokens = [src_dict.encode_line(line, add_if_not_exist=False).long() for line in lines]
        if not tokens:
            return []
        longest = max_source_tokens(self.max_positions)
        for number, sentence in enumerate(tokens, start=1):
            if longest is not None and sentence.numel() > longest:
                raise ValueError(
                    f"sentence {number} has {sentence.numel()} tokens (with EOS), more than the "
                    f"model's {longest} source positions: split or shorten it"
                )
        dataset = self.task.build_dataset_for_inference(
            tokens, torch.LongTensor([t.numel() for t in tokens])
        )
        batches = self.task.get_batch_iterator(
            dataset=dataset, max_tokens=self.max_tokens, max_sentences=self.batch_size,
            max_positions=self.max_positions, disable_iterator_cache=True,
        ).next_epoch_itr(shuffle=False)
        results: dict = {}
        with torch.no_grad():
            for batch in batches:
                batch = utils.apply_to_sample(lambda t: t.to(self.device), batch)
                hypos = self.task.inference_step(generator, self.models, batch)
                for sample_id, sentence_hypos in zip(batch["id"].tolist(), hypos):
                    results[sample_id] = [
                        {
                            "tokens": tgt_dict.string(hypo["tokens"].int().cpu()),
                            "score": float(hypo["score"]),
                            "positional_scores": hypo["positional_scores"].cpu(),
                        }
                        for hypo in sentence_hypos[:nbest]
                    ]
        return [results[i] for i in range(len(tokens))]
