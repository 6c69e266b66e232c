"""The JSON bodies of ``POST /translate`` and ``POST /attention``, read and checked field by
field: what a client sent becomes a :class:`TranslateRequest`, or a :class:`RequestError` with
the HTTP status and one line naming the field.

The text is treated as ``vaswani-translate`` treats its input: bytes that are not UTF-8 refuse
the whole body (as they refuse the whole of standard input), a byte-order mark at the start is
dropped, and every character a JSON string can hold goes to the model's text pipeline as it is
(NUL, CR, U+2028 ... included, as in a line of standard input). A lone surrogate
(``"\\ud800"``), which no UTF-8 input can hold, is refused naming the sentence.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ..files.text import BYTE_ORDER_MARK
from ..generation.decoding_options import DecodingOptionError, check_value
from .limits import Limits
from .served_model import DecodingOptions

#: The decoding of a request that names no option: the paper's.
PAPER_OPTIONS = DecodingOptions()


class RequestError(Exception):
    """A request the server refuses: ``status`` (an HTTP code) and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class TranslateRequest:
    """The sentences of one request and how to decode them."""

    sentences: tuple[str, ...]
    options: DecodingOptions


def _kind(value: object) -> str:
    """A JSON value's kind in the words of JSON, for error lines."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _integer(body: dict, name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    whole = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)
                                       and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise RequestError(422, f"{name}: expected an integer, got {_kind(value)}"
                           + (f" ({value})" if isinstance(value, float) else ""))
    value = int(value)
    if not low <= value <= high:
        raise RequestError(422, f"{name}: must be between {low} and {high}, got {value}")
    return value


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(422, f"{name}: expected a number, got {_kind(value)}")
    try:
        return float(check_value(name, value))
    except DecodingOptionError as error:
        # the decoding options' one range, named as the request's field
        raise RequestError(422, str(error).removeprefix("--")) from None


def _sentence(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise RequestError(422, f"{where}: expected a string, got {_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RequestError(422, f"{where}: not valid Unicode text (a lone surrogate at "
                           f"character {error.start})") from None
    return value


#: The most digits of a JSON integer the server reads: every integer field is small, and
#: Python refuses to read integers of more than 4,300 digits (with a ValueError).
MAX_INTEGER_DIGITS = 100


def _bounded_integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise RequestError(422, f"body: an integer of {len(text.lstrip('-'))} digits (the "
                           f"fields take integers of at most {MAX_INTEGER_DIGITS})")
    return int(text)


def _no_constant(name: str) -> None:
    """Python's JSON reader takes ``NaN`` and ``Infinity``; JSON has no such values."""
    raise RequestError(422, f"body: not JSON ({name} is not a JSON value)")


def _once_each(pairs: list) -> dict:
    """A JSON object whose fields are each given once: Python's reader keeps the last of a
    repeated field, so a body naming ``text`` twice would silently lose the first."""
    body: dict = {}
    for name, value in pairs:
        if name in body:
            raise RequestError(422, f"{name}: given twice in one object (each field once)")
        body[name] = value
    return body


def parse_json(data: bytes) -> dict:
    """A request body as a JSON object; a :class:`RequestError` (422) naming what is wrong:
    bytes that are not UTF-8 (with the byte offset), text that is not JSON (with line and
    column), JSON nested deeper than Python's reader goes, an integer of more than
    :data:`MAX_INTEGER_DIGITS` digits, a field given twice, or JSON that is not an object."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(422, f"body: not valid UTF-8 text (byte {error.start})") from None
    try:
        body = json.loads(text.removeprefix(BYTE_ORDER_MARK), parse_constant=_no_constant,
                          parse_int=_bounded_integer, object_pairs_hook=_once_each)
    except json.JSONDecodeError as error:
        raise RequestError(422, f"body: not JSON ({error.msg} at line {error.lineno}, "
                           f"column {error.colno})") from None
    except RecursionError:  # Python's reader recurses once per level of nesting
        raise RequestError(422, "body: JSON nested too deeply (a request is one object of "
                           "flat fields)") from None
    if not isinstance(body, dict):
        raise RequestError(422, f"body: expected a JSON object, got {_kind(body)}")
    return body


def _options(body: dict, limits: Limits, defaults: DecodingOptions,
             nbest: bool) -> DecodingOptions:
    beam = _integer(body, "beam", defaults.beam, 1, limits.max_beam)
    lenpen = _number(body, "lenpen", defaults.lenpen)
    best = _integer(body, "nbest", 1, 1, beam) if nbest else 1
    return DecodingOptions(beam=beam, lenpen=lenpen, nbest=best)


def _refuse_unknown(body: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise RequestError(422, f"{unknown[0]}: unknown field (the fields are "
                           f"{', '.join(known)})")


TRANSLATE_FIELDS = ("text", "beam", "lenpen", "nbest")
ATTENTION_FIELDS = ("text", "beam", "lenpen")


def translate_request(data: bytes, limits: Limits,
                      defaults: DecodingOptions = PAPER_OPTIONS) -> TranslateRequest:
    """``{"text": [sentence, ...], "beam"?, "lenpen"?, "nbest"?}`` checked: ``text`` a list
    of at most ``limits.max_sentences`` strings (413 beyond), ``beam`` an integer from 1 to
    ``limits.max_beam``, ``lenpen`` a finite number, ``nbest`` an integer from 1 to ``beam``;
    the server's ``defaults`` for the fields not given."""
    body = parse_json(data)
    _refuse_unknown(body, TRANSLATE_FIELDS)
    if "text" not in body:
        raise RequestError(422, "text: missing (a list of sentences)")
    text = body["text"]
    if not isinstance(text, list):
        raise RequestError(422, f"text: expected a list of strings, got {_kind(text)}")
    if len(text) > limits.max_sentences:
        raise RequestError(413, f"text: {len(text)} sentences, more than the "
                           f"{limits.max_sentences} one request may hold")
    sentences = tuple(_sentence(value, f"text[{i}]") for i, value in enumerate(text))
    return TranslateRequest(sentences, _options(body, limits, defaults, nbest=True))


def attention_request(data: bytes, limits: Limits,
                      defaults: DecodingOptions = PAPER_OPTIONS) -> TranslateRequest:
    """``{"text": "one sentence", "beam"?, "lenpen"?}`` checked as :func:`translate_request`
    checks its fields."""
    body = parse_json(data)
    _refuse_unknown(body, ATTENTION_FIELDS)
    if "text" not in body:
        raise RequestError(422, "text: missing (one sentence)")
    sentence = _sentence(body["text"], "text")
    return TranslateRequest((sentence,), _options(body, limits, defaults, nbest=False))
