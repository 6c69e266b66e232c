"""BLEU scoring: the paper's tokenized BLEU with compound splitting (tensor2tensor's
``get_ende_bleu.sh``, Table 2) and sacreBLEU on detokenized text."""

from __future__ import annotations

import json
import math

import forked_cli
import pytest
from cli import command

from user_plugin.commands import score_translation as score
from user_plugin.files import run_main

# Detokenized toy corpus: a hyphenated compound, a short hypothesis, a repeated word.
HYPOTHESES = ["Das ist ein gut-gemachtes Auto.", "Er kommt.", "die die die."]
REFERENCES = ["Das ist ein gut-gemachtes Haus.", "Er kommt heute.", "die schwarze Katze."]


@pytest.mark.parametrize("line, expected", [
    ("rich-text format", "rich ##AT##-##AT## text format"),
    ("Max-Planck-Institut", "Max ##AT##-##AT## Planck ##AT##-##AT## Institut"),
    # Non-overlapping matches, as Perl's s///g: the middle hyphen's left neighbour is taken.
    ("a-b-c", "a ##AT##-##AT## b-c"),
    ("a-b-c-d", "a ##AT##-##AT## b-c ##AT##-##AT## d"),
    ("3-4 Tage", "3 ##AT##-##AT## 4 Tage"),
    ("a--b", "a ##AT##-##AT## -b"),
    ("Preis - Leistung", "Preis - Leistung"),
    ("-x x-", "-x x-"),
    ("keine Bindestriche", "keine Bindestriche"),
])
def test_split_compounds(line, expected):
    assert score.split_compounds(line) == expected


def test_moses_tokenization_keeps_compounds_and_escapes():
    assert score.moses_tokenize(['Ein E-Mail-Test & "Zitat".'], "de") == [
        "Ein E-Mail-Test &amp; &quot; Zitat &quot; ."]


def test_tokenized_bleu_matches_a_hand_computation():
    # Tokenized and split, the corpus is (hyp | ref):
    #   Das ist ein gut ##AT##-##AT## gemachtes Auto .  | ... Haus .        8 | 8 tokens
    #   Er kommt .                                      | Er kommt heute .  3 | 4
    #   die die die .                                   | die schwarze Katze .  4 | 4
    # Clipped matches / hypothesis n-grams, per sentence:
    #   1-grams: 7/8 + 3/3 + 2/4 ("die" counted once)   = 12/15
    #   2-grams: 5/7 + 1/2 + 0/3                        =  6/12
    #   3-grams: 4/6 + 0/1 + 0/2                        =  4/9
    #   4-grams: 3/5 + 0/0 + 0/1                        =  3/6
    # Output 15 tokens, reference 16: brevity penalty exp(1 - 16/15).
    precisions = [12 / 15, 6 / 12, 4 / 9, 3 / 6]
    brevity = math.exp(1 - 16 / 15)
    expected = 100 * brevity * math.exp(sum(math.log(p) for p in precisions) / 4)
    result = score.tokenized_bleu(HYPOTHESES, REFERENCES, "de")
    assert (result.hyp_len, result.ref_len) == (15, 16)
    assert result.precisions == pytest.approx([100 * p for p in precisions], abs=1e-12)
    assert result.brevity_penalty == pytest.approx(brevity, abs=1e-12)
    assert result.score == pytest.approx(expected, abs=1e-9)


def test_without_compound_splitting_compounds_are_single_tokens():
    result = score.tokenized_bleu(HYPOTHESES, REFERENCES, "de", compound_split=False)
    # "gut-gemachtes" is one token: 2 fewer on each side; 1-grams 11/13, ..., 4-grams 1/4.
    assert (result.hyp_len, result.ref_len) == (13, 14)
    assert result.precisions[0] == pytest.approx(100 * 10 / 13)
    assert result.precisions[3] == pytest.approx(100 * 1 / 4)


def test_corpus_bleu_agrees_with_sacrebleu_on_pretokenized_text():
    from sacrebleu.metrics import BLEU

    references = ["der Hund läuft schnell über die grüne Wiese .",
                  "zwei Kinder spielen mit einem roten Ball im Park .",
                  "eine Frau liest ein Buch ."]
    hypotheses = ["der Hund rennt schnell über die Wiese .",
                  "zwei Kinder spielen mit dem roten Ball im Park .",
                  "eine Frau liest eine Zeitung und ein Buch ."]
    ours = score.corpus_bleu(hypotheses, references)
    theirs = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(
        hypotheses, [references])
    assert ours.score == pytest.approx(theirs.score, abs=1e-9)
    assert ours.precisions == pytest.approx(theirs.precisions, abs=1e-9)
    assert (ours.hyp_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)


def test_a_zero_precision_gives_zero_bleu():
    result = score.corpus_bleu(["a b c"], ["a b d e"])
    assert result.precisions[2] == 0.0 and result.score == 0.0


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_cli_prints_and_saves_both_scores(tmp_path, capsys):
    hyp = write(tmp_path / "hyp.de", HYPOTHESES)
    ref = write(tmp_path / "ref.de", REFERENCES)
    output = tmp_path / "bleu.json"
    status = run_main(score.main, ["--hyp", str(hyp), "--ref", str(ref), "--target-lang", "de",
                                   "--output-json", str(output)], score.PROG)
    out = capsys.readouterr().out
    assert status == 0
    saved = json.loads(output.read_text(encoding="utf-8"))
    assert saved["num_sentences"] == 3
    expected = score.tokenized_bleu(HYPOTHESES, REFERENCES, "de").score
    assert saved["tokenized_bleu"]["score"] == pytest.approx(expected)
    assert saved["tokenized_bleu"]["compound_split"] is True
    from sacrebleu.metrics import BLEU

    sacre = BLEU(trg_lang="de").corpus_score(HYPOTHESES, [REFERENCES])
    assert saved["sacrebleu"]["score"] == pytest.approx(sacre.score)
    assert "tok:13a" in saved["sacrebleu"]["signature"]
    assert f"BLEU = {expected:.2f}" in out and saved["sacrebleu"]["signature"] in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bleu.json", "hyp.de", "ref.de"]


def test_mismatched_line_counts_are_a_one_line_error(tmp_path):
    hyp = write(tmp_path / "hyp.de", HYPOTHESES[:2])
    ref = write(tmp_path / "ref.de", REFERENCES)
    output = tmp_path / "bleu.json"
    result = forked_cli.run(
        [*command("score_translation"), "--hyp", str(hyp), "--ref", str(ref), "--target-lang",
         "de", "--output-json", str(output)],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{hyp} has 2 lines" in lines[0] and f"{ref} has 3" in lines[0]
    assert not output.exists()


def test_missing_file_is_an_error(tmp_path, capsys):
    ref = write(tmp_path / "ref.de", REFERENCES)
    status = run_main(score.main, ["--hyp", str(tmp_path / "nope.de"), "--ref", str(ref),
                                   "--target-lang", "de"], score.PROG)
    assert status == 1 and "nope.de: no such file" in capsys.readouterr().err


def test_an_output_json_that_is_a_directory_is_refused_before_scoring(tmp_path):
    hyp = write(tmp_path / "hyp.de", HYPOTHESES)
    ref = write(tmp_path / "ref.de", REFERENCES)
    (tmp_path / "out").mkdir()
    result = forked_cli.run(
        [*command("score_translation"), "--hyp", str(hyp), "--ref", str(ref), "--target-lang",
         "de", "--output-json", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1 and result.stdout == ""  # nothing scored, nothing printed
    assert result.stderr.strip().splitlines() == [
        f"vaswani-score: error: {tmp_path / 'out'}: is a directory; --output-json names the "
        "report's file (nothing was scored)"]
