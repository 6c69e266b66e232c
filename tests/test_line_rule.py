"""One rule for lines: only LF ends a line, in every tool that reads line-aligned text.

Random sentences holding CR, U+2028, U+2029, NEL, form and line feeds' look-alikes (VT, FS, GS,
RS), byte-order marks and tabs go through the data preparation (``vaswani-prepare-text normalize``
and ``check-lines``), the hub (its standard-input reader and its text codec) and the scorer
(``vaswani-score``): line counts equal the number of LF bytes (``wc -l``) and line N of
every output still belongs to line N of the input (each line carries its own marker words).
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from types import SimpleNamespace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from user_plugin.artifacts.text_pipeline import TextPipeline
from user_plugin.commands import prepare_text, score_translation
from user_plugin.commands.translate import read_input_lines
from user_plugin.files import UserError, decode_lines, iter_lines, run_main, split_lines

#: Characters that some reader or other takes for a line end, and tabs and byte-order marks.
SPECIALS = ["\r", "\r\r", "\u2028", "\u2029", "\x85", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e",
            "\ufeff", "\t"]
NOISE = st.lists(st.one_of(st.sampled_from(SPECIALS),
                           st.text(alphabet="abcdefgh.,-'", min_size=1, max_size=4)),
                 max_size=6).map("".join)
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def marker(index: int) -> str:
    """Four tokens that only line ``index`` holds."""
    return " ".join(f"m{index}{part}" for part in "abcd")


def make_lines(noise: list[tuple[str, str]]) -> list[str]:
    return [f"{before} {marker(i)} {after}" for i, (before, after) in enumerate(noise)]


def as_read(lines: list[str]) -> list[str]:
    """``lines`` as the line rule reads them back: a byte-order mark at the start of the text,
    and only there, is dropped."""
    return [lines[0].removeprefix("\ufeff")] + lines[1:]


def write(path: Path, lines: list[str]) -> Path:
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    return path


def assert_aligned(lines: list[str], count: int) -> None:
    assert len(lines) == count
    for index, line in enumerate(lines):
        assert marker(index) in " ".join(line.split()), (index, line)


def one_line(text: str) -> bool:
    """No character of ``text`` ends a line for ``str.splitlines`` or universal newlines."""
    return len(text.splitlines()) <= 1 and "\r" not in text and "\n" not in text


LINES = st.lists(st.tuples(NOISE, NOISE), min_size=1, max_size=10)


@SETTINGS
@given(noise=LINES)
def test_prepare_counts_and_keeps_lines_aligned(noise):
    lines = make_lines(noise)
    with tempfile.TemporaryDirectory() as directory:
        raw = write(Path(directory) / "raw.en", lines)
        assert prepare_text.count_lines(raw) == len(lines) == raw.read_bytes().count(b"\n")
        assert list(iter_lines(raw)) == as_read(lines)
        out = Path(directory) / "tok.en"
        assert run_main(prepare_text.main, ["normalize", "--lang", "en", str(raw), str(out)],
                        prepare_text.PROG) == 0
        tokenized = list(iter_lines(out))
        assert prepare_text.count_lines(out) == len(lines)
        assert_aligned(tokenized, len(lines))
        assert all(one_line(line) for line in tokenized)


@SETTINGS
@given(noise=LINES)
@example(noise=[("\ufeff", "")])  # a byte-order mark at the start of a text stream
def test_hub_reads_and_encodes_one_sentence_per_line(noise):
    lines = make_lines(noise)
    data = ("\n".join(lines) + "\n").encode("utf-8")
    assert read_input_lines(SimpleNamespace(buffer=io.BytesIO(data))) == as_read(lines)
    assert read_input_lines(io.StringIO(data.decode("utf-8"))) == as_read(lines)
    codec = TextPipeline.from_files("en", "de", moses=True)
    encoded = [codec.encode(line) for line in lines]
    assert_aligned(encoded, len(lines))
    decoded = [codec.decode(line) for line in encoded]
    assert_aligned(decoded, len(lines))
    assert all(one_line(line) for line in encoded + decoded)


@SETTINGS
@given(hyp_noise=LINES, data=st.data())
def test_scorer_pairs_line_n_with_line_n(hyp_noise, data):
    """Hypotheses and references with different stray characters: the scorer reads as many
    lines as ``wc -l`` counts, and pairs each hypothesis with its own reference."""
    ref_noise = data.draw(st.lists(st.tuples(NOISE, NOISE), min_size=len(hyp_noise),
                                   max_size=len(hyp_noise)))
    hypotheses, references = make_lines(hyp_noise), make_lines(ref_noise)
    with tempfile.TemporaryDirectory() as directory:
        hyp = write(Path(directory) / "hyp.de", hypotheses)
        ref = write(Path(directory) / "ref.de", references)
        read_hyp, read_ref = score_translation.read_pair(hyp, ref)
        assert_aligned(read_hyp, prepare_text.count_lines(hyp))
        assert_aligned(read_ref, prepare_text.count_lines(ref))
        _, _, report = score_translation.score_files(hyp, ref, "de")
        assert report["num_sentences"] == len(hypotheses)


def test_a_stray_carriage_return_changes_no_count_and_no_pair(tmp_path):
    """The issue's case: 9 hypotheses, one with a CR inside, against 9 references."""
    references = [f"{marker(i)} ." for i in range(9)]
    hypotheses = list(references)
    hypotheses[4] = "m4a m4b\rm4c m4d ."
    hyp, ref = write(tmp_path / "hyp.de", hypotheses), write(tmp_path / "ref.de", references)
    tokenized, sacre, report = score_translation.score_files(hyp, ref, "de")
    assert report["num_sentences"] == prepare_text.count_lines(hyp) == 9
    assert round(tokenized.score, 6) == round(sacre.score, 6) == 100.0
    references[2] = "m2a m2b\u2028m2c m2d ."
    write(ref, references)
    assert score_translation.score_files(hyp, ref, "de")[2]["num_sentences"] == 9


def test_line_helpers():
    assert split_lines("") == [] and split_lines("a") == ["a"] and split_lines("a\n") == ["a"]
    assert split_lines("a\r\nb\u2028c\n\n") == ["a\r", "b\u2028c", ""]
    assert decode_lines(b"x\ny", "f") == ["x", "y"]
    try:
        decode_lines(b"ok\n\xff\n", "standard input")
    except UserError as error:
        assert str(error) == "standard input: not valid UTF-8 text (line 2, byte 3)"
    else:
        raise AssertionError("invalid UTF-8 was accepted")
    assert prepare_text.single_line("\ufeffa\tb\u2028 c\x85d\r") == "a b c d"
