"""Translating with a loaded ensemble: encoded lines through the task's decoding, raw text
through the :class:`~user_plugin.artifacts.text_pipeline.TextPipeline` around it.

Decoding is the paper's beam search by default (beam 4, GNMT penalty alpha 0.6, source + 50);
a call may ask for n-best lists, sampling (top-k, top-p, temperature, with a seed), lexical
constraints, and alignments, each as ``fairseq-generate`` / ``fairseq-interactive`` would
decode it under ``--task vaswani_translation`` (docs/decoding.md).
"""

from __future__ import annotations

import contextlib
from argparse import Namespace
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..artifacts.text_pipeline import TextPipeline
from ..files.errors import InvalidValue
from ..generation.alignment import set_alignment_output
from ..generation.decoding_options import check_value, check_values
from ..paper import BEAM, LENPEN

#: The most sequence generators a translator keeps (one per way of decoding, see
#: :meth:`Translator.generator`).
KEPT_GENERATORS = 16


def max_source_tokens(max_positions) -> int | None:
    """The source part of fairseq's resolved ``max_positions`` (an int or a (source, target)
    pair, None when unlimited)."""
    if isinstance(max_positions, (tuple, list)):
        max_positions = max_positions[0]
    return None if max_positions is None else int(max_positions)


@dataclass(frozen=True)
class DecodingSettings:
    """One way of decoding, in fairseq's generation option names: beam search with the
    paper's penalty by default; ``sampling`` draws ``beam`` samples (``sampling_topk``,
    ``sampling_topp``, ``temperature``); ``constraints`` (``"ordered"``, ``"unordered"``)
    decodes with lexical constraints; ``alignment`` computes hard alignments."""

    beam: int = BEAM
    lenpen: float = LENPEN
    sampling: bool = False
    sampling_topk: int = -1
    sampling_topp: float = -1.0
    temperature: float = 1.0
    constraints: str | None = None
    alignment: bool = False

    def generation_args(self, nbest: int) -> Namespace:
        """These settings as the generation options that ``task.build_generator`` reads."""
        return Namespace(
            beam=self.beam, nbest=nbest, lenpen=self.lenpen, max_len_a=0, max_len_b=200,
            min_len=1, sampling=self.sampling, sampling_topk=self.sampling_topk,
            sampling_topp=self.sampling_topp, temperature=self.temperature,
            constraints=self.constraints, print_alignment="hard" if self.alignment else None,
        )


class TextTranslator:
    """Raw text in, raw text out, around a :meth:`translate_tokens` of model tokens: the text
    pipeline shared by the hub's backends (fairseq's beam search, CTranslate2)."""

    codec: TextPipeline

    def source_symbols(self) -> set[str]:
        """The model's source vocabulary (a token outside it is fed as ``<unk>``)."""
        raise NotImplementedError

    def source_limit(self) -> int | None:
        """The most source tokens (EOS included) the model takes, or None."""
        raise NotImplementedError

    def length_problem(self, sentences: Sequence[str]) -> str | None:
        """Why the model cannot take one of the raw ``sentences`` (longer than its source
        positions once through the text pipeline), or None; nothing is decoded."""
        limit = self.source_limit()
        if limit is None:
            return None
        for number, line in enumerate(sentences, start=1):
            tokens = len(self.codec.encode(line).split()) + 1
            if tokens > limit:
                return too_long(number, tokens, limit)
        return None

    def model_tokens(self, sentences: Sequence[str]) -> list[str]:
        """Per raw sentence, the tokens the model is fed (space separated, without EOS):
        the text pipeline's tokens, those outside the source vocabulary as ``<unk>``."""
        known = self.source_symbols()
        return [" ".join(token if token in known else "<unk>"
                         for token in self.codec.encode(line).split()) for line in sentences]

    def translate_tokens(
        self, lines: Sequence[str], nbest: int = 1, beam: int | None = None,
        lenpen: float | Sequence[float] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
        **decoding: Any,
    ) -> list[list[dict]]:
        """Per encoded line, ``nbest`` dicts best first with the ``tokens`` string; the
        decoding keywords are the fairseq backend's, and a backend refuses those it lacks."""
        raise NotImplementedError

    def translate(
        self,
        sentences: str | Sequence[str],
        nbest: int = 1,
        beam: int | None = None,
        lenpen: float | Sequence[float] | None = None,
        constraints: Sequence[str] | Sequence[Sequence[str]] | None = None,
        **decoding: Any,
    ):
        """Translate raw text.

        ``translate("s")`` -> str; ``translate("s", nbest=k)`` -> k strings (best first);
        ``translate([...])`` -> one str (or one list of k strings) per sentence. An empty (or
        blank) sentence gives an empty translation without decoding. A sentence longer than the
        model's source positions is a ``ValueError`` naming it, raised before any decoding.

        ``constraints``: raw target phrases the translation must contain (a list for one
        sentence, one list per sentence for several), tokenized and split into subwords as the
        output is; an empty sentence with constraints is a ``ValueError`` (there is nothing
        to translate). Other keywords as :meth:`translate_tokens` (``unordered_constraints``,
        ``sampling``, ``sampling_topk``, ``sampling_topp``, ``temperature``, ``seed``).
        """
        single = isinstance(sentences, str)
        if isinstance(sentences, (bytes, bytearray)):
            raise InvalidValue("sentences must be text (str), got bytes: decode them first")
        lines = [sentences] if single else list(sentences)
        for number, line in enumerate(lines, start=1):
            if not isinstance(line, str):
                raise InvalidValue(f"sentence {number} is of type {type(line).__name__}, not str: "
                                   "give a str, or a list of str for several sentences")
        if constraints is not None:
            constraints = checked_constraints(constraints, single, len(lines))
        encoded = [self.codec.encode(line) for line in lines]
        # An empty line translates to an empty line (not decoded), so outputs stay aligned.
        kept = [i for i, line in enumerate(encoded) if line.strip()]
        kept_constraints = None
        if constraints is not None:
            for number, (line, phrases) in enumerate(zip(encoded, constraints), start=1):
                if not line.strip() and any(phrase.strip() for phrase in phrases):
                    raise InvalidValue(
                        f"sentence {number} is empty but has the constraints {list(phrases)!r}: "
                        "nothing to translate; give the sentence the constraints are for")
            kept_constraints = [[self.codec.encode(phrase, target=True) for phrase in
                                 constraints[i]] for i in kept]
        alphas = sentence_lenpens(lenpen, len(lines))
        if alphas is not None:
            lenpen = [alphas[i] for i in kept]
        hypos = self.translate_tokens(
            [encoded[i] for i in kept], nbest=nbest, beam=beam, lenpen=lenpen,
            constraints=kept_constraints, **decoding,
        )
        outputs = [[""] * nbest for _ in lines]
        for i, per_line in zip(kept, hypos):
            outputs[i] = [self.codec.decode(h["tokens"]) for h in per_line]
        if nbest == 1:
            outputs = [per_line[0] for per_line in outputs]
        return outputs[0] if single else outputs


def too_long(number: int, tokens: int, limit: int) -> str:
    """The line refusing sentence ``number`` of ``tokens`` model tokens (with EOS) where the
    model takes ``limit``."""
    return (f"sentence {number} has {tokens} tokens (with EOS), more than the model's {limit} "
            "source positions: split or shorten it")


def sentence_lenpens(lenpen: Any, count: int) -> list[float] | None:
    """``lenpen`` given as one alpha per line (each checked), or None when it is one alpha (or
    None); an :class:`InvalidValue` when the count is not ``count``."""
    if lenpen is None or isinstance(lenpen, (int, float)):
        return None
    if isinstance(lenpen, (str, bytes)):
        raise InvalidValue(f"lenpen= must be a number, or a list of one per sentence, got the "
                           f"{type(lenpen).__name__} {lenpen!r}")
    alphas = list(lenpen)
    if len(alphas) != count:
        raise InvalidValue(f"lenpen= needs one alpha, or one per sentence ({count}), got "
                           f"{len(alphas)}")
    for alpha in alphas:
        check_value("lenpen", alpha)
    return [float(alpha) for alpha in alphas]


def per_sentence_alphas(generator, alphas: list[float] | None, ids: list[int]):
    """A context in which ``generator`` decodes the batch of lines ``ids`` with each line's
    alpha: the GNMT generator takes one per sentence; another generator (fairseq's own, under
    another task) only one alpha for all, so lines asking for different ones are refused."""
    if alphas is None:
        return contextlib.nullcontext()
    batch = [alphas[i] for i in ids]
    if hasattr(generator, "sentence_alphas"):
        return generator.sentence_alphas(batch)
    if len(set(batch)) > 1:
        raise InvalidValue("this model's search takes one lenpen for all the sentences")
    generator.len_penalty = batch[0]
    return contextlib.nullcontext()


def checked_constraints(constraints: Any, single: bool, count: int) -> list[list[str]]:
    """``constraints`` as one list of phrases per sentence, checked by type: a list of strings
    for one sentence (``translate("s", constraints=["Hund"])``), one such list per sentence for
    several. A ``ValueError`` naming what was given otherwise (a bare string would be taken as
    its letters, a constraint each)."""
    expected = ("a list of phrases (strings) for one sentence" if single
                else f"one list of phrases (strings) per sentence ({count})")

    def phrases(value: Any) -> bool:
        return isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value)

    if single:
        if not phrases(constraints):
            raise InvalidValue(f"constraints= needs {expected}, got {type(constraints).__name__} "
                             f"{constraints!r:.60}")
        return [list(constraints)]
    if (not isinstance(constraints, (list, tuple)) or len(constraints) != count
            or not all(phrases(item) for item in constraints)):
        raise InvalidValue(f"constraints= needs {expected}, got {constraints!r:.80}")
    return [list(item) for item in constraints]


class Translator(TextTranslator):
    """An ensemble of checkpoints with its task, dictionaries and text pre/post-processing.

    :meth:`translate_tokens` decodes lines of model tokens; :meth:`translate` wraps it with the
    codec, for raw text. The generator is built per :class:`DecodingSettings` by the task, so
    the ``vaswani_translation`` task's GNMT penalty and source + N length limit apply to every
    way of decoding.
    """

    def __init__(
        self,
        task,
        models: Sequence[torch.nn.Module],
        codec: TextPipeline,
        beam: int = BEAM,
        lenpen: float = LENPEN,
        batch_size: int = 64,
        max_tokens: int | None = None,
    ) -> None:
        from fairseq import utils

        check_values(beam=beam, lenpen=lenpen, batch_size=batch_size)
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

    def source_limit(self) -> int | None:
        return max_source_tokens(self.max_positions)

    @property
    def generators_kept(self) -> int:
        """How many sequence generators are kept (:meth:`generator`)."""
        return len(self._generators)

    def source_symbols(self) -> set[str]:
        dictionary = self.task.source_dictionary
        return {symbol for symbol in dictionary.symbols
                if dictionary.index(symbol) != dictionary.unk()} | {"<unk>"}

    @property
    def device(self) -> torch.device:
        return next(self.models[0].parameters()).device

    def generator(self, settings: DecodingSettings, nbest: int = 1):
        """The task's sequence generator for ``settings`` (built once, then kept), with
        ``settings.lenpen`` as its alpha. The penalty is not part of what is kept: it is an
        attribute the search reads when hypotheses finish, set for each call, so that callers
        choosing their own alphas (a server's clients) neither grow the kept generators nor
        split a batch. At most :data:`KEPT_GENERATORS` are kept, the least recently used
        dropped first."""
        key = (replace(settings, lenpen=LENPEN), nbest)
        generator = self._generators.pop(key, None)
        if generator is None:
            generator = self.task.build_generator(self.models, settings.generation_args(nbest))
        self._generators[key] = generator
        while len(self._generators) > KEPT_GENERATORS:
            self._generators.pop(next(iter(self._generators)))
        generator.len_penalty = settings.lenpen
        return generator

    def translate_tokens(
        self,
        lines: Sequence[str],
        nbest: int = 1,
        beam: int | None = None,
        lenpen: float | Sequence[float] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
        unordered_constraints: bool = False,
        sampling: bool = False,
        sampling_topk: int = -1,
        sampling_topp: float = -1.0,
        temperature: float = 1.0,
        seed: int | None = None,
        alignment: bool = False,
    ) -> list[list[dict]]:
        """Decode already encoded source lines (model tokens, space separated).

        Returns, per line, ``nbest`` dicts best first: ``tokens`` (target token string),
        ``score`` (length-normalized log-probability), ``positional_scores`` (tensor), and with
        ``alignment``, ``alignment``: ``(source, target)`` token index pairs (0-based, EOS
        excluded) from the encoder-decoder attention.

        ``constraints``: per line, the phrases (model tokens, space separated) its output must
        contain, in this order unless ``unordered_constraints``. ``sampling``: ``nbest``
        samples per line (``beam`` of them when given), from the top ``sampling_topk``
        tokens or the nucleus of mass ``sampling_topp`` of the distribution sharpened or
        flattened by ``temperature``. ``seed`` makes a call repeatable (torch's random state
        is restored afterwards). The beam and penalty default to the translator's; ``lenpen``
        may also give one alpha per line (decoded in the same batches).
        """
        from fairseq import utils

        check_value("seed", seed)
        if beam is None:
            beam = nbest if sampling else self.beam
        alphas = sentence_lenpens(lenpen, len(lines))
        settings = DecodingSettings(
            beam=beam, lenpen=self.lenpen if lenpen is None or alphas else lenpen,
            sampling=sampling,
            sampling_topk=sampling_topk, sampling_topp=sampling_topp, temperature=temperature,
            constraints=None if constraints is None
            else ("unordered" if unordered_constraints else "ordered"),
            alignment=alignment,
        )
        # the task checks every setting (one line naming the option) as it builds the search
        generator = self.generator(settings, nbest)
        src_dict = self.task.source_dictionary
        tokens = [src_dict.encode_line(line, add_if_not_exist=False).long() for line in lines]
        if not tokens:
            return []
        longest = max_source_tokens(self.max_positions)
        for number, sentence in enumerate(tokens, start=1):
            if longest is not None and sentence.numel() > longest:
                raise InvalidValue(too_long(number, sentence.numel(), longest))
        packed = None if constraints is None else self.pack_constraints(constraints, len(lines))
        dataset = self.task.build_dataset_for_inference(
            tokens, torch.LongTensor([t.numel() for t in tokens]), constraints=packed
        )
        batches = self.task.get_batch_iterator(
            dataset=dataset, max_tokens=self.max_tokens, max_sentences=self.batch_size,
            max_positions=self.max_positions, disable_iterator_cache=True,
        ).next_epoch_itr(shuffle=False)
        set_alignment_output(self.models, alignment)
        seeded = utils.set_torch_seed(seed) if seed is not None else contextlib.nullcontext()
        results: dict = {}
        with torch.no_grad(), seeded:
            for batch in batches:
                batch = utils.apply_to_sample(lambda t: t.to(self.device), batch)
                with per_sentence_alphas(generator, alphas, batch["id"].tolist()):
                    hypos = self.task.inference_step(
                        generator, self.models, batch, constraints=batch.get("constraints")
                    )
                for sample_id, sentence_hypos in zip(batch["id"].tolist(), hypos):
                    results[sample_id] = [
                        self.hypothesis(hypo, alignment) for hypo in sentence_hypos[:nbest]
                    ]
        return [results[i] for i in range(len(tokens))]

    def pack_constraints(self, constraints: Sequence[Sequence[str]], lines: int) -> torch.Tensor:
        """Per-line constraint phrases (model tokens) in fairseq's packed form; a
        ``ValueError`` when there is not one list of phrases per line."""
        from fairseq.token_generation_constraints import pack_constraints

        if isinstance(constraints, str) or len(constraints) != lines:
            raise InvalidValue(
                f"constraints= needs one list of phrases per sentence ({lines}), "
                f"got {constraints!r}"
            )
        tgt_dict = self.task.target_dictionary
        return pack_constraints([
            [tgt_dict.encode_line(phrase, append_eos=False, add_if_not_exist=False).long()
             for phrase in phrases if phrase.strip()]
            for phrases in constraints
        ])

    def hypothesis(self, hypo: dict, alignment: bool) -> dict:
        """One decoded hypothesis as the hub returns it."""
        out = {
            "tokens": self.task.target_dictionary.string(hypo["tokens"].int().cpu()),
            "score": float(hypo["score"]),
            "positional_scores": hypo["positional_scores"].cpu(),
        }
        if alignment:
            out["alignment"] = [(int(s), int(t)) for s, t in hypo["alignment"]]
        return out
