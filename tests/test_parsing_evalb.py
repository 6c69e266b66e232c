"""Bracket scoring with EVALB's COLLINS.prm conventions (the F1 of the paper's Table 4), against
figures computed by hand, and ``vaswani-parse-eval``, which stands in for EVALB.

Each case writes out the brackets EVALB counts as (label, first word, last word + 1) over the
words that remain once punctuation and -NONE- are deleted."""

from __future__ import annotations

import json
import subprocess

import forked_cli
import pytest
from cli import command

from user_plugin.parsing.evalb import (
    ERROR,
    OK,
    SKIP,
    EvalbError,
    EvalbParameters,
    report_lines,
    score_corpus,
    score_sentence,
    sentence_spans,
    spans_of,
)
from user_plugin.parsing.trees import parse_tree


def spans(text: str):
    return spans_of(parse_tree(text) if text else None)


def score(gold: str, test: str):
    return score_sentence(spans(gold), spans(test))


# ---------------------------------------------------------------------------------------------
# Sentences

UNARY_GOLD = "(TOP (S (NP (NP (DT the) (NN dog))) (VP (VBD barked))))"
FLAT_NP = "(TOP (S (NP (DT the) (NN dog)) (VP (VBD barked))))"


def test_duplicate_brackets_count_as_a_multiset():
    # gold: NP(0,2) NP(0,2) VP(2,3) S(0,3); test: NP(0,2) VP(2,3) S(0,3): one NP is unmatched
    s = score(UNARY_GOLD, FLAT_NP)
    assert (s.gold_brackets, s.test_brackets, s.matched) == (4, 3, 3)
    assert (round(s.recall, 2), round(s.precision, 2), round(s.f1, 2)) == (75.0, 100.0, 85.71)
    assert not s.exact
    # the other way round: a test tree with the duplicate gets precision 3/4
    s = score(FLAT_NP, UNARY_GOLD)
    assert (s.matched, round(s.recall, 2), round(s.precision, 2)) == (3, 100.0, 75.0)
    assert score(UNARY_GOLD, UNARY_GOLD).exact


def test_punctuation_is_deleted_before_spans_are_computed():
    gold = "(TOP (S (NP (PRP He)) (VP (VBD left)) (. .)))"
    # "." inside the VP: the VP still spans word 1 only once "." is gone
    s = score(gold, "(TOP (S (NP (PRP He)) (VP (VBD left) (. .))))")
    assert (s.gold_brackets, s.test_brackets, s.matched) == (3, 3, 3) and s.exact
    assert s.words == 2 and s.length == 3       # tags over 2 words; length counts the "."
    # a bracket over punctuation only spans no word: it is not counted
    s = score(gold, "(TOP (S (NP (PRP He)) (VP (VBD left)) (X (. .))))")
    assert (s.test_brackets, s.matched) == (3, 3)


def test_top_is_not_counted_but_an_unlabelled_root_is():
    gold = "(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))"
    for test in ("(S (NP (NNS Dogs)) (VP (VBP bark)))",
                 "(TOP (TOP (S (NP (NNS Dogs)) (VP (VBP bark)))))"):
        s = score(gold, test)
        assert (s.gold_brackets, s.test_brackets, s.matched) == (3, 3, 3)
    # EVALB deletes only the label TOP: the PTB's "( (S ...))" root is a bracket labelled ""
    s = score("( (S (NP (NNS Dogs)) (VP (VBP bark))))", gold)
    assert (s.gold_brackets, s.test_brackets, s.matched) == (4, 3, 3)


def test_advp_and_prt_are_the_same_label():
    gold = "(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))"
    s = score(gold, "(TOP (S (NP (PRP He)) (VP (VBD gave) (ADVP (RB up)))))")
    assert (s.gold_brackets, s.test_brackets, s.matched) == (4, 4, 4) and s.exact
    # tags are compared as they are: RP is not RB, 2 of 3 tags right
    assert (s.words, s.correct_tags, round(s.tagging_accuracy, 2)) == (3, 2, 66.67)
    s = score(gold, "(TOP (S (NP (PRP He)) (VP (VBD gave) (PP (RP up)))))")
    assert s.matched == 3


def test_a_crossing_bracket():
    gold = "(TOP (S (NP (DT the) (NN man)) (VP (VBD saw) (NP (DT the) (NN dog)))))"
    # gold: NP(0,2) NP(3,5) VP(2,5) S(0,5); test: NP(0,3) NP(3,5) S(0,5).
    # NP(0,3) crosses VP(2,5) (0 < 2 < 3 < 5); it merely contains NP(0,2).
    test = "(TOP (S (NP (DT the) (NN man) (VBD saw)) (NP (DT the) (NN dog))))"
    s = score(gold, test)
    assert (s.gold_brackets, s.test_brackets, s.matched, s.crossing) == (4, 3, 2, 1)
    assert (round(s.recall, 2), round(s.precision, 2), round(s.f1, 2)) == (50.0, 66.67, 57.14)


def test_an_empty_prediction_is_a_skipped_sentence():
    s = score("(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))", "")
    assert s.status == SKIP and s.matched == s.test_brackets == 0
    # only punctuation left is no words either
    s = score("(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))", "(TOP (S (. .)))")
    assert s.status == SKIP


def test_traces_and_function_tags_of_a_raw_gold_tree():
    # John(0) tried(1) to(2) leave(3); the trace and "." are deleted, NP-SBJ over the trace
    # spans nothing. Gold: NP(0,1) VP(3,4) VP(2,4) S(2,4) VP(1,4) S(0,4), as the clean parse.
    gold = ("(TOP (S (NP-SBJ-1 (NNP John)) (VP (VBD tried) (S (NP-SBJ (-NONE- *-1)) "
            "(VP (TO to) (VP (VB leave))))) (. .)))")
    test = "(TOP (S (NP (NNP John)) (VP (VBD tried) (S (VP (TO to) (VP (VB leave))))) (. .)))"
    s = score(gold, test)
    assert (s.gold_brackets, s.test_brackets, s.matched) == (6, 6, 6)
    assert s.length == 5                           # the "." counts for length, the trace not


def test_different_words_are_error_sentences():
    gold = "(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))"
    s = score(gold, "(TOP (S (NP (NNS Dogs))))")
    assert s.status == ERROR and s.message == "Length unmatch (2|1)"
    s = score(gold, "(TOP (S (NP (NNS Cats)) (VP (VBP bark))))")
    assert s.status == ERROR and s.message == "Words unmatch (Dogs|Cats)"


def test_punctuation_from_gold_scores_what_evalb_rejects_and_changes_nothing_else():
    gold = "(TOP (S (NP (PRP He)) (VP (VBD left)) (. .)))"
    mistagged = "(TOP (S (NP (PRP He)) (VP (VBD left) (NN .))))"
    assert score(gold, mistagged).status == ERROR        # EVALB: 2 words against 3
    params = EvalbParameters(punctuation_from_gold=True)

    def scored(gold_text: str, test_text: str):
        pair = sentence_spans(parse_tree(gold_text), parse_tree(test_text), params)
        return score_sentence(*pair, params=params)

    # the gold deletes "." on both sides: NP(0,1) VP(1,2) S(0,2) all match, both tags right
    s = scored(gold, mistagged)
    assert s.status == OK and (s.matched, s.gold_brackets, s.test_brackets) == (3, 3, 3)
    assert (s.words, s.correct_tags) == (2, 2)
    # a word tagged as punctuation stays, with a wrong tag
    s = scored(gold, "(TOP (S (NP (PRP He)) (VP (. left)) (. .)))")
    assert s.status == OK and (s.matched, s.words, s.correct_tags) == (3, 2, 1)
    # sentences EVALB scores keep their figures; other words are still an error
    for gold_text, test_text in [(UNARY_GOLD, FLAT_NP), (CROSS_GOLD, CROSS_TEST),
                                 (gold, "(TOP (S (NP (PRP He)) (VP (VBD left) (. .))))")]:
        assert scored(gold_text, test_text) == score(gold_text, test_text)
    assert scored(gold, "(TOP (S (NP (PRP She)) (VP (VBD left)) (. .)))").status == ERROR


# ---------------------------------------------------------------------------------------------
# Corpus figures

CROSS_GOLD = "(TOP (S (NP (DT the) (NN man)) (VP (VBD saw) (NP (DT the) (NN dog)))))"
CROSS_TEST = "(TOP (S (NP (DT the) (NN man) (VBD saw)) (NP (DT the) (NN dog))))"


def long_sentence(words: int) -> str:
    return "(TOP (S " + " ".join(f"(NN w{i})" for i in range(words)) + " (. .)))"


def test_corpus_figures_sum_counts_and_the_short_sentences_are_those_up_to_40_words():
    # sentence 1: 2 of 4 gold, 3 test; sentence 2: 40 words + "." = length 41, 1 of 1
    pairs = [(spans(CROSS_GOLD), spans(CROSS_TEST)),
             (spans(long_sentence(40)), spans(long_sentence(40)))]
    result = score_corpus(pairs)
    assert (result.all.matched, result.all.gold_brackets, result.all.test_brackets) == (3, 5, 4)
    assert (round(result.all.recall, 2), round(result.all.precision, 2),
            round(result.all.f1, 2)) == (60.0, 75.0, 66.67)
    assert result.all.complete_match == 50.0
    assert result.short.sentences == 1
    assert round(result.short.f1, 2) == 57.14
    assert round(result.all.average_crossing, 2) == 0.5


def test_skipped_and_error_sentences_are_counted_apart():
    gold = spans("(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))")
    pairs = [(gold, gold), (gold, spans("")), (gold, spans("(TOP (S (NNS Dogs)))"))]
    result = score_corpus(pairs)
    totals = result.all
    assert (totals.sentences, totals.skipped, totals.errors, totals.valid) == (3, 1, 1, 1)
    assert (totals.matched, totals.gold_brackets, totals.f1) == (3, 3, 100.0)
    with pytest.raises(EvalbError, match="more than 0 sentences"):
        score_corpus(pairs, EvalbParameters(max_errors=0))


def test_the_report_has_evalbs_summary_lines():
    result = score_corpus([(spans(UNARY_GOLD), spans(FLAT_NP))])
    lines = report_lines(result)
    assert "Bracketing FMeasure       =  85.71" in lines
    assert lines.count("Bracketing Recall         =  75.00") == 2   # all and len<=40
    assert "-- len<=40 --" in lines
    # EVALB's row: id, length, status, recall, precision, matched, gold, test, crossing,
    # words, correct tags, tagging accuracy
    assert lines[3].split() == "1 3 0 75.00 100.00 3 4 3 0 3 3 100.00".split()
    assert lines[3].startswith("   1    3    0   75.00 100.00     3      4    3      0")


# ---------------------------------------------------------------------------------------------
# vaswani-parse-eval


def run_eval(*args) -> subprocess.CompletedProcess:
    return forked_cli.run([*command("parse_eval"), *map(str, args)], capture_output=True,
                          text=True, check=False)


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_cli_prints_evalbs_summary_lines(tmp_path):
    # sentence 1: 3 of 4 gold / 3 test; sentence 2: 2 of 4 / 3; sentence 3: empty, skipped.
    # All: 5 matched of 8 gold and 6 test: R 62.50, P 83.33, F 71.43; no complete match.
    gold = write(tmp_path / "gold", [UNARY_GOLD, CROSS_GOLD,
                                     "(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))"])
    pred = write(tmp_path / "pred", [FLAT_NP, CROSS_TEST, ""])
    result = run_eval("--gold", gold, "--pred", pred, "--json-out", tmp_path / "scores.json")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    for line in ("Number of sentence        =      3", "Number of Skip  sentence  =      1",
                 "Number of Valid sentence  =      2", "Bracketing Recall         =  62.50",
                 "Bracketing Precision      =  83.33", "Bracketing FMeasure       =  71.43",
                 "Complete match            =   0.00", "Tagging accuracy          = 100.00"):
        assert out.count(line) == 2, line                  # -- All -- and -- len<=40 --
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert [round(s["f1"], 2) for s in scores["sentences"]] == [85.71, 57.14, 0.0]
    assert [s["status"] for s in scores["sentences"]] == ["ok", "ok", "skip"]
    assert round(scores["all"]["f1"], 2) == 71.43
    summary = run_eval("--gold", gold, "--pred", pred, "--summary-only").stdout.splitlines()
    assert summary[0] == "=== Summary ===" and "Bracketing FMeasure       =  71.43" in summary


def test_cli_punctuation_from_gold_keeps_mistagged_sentences_in_the_totals(tmp_path):
    gold = write(tmp_path / "gold", ["(TOP (S (NP (PRP He)) (VP (VBD left)) (. .)))", FLAT_NP])
    pred = write(tmp_path / "pred", ["(TOP (S (NP (PRP He)) (VP (VBD left) (NN .))))",
                                     CROSS_TEST.replace("man", "dog")])
    plain = run_eval("--gold", gold, "--pred", pred, "--summary-only")
    assert "Number of Error sentence  =      2" in plain.stdout.splitlines()
    fixed = run_eval("--gold", gold, "--pred", pred, "--summary-only", "--punctuation-from-gold")
    lines = fixed.stdout.splitlines()
    assert "Number of Error sentence  =      1" in lines      # other words stay an error
    assert "Bracketing FMeasure       = 100.00" in lines and "Number of Valid sentence  =      1" \
        in lines


def test_cli_counts_an_unreadable_prediction_as_an_error_sentence(tmp_path):
    gold = write(tmp_path / "gold", [FLAT_NP, FLAT_NP])
    pred = write(tmp_path / "pred", [FLAT_NP, "(S (NP the dog"])
    result = run_eval("--gold", gold, "--pred", pred)
    assert result.returncode == 0
    assert "Number of Error sentence  =      1" in result.stdout.splitlines()
    assert "Bracketing FMeasure       = 100.00" in result.stdout.splitlines()
    assert result.stderr.startswith("2 : ") and "never closed" in result.stderr


@pytest.mark.parametrize("case, message", [
    ("missing", "no such file"),
    ("lines", "has 2 lines but"),
    ("gold-not-a-tree", "not a bracketed tree"),
    ("gold-empty-line", "empty line, expected a gold tree"),
    ("too-many-errors", "more than 0 sentences cannot be compared"),
])
def test_cli_errors_are_one_line(tmp_path, case, message):
    gold = write(tmp_path / "gold", [FLAT_NP, FLAT_NP])
    pred = write(tmp_path / "pred", [FLAT_NP, FLAT_NP])
    extra = []
    if case == "missing":
        gold = tmp_path / "nothing"
    elif case == "lines":
        write(pred, [FLAT_NP])
    elif case == "gold-not-a-tree":
        write(gold, [FLAT_NP, "this is not a tree"])
    elif case == "gold-empty-line":
        write(gold, [FLAT_NP, ""])
    elif case == "too-many-errors":
        write(pred, [FLAT_NP, "(TOP (S (NN dog)))"])
        extra = ["--max-errors", "0"]
    result = run_eval("--gold", gold, "--pred", pred, "--json-out", tmp_path / "out.json",
                      *extra)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert result.stderr.startswith("vaswani-parse-eval: error: ")
    assert not (tmp_path / "out.json").exists()
