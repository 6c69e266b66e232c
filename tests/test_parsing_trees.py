"""Treebank trees for the parsing experiment (paper §6.3): reading, normalization, the
linearization of Vinyals et al. 2015 and its inverse, repair of malformed model outputs, the
treebank layouts, and the synthetic treebank of the tests and the demo."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import forked_cli
import pytest
from cli import REPO, command
from hypothesis import given, settings
from hypothesis import strategies as st
from nltk import Tree

from user_plugin.parsing import synthetic_treebank
from user_plugin.parsing.linearize import (
    EMPTY_CONSTITUENTS,
    EXTRA_CLOSING,
    EXTRA_SLOTS,
    FALLBACK,
    MISMATCHED_CLOSING,
    MISSING_CLOSING,
    MISSING_SLOTS,
    UNKNOWN_TOKENS,
    delinearize,
    linearize,
)
from user_plugin.parsing.splits import find_split_files
from user_plugin.parsing.trees import (
    TreebankError,
    check_structure,
    normalize,
    parse_tree,
    read_trees,
    tags_of,
    tree_to_line,
    words_of,
)

# Two trees in the LDC's .mrg layout: an unlabelled wrapper, trees over several lines, traces,
# function tags and co-indices.
MRG = """\
( (S
    (NP-SBJ-1 (DT The) (NN company) )
    (VP (VBD said)
      (SBAR (-NONE- 0)
        (S
          (NP-SBJ (-NONE- *T*-1) )
          (VP (VBD rose)
            (PP-LOC=2 (IN in) (NNP June) )))))
    (. .) ))
( (S (NP-SBJ (PRP It) ) (VP (VBD gave) (PRT|ADVP (RP up)) (NP (-LRB- -LRB-) (NN x) (-RRB- -RRB-)))
    (. .) ))
"""
MRG_NORMALIZED = [
    "(TOP (S (NP (DT The) (NN company)) (VP (VBD said) (SBAR (S (VP (VBD rose) "
    "(PP (IN in) (NNP June)))))) (. .)))",
    "(TOP (S (NP (PRP It)) (VP (VBD gave) (PRT (RP up)) (NP (-LRB- -LRB-) (NN x) "
    "(-RRB- -RRB-))) (. .)))",
]

# Trees that exercise the corners of linearization: unary chains, punctuation, one word, several
# constituents under the root, a word directly under the root.
TRICKY = [
    "(TOP (S (VP (VB Go))))",
    "(TOP (NP (NP (NP (NN x)))))",
    "(TOP (S (`` ``) (NP (PRP He)) (VP (VBD left) (, ,) (ADVP (RB then))) ('' '') (. .)))",
    "(TOP (INTJ (UH Hello)))",
    "(TOP (NP (NN Title)) (: :) (NP (NN subtitle)) (. .))",
    "(TOP (UH Hi))",
    "(TOP (S (SBAR (WHNP (WP who)) (S (VP (VBD came)))) (VP (VBD left))))",
]


def tree(text: str) -> Tree:
    return parse_tree(text)


def run_script(*args) -> subprocess.CompletedProcess:
    return forked_cli.run([*command("prepare_trees"), *map(str, args)], capture_output=True,
                          text=True, check=False)


# ---------------------------------------------------------------------------------------------
# Reading and normalization


def test_mrg_files_are_read_and_normalized_as_parsing_papers_do(tmp_path):
    path = tmp_path / "wsj_0001.mrg"
    path.write_text(MRG)
    trees = read_trees(path)
    assert len(trees) == 2
    assert trees[0].label() == ""                       # the LDC's unlabelled wrapper
    assert [tree_to_line(normalize(t)) for t in trees] == MRG_NORMALIZED


def test_every_root_wrapper_gives_the_same_normalized_tree():
    body = "(S (NP (NN Dogs)) (VP (VBP bark)))"
    lines = {tree_to_line(normalize(tree(text)))
             for text in (f"( {body})", f"(TOP {body})", f"(ROOT {body})", body)}
    assert lines == {f"(TOP {body})"}


def test_a_tree_of_only_empty_elements_normalizes_to_nothing():
    assert normalize(tree("( (S (NP-SBJ (-NONE- *)) (VP (-NONE- *?*))))")) is None


def test_function_tags_are_stripped_from_phrases_only():
    normalized = normalize(tree("(TOP (S-TPC-1 (NP-SBJ=2 (PRP$ Its) (NN end)) (VP (VBD came))))"))
    assert tree_to_line(normalized) == "(TOP (S (NP (PRP$ Its) (NN end)) (VP (VBD came))))"


@pytest.mark.parametrize("text, message", [
    ("(S (NP (DT the) (NN dog)) (VP (VBD ran))", "never closed"),
    ("(S (NN dog)))", "closes nothing"),
    ("(S (NN dog)) stray words", "outside brackets"),
    ("(S (NP the (NN dog)))", "'the' is not under a part-of-speech tag"),
    ("(S (NN big dog))", "more than one word"),
    ("(TOP dog)", "no part-of-speech tag"),
    ("(S ( (NN dog)))", "without a label"),
])
def test_malformed_treebank_files_are_one_line_errors_naming_file_and_line(tmp_path, text,
                                                                          message):
    path = tmp_path / "bad.mrg"
    path.write_text("(S (NN fine))\n\n" + text + "\n")
    with pytest.raises(TreebankError) as error:
        read_trees(path)
    assert message in str(error.value)
    assert f"{path}:3" in str(error.value) and "\n" not in str(error.value)


def test_empty_and_binary_files_are_errors(tmp_path):
    (tmp_path / "empty.mrg").write_text("\n")
    with pytest.raises(TreebankError, match="no trees"):
        read_trees(tmp_path / "empty.mrg")
    (tmp_path / "binary.mrg").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(TreebankError, match="not a text file"):
        read_trees(tmp_path / "binary.mrg")


# ---------------------------------------------------------------------------------------------
# Linearization (Vinyals et al. 2015) and back


def test_linearization_is_depth_first_with_labelled_brackets_and_xx():
    t = tree("(TOP (S (NP (DT The) (NN dog)) (VP (VBD ran)) (. .)))")
    assert linearize(t) == "(S (NP XX XX )NP (VP XX )VP XX )S".split()
    assert linearize(t, keep_tags=True) == "(S (NP DT NN )NP (VP VBD )VP . )S".split()
    assert words_of(t) == ["The", "dog", "ran", "."]      # the source side


def test_delinearize_inverts_linearize_on_the_synthetic_treebank():
    trees = synthetic_treebank.generate_trees(300, seed=7)
    for gold in trees:
        gold = normalize(gold)
        words, tags = words_of(gold), tags_of(gold)
        back = delinearize(linearize(gold), words, tags)
        assert back.tree == gold and not back.repaired, tree_to_line(gold)
        back = delinearize(linearize(gold, keep_tags=True), words)   # tags from the output
        assert back.tree == gold and not back.repaired


@pytest.mark.parametrize("text", TRICKY)
def test_delinearize_inverts_linearize_on_tricky_trees(text):
    gold = normalize(tree(text))
    assert tree_to_line(gold) == text                    # already normalized
    for keep_tags in (False, True):
        tags = None if keep_tags else tags_of(gold)
        back = delinearize(linearize(gold, keep_tags), words_of(gold), tags)
        assert back.tree == gold and not back.repaired


# ---------------------------------------------------------------------------------------------
# Repair of malformed outputs

WORDS = ["a", "b", "c"]


@pytest.mark.parametrize("output, expected, repairs", [
    # closing brackets with nothing open are dropped
    ("(S (NP XX XX )NP (VP XX )VP )S )S )VP", "(TOP (S (NP (XX a) (XX b)) (VP (XX c))))",
     {EXTRA_CLOSING: 2}),
    # brackets still open at the end are closed
    ("(S (NP XX XX )NP (VP XX", "(TOP (S (NP (XX a) (XX b)) (VP (XX c))))",
     {MISSING_CLOSING: 2}),
    # a closing label that is open further out closes everything inside it
    ("(S (NP XX (PP XX )S XX", "(TOP (S (NP (XX a) (PP (XX b)))) (XX c))",
     {MISSING_CLOSING: 2}),
    # a closing label that is not open closes the innermost bracket
    ("(S (NP XX )VP XX XX )S", "(TOP (S (NP (XX a)) (XX b) (XX c)))",
     {MISMATCHED_CLOSING: 1}),
    # too many word slots: the last ones go, and a constituent left empty with them
    ("(S (NP XX XX )NP (VP XX XX )VP (PP XX )PP )S", "(TOP (S (NP (XX a) (XX b)) (VP (XX c))))",
     {EXTRA_SLOTS: 2, EMPTY_CONSTITUENTS: 1}),
    # too few: the missing words go under the root, at the end
    ("(S (NP XX )NP (VP XX )VP )S", "(TOP (S (NP (XX a)) (VP (XX b))) (XX c))",
     {MISSING_SLOTS: 1}),
    # a constituent without words is removed; special symbols are ignored
    ("<unk> (S (NP )NP XX XX <unk> XX )S", "(TOP (S (XX a) (XX b) (XX c)))",
     {EMPTY_CONSTITUENTS: 1, UNKNOWN_TOKENS: 2}),
    # nothing usable: the flat fallback tree, counted
    ("<unk> )S )NP", "(TOP (S (XX a) (XX b) (XX c)))", {FALLBACK: 1, UNKNOWN_TOKENS: 1,
                                                     EXTRA_CLOSING: 2}),
    ("", "(TOP (S (XX a) (XX b) (XX c)))", {FALLBACK: 1}),
])
def test_malformed_outputs_are_repaired_into_trees_over_the_input_words(output, expected,
                                                                        repairs):
    result = delinearize(output.split(), WORDS)
    assert tree_to_line(result.tree) == expected
    assert result.repairs == Counter(repairs)
    assert result.fallback == (FALLBACK in repairs)


def test_repaired_trees_take_the_given_tags():
    result = delinearize("(S (NP XX )NP )S".split(), WORDS, ["DT", "NN", "."])
    assert tree_to_line(result.tree) == "(TOP (S (NP (DT a))) (NN b) (. c))"


OUTPUT_TOKENS = ["(S", "(NP", "(VP", "(PP", ")S", ")NP", ")VP", ")", "XX", "NN", "<unk>", "(",
                 "</s>"]


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.sampled_from(OUTPUT_TOKENS), max_size=40),
       words=st.lists(st.sampled_from(["w", "x", "y", "("]), min_size=1, max_size=12))
def test_any_output_becomes_a_valid_tree_over_the_words(tokens, words):
    result = delinearize(tokens, words)
    assert result.tree.label() == "TOP"
    assert words_of(result.tree) == words
    check_structure(result.tree, "repaired")           # every word under one tag
    assert all(len(sub) > 0 for sub in result.tree.subtrees())   # no empty constituent
    if not result.repaired and ")" not in tokens:      # a bare ")" closes without a label
        assert linearize(result.tree, keep_tags=True) == tokens


def test_delinearize_needs_words_and_matching_tags():
    with pytest.raises(ValueError, match="at least one word"):
        delinearize(["XX"], [])
    with pytest.raises(ValueError, match="2 tags for 3 words"):
        delinearize(["XX"], WORDS, ["DT", "NN"])


# ---------------------------------------------------------------------------------------------
# Treebank layouts


def make_ldc_layout(root, sections, text="( (S (NP (NN x)) (VP (VBD y))) )\n"):
    for section in sections:
        folder = root / "wsj" / f"{section:02d}"
        folder.mkdir(parents=True)
        (folder / f"wsj_{section:02d}01.mrg").write_text(text)


def test_the_ldc_layout_gives_the_standard_wsj_splits(tmp_path):
    make_ldc_layout(tmp_path, range(0, 25))
    files = find_split_files(tmp_path)
    assert [p.parent.name for p in files["train"]] == [f"{s:02d}" for s in range(2, 22)]
    assert [p.parent.name for p in files["valid"]] == ["22"]
    assert [p.parent.name for p in files["test"]] == ["23"]


def test_missing_sections_and_files_are_named(tmp_path):
    make_ldc_layout(tmp_path, [s for s in range(2, 24) if s not in (5, 22)])
    with pytest.raises(TreebankError, match=r"section\(s\) 05, 22 missing"):
        find_split_files(tmp_path)
    lines = tmp_path / "lines"
    lines.mkdir()
    (lines / "train.trees").write_text("(S (NN x))\n")
    with pytest.raises(TreebankError, match="dev.trees, test.trees missing"):
        find_split_files(lines)
    with pytest.raises(TreebankError, match="no such directory"):
        find_split_files(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TreebankError, match="no treebank found"):
        find_split_files(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------
# The synthetic treebank


def test_synthetic_treebank_is_seeded_and_keeps_held_out_sentences_apart():
    first = synthetic_treebank.generate_splits({"train": 400, "dev": 50, "test": 50}, seed=3)
    again = synthetic_treebank.generate_splits({"train": 400, "dev": 50, "test": 50}, seed=3)
    other = synthetic_treebank.generate_splits({"train": 400, "dev": 50, "test": 50}, seed=4)
    assert first == again and first != other
    sentences = [tuple(t.leaves()) for split in first.values() for t in split]
    assert len(sentences) == len(set(sentences)) == 500
    assert max(len(s) for s in sentences) <= synthetic_treebank.MAX_WORDS


def test_synthetic_trees_recurse_and_are_already_normalized():
    trees = synthetic_treebank.generate_trees(400, seed=5)

    def nested(t: Tree, outer: str, inner: str) -> bool:
        return any(sub is not node and sub.label() == inner
                   for node in t.subtrees(lambda n: n.label() == outer)
                   for sub in node.subtrees())

    assert any(nested(t, "PP", "PP") for t in trees)              # recursive NPs/PPs
    assert any(nested(t, "SBAR", "SBAR") for t in trees)          # clauses in clauses
    assert any(nested(t, "NP", "SBAR") for t in trees)            # relative clauses
    labels = {sub.label() for t in trees for sub in t.subtrees()}
    assert {"PRT", "ADVP", ",", ".", "WHNP"} <= labels
    assert all(normalize(t) == t for t in trees)


def test_every_synthetic_sentence_has_exactly_one_parse():
    for gold in synthetic_treebank.generate_trees(120, seed=11):
        assert synthetic_treebank.parses(gold.leaves()) == [gold], tree_to_line(gold)


def test_the_ambiguity_check_sees_an_ambiguous_grammar(monkeypatch):
    """With a rule that lets a verb's prepositions attach to nouns too, the check finds the
    two readings of a prepositional phrase."""
    grammar = dict(synthetic_treebank.GRAMMAR)
    label, rules = grammar["NP_PP"]
    grammar["NP_PP"] = (label, rules + (synthetic_treebank.Rule(1.0, ("NP_BASE", "PP_VERB")),))
    monkeypatch.setattr(synthetic_treebank, "GRAMMAR", grammar)
    synthetic_treebank._cfg.cache_clear()
    try:
        words = "he saw the dog in the park .".split()
        assert len(synthetic_treebank.parses(words)) == 2
    finally:
        monkeypatch.undo()
        synthetic_treebank._cfg.cache_clear()
    assert len(synthetic_treebank.parses(words)) == 1


# ---------------------------------------------------------------------------------------------
# vaswani-prepare-trees


@pytest.mark.parametrize("pos_tags", ["xx", "keep"])
def test_prepared_files_delinearize_back_to_the_gold_trees(tmp_path, pos_tags):
    assert run_script("synthesize", "--out-dir", tmp_path / "ptb", "--train", 40, "--dev", 10,
                      "--test", 12, "--seed", 2).returncode == 0
    result = run_script("prepare", "--ptb-dir", tmp_path / "ptb", "--out-dir", tmp_path / "prep",
                        "--pos-tags", pos_tags)
    assert result.returncode == 0, result.stderr
    assert "test: 12 trees" in result.stderr
    prep = tmp_path / "prep"
    tags_from = ["--tags-from", prep / "test.gold"] if pos_tags == "xx" else []
    result = run_script("delinearize", "--words", prep / "test.words", "--hypotheses",
                        prep / "test.brackets", *tags_from, "--output", tmp_path / "out.trees")
    assert result.returncode == 0, result.stderr
    assert "0 needed repairs; fallback trees: 0" in result.stderr
    assert (tmp_path / "out.trees").read_text() == (prep / "test.gold").read_text()
    brackets = (prep / "test.brackets").read_text().split()
    assert ("XX" in brackets) == (pos_tags == "xx")


def test_delinearize_cli_counts_repairs_and_fallbacks(tmp_path):
    (tmp_path / "words").write_text("a b\nc\n")
    (tmp_path / "hyp").write_text("(S XX XX XX )S\n<unk>\n")
    result = run_script("delinearize", "--words", tmp_path / "words", "--hypotheses",
                        tmp_path / "hyp", "--output", tmp_path / "out", "--report",
                        tmp_path / "report.json")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out").read_text() == "(TOP (S (XX a) (XX b)))\n(TOP (S (XX c)))\n"
    assert "2 needed repairs" in result.stderr and "fallback trees: 1" in result.stderr
    (tmp_path / "hyp").write_text("(S XX )S\n")
    result = run_script("delinearize", "--words", tmp_path / "words", "--hypotheses",
                        tmp_path / "hyp", "--output", tmp_path / "out2")
    assert result.returncode == 1 and "1 hypotheses for 2 sentences" in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out2").exists()


def test_the_translation_path_does_not_import_nltk():
    code = "import sys, user_plugin; print('nltk' in sys.modules)"
    result = forked_cli.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "False"
