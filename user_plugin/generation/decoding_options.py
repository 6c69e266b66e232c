"""Every decoding option, checked by one validator wherever it enters.

A decoding option reaches the beam search through several doors: ``fairseq-generate``,
``fairseq-interactive`` and ``fairseq-train --eval-bleu-args`` under ``--task
vaswani_translation`` (the task's ``build_generator``), the hub's Python API and its command line
``vaswani-translate``, with either backend (fairseq's beam search or CTranslate2), and the
recipes, whose settings reach ``fairseq-generate`` with our task. Each option has one
:class:`OptionRange` in :data:`OPTIONS`, and every door asks it: :func:`check_value` in code,
:func:`option_type` as an argparse ``type``, :func:`check_decoding_options` for a whole
generation configuration. A bad value is one :class:`DecodingOptionError` line,
``--lenpen: must be a number from 0 to 10 (...), got nan``, which fairseq's command lines print
as ``PROG: error: ...`` (the plugin's one-line exception hook) and the hub's as an argparse
usage error.

**The ranges.** Every number must be finite, and stay finite in what it feeds:

* ``--lenpen`` (alpha of the length penalty) is in ``[0, 10]``. A finished hypothesis' score
  is divided by ``((5 + |Y|) / 6) ** alpha`` (GNMT, the paper) or ``|Y| ** alpha`` (fairseq's
  form, also CTranslate2's internal rule); the scores are float32. At alpha 10 the larger of the
  two, ``|Y| ** 10``, stays below float32's maximum (3.4e38) for every output of up to 7,131
  tokens, and a model's outputs are bounded by its decoder positions (1024 by default);
  :func:`penalty_overflow_problem` checks the actual bound when the model is known. Beyond it
  Python's float power raised ``OverflowError`` (alpha 1000), or the penalty became ``inf`` and
  every score ``-0``. Below 0 the penalty would reward short outputs beyond their raw
  log-probability, which no length normalization means (0 is none: raw ``log P``).
* ``--unkpen``, ``--diverse-beam-strength``, ``--diversity-rate`` and ``--lm-weight`` are
  added to or scale float32 log-probabilities: at most 1000 in magnitude, where ``exp(-1000)``
  is already 0 in float64 (a larger penalty changes nothing but can overflow).
* ``--temperature`` divides the logits, in float16 too (``--fp16``): from 0.01, which keeps
  logits up to 655 finite in float16, to 100 (flatter than any use of sampling needs).
* ``--max-len-a`` is at most 1000 (an output 1000 times its source is beyond every model's
  positions), ``--sampling-topp`` is a probability in (0, 1] or -1 for none.
* Counts are integers: ``--beam`` from 1 to 1000 (its buffers grow with beam x sentences x
  output length), ``--nbest`` from 1 to ``--beam``, and lengths, sizes and the hub's batch size
  up to 2**31 - 1, the largest count that every engine's integers hold; the hub's ``--seed``
  is any seed torch takes (-2**63 to 2**64 - 1).

Combinations that cannot apply are refused too, before any decoding starts: fairseq leaves some
to fail in the middle of decoding with an unrelated error (``--beam 0`` ends in a reshape error
of the first step, a ``--diverse-beam-groups`` that does not divide ``--beam`` fails at the
first step, ``fairseq-generate --constraints`` fails with ``'NoneType' object is not iterable``
on the first batch since binarized data carries no constraints, ``--min-len`` above what the
decoder positions allow is an ``AssertionError``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..files.errors import UserError
from .gnmt_sequence_generator import LENGTH_PENALTY_FORMS, penalty_function

#: The largest count (beam, lengths, sizes, seeds aside) any engine's integers hold.
MAX_COUNT = 2**31 - 1
#: float32's largest finite value: scores and penalties are float32 tensors.
FLOAT32_MAX = 3.4028234663852886e38


class DecodingOptionError(UserError, ValueError):
    """A decoding option, or combination, that cannot apply: one line naming the option."""


@dataclass(frozen=True)
class OptionRange:
    """The values one option takes: ``kind`` (int or float), ``low``..``high`` (inclusive;
    ``low_open`` excludes ``low``), ``off``: values outside the range that mean "not used"
    (``-1`` for ``--sampling-topp``), ``why``: a few words said with a refusal."""

    option: str
    kind: type
    low: float
    high: float
    why: str = ""
    low_open: bool = False
    off: tuple = ()

    def describe(self) -> str:
        """``an integer from 1 to 1000`` / ``a number in (0, 1], or -1 for none``..."""
        noun = "an integer" if self.kind is int else "a number"
        if self.low_open:
            text = f"{noun} in ({_number(self.low)}, {_number(self.high)}]"
        else:
            text = f"{noun} from {_number(self.low)} to {_number(self.high)}"
        if self.off:
            text += ", or " + " or ".join(_number(v) for v in self.off) + " for none"
        return text + (f" ({self.why})" if self.why else "")

    def check(self, value: Any) -> int | float:
        """``value`` as this option's type, or a :class:`DecodingOptionError` line."""
        refused = DecodingOptionError(f"{self.option}: must be {self.describe()}, got "
                                      f"{_shown(value)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise refused
        if self.kind is int:
            if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
                raise refused
            value = int(value)
        else:
            try:
                value = float(value)
            except OverflowError:  # an int beyond any float
                raise refused from None
            if not math.isfinite(value):
                raise refused
        if value in self.off:
            return value
        above_low = value > self.low if self.low_open else value >= self.low
        if not (above_low and value <= self.high):
            raise refused
        return value


def _number(value: float) -> str:
    if value == MAX_COUNT:
        return "2**31 - 1"
    return str(int(value)) if float(value).is_integer() else repr(value)


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _ranges(*ranges: OptionRange) -> dict[str, OptionRange]:
    return {r.option[2:].replace("-", "_"): r for r in ranges}


#: Every numeric decoding option of fairseq's generation options, our task and the hub, by
#: the attribute name fairseq's configuration gives it (``lenpen`` for ``--lenpen``).
OPTIONS: dict[str, OptionRange] = _ranges(
    OptionRange("--beam", int, 1, 1000, "hypotheses kept per sentence"),
    OptionRange("--nbest", int, 1, 1000, "hypotheses returned per sentence, at most --beam"),
    OptionRange("--lenpen", float, 0, 10, "alpha of the length penalty: 0 none, 0.6 the paper; "
                "above 10 it overflows float32 for long outputs"),
    OptionRange("--unkpen", float, -1000, 1000, "a log-probability penalty"),
    OptionRange("--temperature", float, 0.01, 100, "divides the logits; below 0.01 they "
                "overflow float16"),
    OptionRange("--max-len-a", float, 0, 1000, "output tokens per source token"),
    OptionRange("--max-len-b", int, 0, MAX_COUNT),
    OptionRange("--min-len", int, 0, MAX_COUNT),
    OptionRange("--max-len-over-source", int, 0, MAX_COUNT,
                "output tokens beyond the source length", off=(-1,)),
    OptionRange("--sampling-topk", int, 1, MAX_COUNT, off=(-1, 0)),
    OptionRange("--sampling-topp", float, 0, 1, low_open=True, off=(-1,)),
    OptionRange("--diverse-beam-groups", int, 1, 1000, off=(-1, 0)),
    OptionRange("--diverse-beam-strength", float, -1000, 1000, "a log-probability penalty"),
    OptionRange("--diversity-rate", float, -1000, 1000, "a log-probability penalty; -1 none"),
    OptionRange("--no-repeat-ngram-size", int, 0, MAX_COUNT, "0: none"),
    OptionRange("--prefix-size", int, 0, MAX_COUNT, "0: none"),
    OptionRange("--lm-weight", float, -1000, 1000),
    OptionRange("--batch-size", int, 1, MAX_COUNT, "sentences per batch"),
    OptionRange("--seed", int, -(2**63), 2**64 - 1, "torch's seeds"),
)


def check_value(name: str, value: Any) -> Any:
    """``value`` of option ``name`` (``"lenpen"``, or ``"--lenpen"``) checked against its range
    and converted to its type; None stays None (not set)."""
    if value is None:
        return None
    return OPTIONS[name.lstrip("-").replace("-", "_")].check(value)


def check_values(**values: Any) -> dict[str, Any]:
    """:func:`check_value` of each keyword (``check_values(beam=4, lenpen=0.6)``); returns
    them converted."""
    return {name: check_value(name, value) for name, value in values.items()}


def option_type(name: str) -> Callable[[str], int | float]:
    """An argparse ``type`` for option ``name``: the text parsed as its kind and checked; a bad
    value is argparse's usage error ``argument --lenpen: must be ...``."""
    spec = OPTIONS[name.lstrip("-").replace("-", "_")]

    def parse(text: str) -> int | float:
        try:
            value = spec.kind(text)
        except ValueError:
            value = text
        try:
            return spec.check(value)
        except DecodingOptionError as error:
            raise argparse.ArgumentTypeError(str(error).split(": ", 1)[1]) from None

    parse.__name__ = spec.describe()
    return parse


def penalty_overflow_problem(alpha: float, longest: int | None,
                             forms: Iterable[str] = LENGTH_PENALTY_FORMS) -> str | None:
    """Why a length penalty with ``alpha`` overflows float32 for an output of ``longest``
    tokens (EOS included) in one of ``forms``, or None."""
    if longest is None or longest < 1:
        return None
    for form in forms:
        try:
            penalty = penalty_function(form)(longest, alpha)
        except OverflowError:
            penalty = math.inf
        if penalty > FLOAT32_MAX:
            return (f"--lenpen: {alpha} is too large for outputs of up to {longest} tokens: "
                    f"the {form} length penalty overflows float32; give at most "
                    f"{largest_safe_alpha(longest, form):.2f}")
    return None


def largest_safe_alpha(longest: int, form: str) -> float:
    """The largest alpha whose ``form`` penalty of ``longest`` tokens stays within float32."""
    base = (5.0 + longest) / 6.0 if form == "gnmt" else float(longest)
    return math.log(FLOAT32_MAX) / math.log(base) if base > 1 else math.inf


def check_decoding_options(args, datasets: Iterable = (), max_positions: int | None = None,
                           penalty_forms: Iterable[str] = ("gnmt",),
                           max_len_over_source: int | None = None) -> None:
    """Refuse values and combinations that cannot apply (see the module docstring).

    ``args`` is a generation configuration (``cfg.generation``, or any object with fairseq's
    option names, such as ``--eval-bleu-args``' namespace); every option it holds is checked
    against :data:`OPTIONS`. ``datasets`` are the splits the task has loaded from disk, whose
    pairs carry no constraints (``fairseq-interactive`` builds its batches, constraints
    included, after the generator). ``max_positions`` is the decoder's (the longest output,
    EOS included), when known, and ``penalty_forms`` the length penalties computed from
    ``--lenpen`` (CTranslate2 computes fairseq's form besides the GNMT one it is re-ranked by);
    ``max_len_over_source`` is the task's per-sentence limit.
    """
    values = {}
    for name in OPTIONS:
        value = _get(args, name)
        if value is not None:
            values[name] = check_value(name, value)
    if max_len_over_source is not None:
        values["max_len_over_source"] = check_value("max_len_over_source",
                                                     max_len_over_source)
    beam = values.get("beam", 5)
    nbest = values.get("nbest", 1)
    if nbest > beam:
        raise DecodingOptionError(
            f"--nbest: must be between 1 and --beam {beam} (the hypotheses a search keeps), "
            f"got {nbest}")
    if not _get(args, "sampling"):
        # fairseq's generator asserts these: only sampling draws from the top k or top p
        for name, off in (("sampling_topk", 0), ("sampling_topp", 0.0)):
            if values.get(name, -1) >= off:
                option = "--" + name.replace("_", "-")
                raise DecodingOptionError(
                    f"{option}: only applies with --sampling (it limits the tokens a sample "
                    f"is drawn from), got {values[name]} without it")
    groups = values.get("diverse_beam_groups", -1)
    if groups > 0 and beam % groups:
        raise DecodingOptionError(
            f"--diverse-beam-groups: {groups} must divide --beam {beam} (each group holds "
            "the same number of hypotheses)")
    longest = None if max_positions is None else int(max_positions)
    if "lenpen" in values:
        problem = penalty_overflow_problem(values["lenpen"], longest, penalty_forms)
        if problem is not None:
            raise DecodingOptionError(problem)
    min_len = values.get("min_len", 1)
    if longest is not None and min_len > longest - 1:
        raise DecodingOptionError(
            f"--min-len: {min_len} is more than the model's decoder positions allow "
            f"({longest - 1} tokens before EOS)")
    per_sentence = values.get("max_len_over_source", -1) >= 0
    if not per_sentence and values.get("max_len_a", 0) == 0 and \
            values.get("max_len_b", 200) < min_len:
        raise DecodingOptionError(
            f"--max-len-b: {values['max_len_b']} is below --min-len {min_len} (with "
            "--max-len-a 0 every output is cut before it may end)")
    if _get(args, "constraints") and any(
        getattr(dataset, "constraints", None) is None for dataset in datasets
    ):
        raise DecodingOptionError(
            "--constraints: binarized data carries no constraints; give them to "
            "fairseq-interactive as 'source<TAB>constraint<TAB>...' lines"
        )


def _get(args, name: str) -> Any:
    if isinstance(args, dict):
        return args.get(name)
    return getattr(args, name, None)
