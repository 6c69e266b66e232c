"""Labelled bracket scoring with EVALB's conventions (Sekine & Collins 1997, COLLINS.prm).

Parsing results on the Penn Treebank, Table 4 of the paper included, are EVALB's F1 under the
parameter file COLLINS.prm. EVALB is not on any package registry, so this module scores the
same way:

* Words whose part-of-speech tag is a *deleted label* are removed before spans are computed:
  punctuation ``,`` ``:`` ``````  ``''`` ``.`` and empty elements ``-NONE-``.
* Every other bracket (not a part-of-speech bracket) is a (label, first word, last word + 1)
  triple over the remaining words. Brackets that span no word are dropped; labels are cut at
  their first ``-`` or ``=`` (``NP-SBJ`` counts as ``NP``); brackets labelled ``TOP`` are
  dropped. ``ADVP`` and ``PRT`` are the same label.
* Gold and test brackets are matched as multisets: a unary chain ``(NP (NP ...))`` holds two
  ``NP`` brackets, and a test tree must have both to match both.
* Per sentence: recall = matched / gold brackets, precision = matched / test brackets, crossing
  = test brackets that cross a gold bracket, tagging accuracy over the remaining words.
* A test tree with no (remaining) words is *skipped*; one whose words differ in number or form
  from the gold's, or that cannot be read, is an *error*; neither counts in the totals, both
  are reported.
* Corpus figures sum the counts of valid sentences (not an average of sentence scores); the
  ``len<=40`` figures use only sentences of at most 40 gold words, counting punctuation but not
  ``-NONE-``.

As in EVALB, an unlabelled root bracket ``( (S ...))`` is an ordinary bracket with the empty
label (only ``TOP`` is deleted): write roots as ``(TOP ...)``, as the tools here do. Where EVALB
prints ``nan`` (no brackets on either side) this module reports 0. One option goes beyond
EVALB: ``punctuation_from_gold`` (see :func:`sentence_spans`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from nltk import Tree

from .trees import is_preterminal

OK, ERROR, SKIP = 0, 1, 2  # EVALB's sentence status codes

_LABEL_TAIL = re.compile(r"[-=]")


@dataclass(frozen=True)
class EvalbParameters:
    """The settings of an EVALB parameter file; the defaults are COLLINS.prm's."""

    delete_labels: FrozenSet[str] = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
    delete_labels_for_length: FrozenSet[str] = frozenset({"-NONE-"})
    equivalent_labels: Tuple[Tuple[str, str], ...] = (("ADVP", "PRT"),)
    cutoff_length: int = 40
    labeled: bool = True
    max_errors: int = 10
    #: Not an EVALB setting: the gold tree decides which words are punctuation on both sides
    #: (see :func:`sentence_spans`).
    punctuation_from_gold: bool = False

    def canonical(self, label: str) -> str:
        """One representative of the label's equivalence class (``PRT`` -> ``ADVP``)."""
        for first, second in self.equivalent_labels:
            if label == second:
                return first
        return label


COLLINS = EvalbParameters()


class EvalbError(ValueError):
    """Scoring cannot go on (too many sentences that cannot be compared)."""


@dataclass(frozen=True)
class Spans:
    """What EVALB compares of one tree."""

    words: Tuple[str, ...] = ()
    tags: Tuple[str, ...] = ()
    brackets: Tuple[Tuple[str, int, int], ...] = ()
    length: int = 0  # words for the length cutoff: punctuation counts, -NONE- does not
    error: str = ""  # why the tree could not be read (then it is an error sentence)


def trim_label(label: str) -> str:
    """The label up to its first ``-`` or ``=`` (EVALB drops function tags and indices)."""
    return _LABEL_TAIL.split(label, maxsplit=1)[0]


def spans_of(tree: Optional[Tree], params: EvalbParameters = COLLINS,
             keep: Optional[Sequence[bool]] = None) -> Spans:
    """The remaining words, their tags, the scored brackets and the length of ``tree``
    (None, an empty line, has nothing).

    ``keep``, one flag per word that is not an empty element, decides which words stay instead
    of their tags (see :func:`sentence_spans`).
    """
    if tree is None:
        return Spans()
    words: List[str] = []
    tags: List[str] = []
    brackets: List[Tuple[str, int, int]] = []
    length = 0

    def visit(node: Tree) -> None:
        nonlocal length
        if is_preterminal(node):
            tag = node.label()
            if tag in params.delete_labels_for_length:
                kept = tag not in params.delete_labels
            else:
                kept = keep[length] if keep is not None else tag not in params.delete_labels
                length += 1
            if kept:
                words.append(node[0])
                tags.append(tag)
            return
        start = len(words)
        for child in node:
            visit(child)
        label = trim_label(node.label())
        if len(words) > start and label not in params.delete_labels:
            brackets.append((params.canonical(label), start, len(words)))

    visit(tree)
    return Spans(tuple(words), tuple(tags), tuple(brackets), length)


def visible_words(tree: Tree, params: EvalbParameters = COLLINS) -> Tuple[List[str], List[bool]]:
    """The words of ``tree`` that are not empty elements, and for each whether EVALB keeps it
    (its tag is not a deleted label such as punctuation)."""
    words, kept = [], []
    for word, tag in tree.pos():
        if tag not in params.delete_labels_for_length:
            words.append(word)
            kept.append(tag not in params.delete_labels)
    return words, kept


def sentence_spans(gold: Optional[Tree], test: Optional[Tree],
                   params: EvalbParameters = COLLINS) -> Tuple[Spans, Spans]:
    """What to compare of a gold tree and a test tree.

    EVALB deletes punctuation on each side by that side's tags, so a test tree that tags a
    punctuation word otherwise than the gold (``.`` as NN, or a word as ``.``) has other words
    than the gold once punctuation is gone, and the sentence is an error, left out of the
    totals. With ``params.punctuation_from_gold``, when both trees have the same words the gold
    tree's tags decide which words are deleted on both sides: such a sentence is scored (its
    tags still count as wrong), every sentence EVALB scores gets the same figures, and a parser
    that mistags punctuation cannot leave its sentences out of the totals.
    """
    gold_spans = spans_of(gold, params)
    if params.punctuation_from_gold and gold is not None and test is not None:
        gold_words, kept = visible_words(gold, params)
        if visible_words(test, params)[0] == gold_words:
            return gold_spans, spans_of(test, params, keep=kept)
    return gold_spans, spans_of(test, params)


def percent(part: int, whole: int) -> float:
    """``part`` as a percentage of ``whole`` (0 for an empty whole, as EVALB prints it)."""
    return 100.0 * part / whole if whole else 0.0


def _crosses(a: Tuple[str, int, int], b: Tuple[str, int, int]) -> bool:
    return (a[1] < b[1] < a[2] < b[2]) or (b[1] < a[1] < b[2] < a[2])


@dataclass
class BracketFigures:
    """The bracket and tag counts EVALB keeps, for a sentence and for a corpus alike, and the
    figures computed from them."""

    gold_brackets: int = 0
    test_brackets: int = 0
    matched: int = 0
    crossing: int = 0
    words: int = 0
    correct_tags: int = 0

    @property
    def recall(self) -> float:
        return percent(self.matched, self.gold_brackets)

    @property
    def precision(self) -> float:
        return percent(self.matched, self.test_brackets)

    @property
    def f1(self) -> float:
        return f_measure(self.precision, self.recall)

    @property
    def tagging_accuracy(self) -> float:
        return percent(self.correct_tags, self.words)


@dataclass(kw_only=True)
class SentenceScore(BracketFigures):
    """One sentence's figures, as a row of EVALB's table."""

    id: int
    length: int
    status: int = OK
    message: str = ""

    @property
    def exact(self) -> bool:
        return self.status == OK and self.gold_brackets == self.test_brackets == self.matched


def f_measure(precision: float, recall: float) -> float:
    """Harmonic mean of precision and recall (0 when both are 0)."""
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def score_sentence(gold: Spans, test: Spans, sentence_id: int = 1,
                   params: EvalbParameters = COLLINS) -> SentenceScore:
    """Compare one test tree with its gold tree, EVALB's way."""
    score = SentenceScore(id=sentence_id, length=gold.length)
    if test.error:
        score.status = ERROR
        score.message = test.error
        return score
    if not test.words:
        score.status = SKIP
        score.message = "the test tree has no words"
        return score
    if len(gold.words) != len(test.words):
        score.status = ERROR
        score.message = f"Length unmatch ({len(gold.words)}|{len(test.words)})"
        return score
    for gold_word, test_word in zip(gold.words, test.words):
        if gold_word != test_word:
            score.status = ERROR
            score.message = f"Words unmatch ({gold_word}|{test_word})"
            return score

    def key(bracket: Tuple[str, int, int]) -> tuple:
        return bracket if params.labeled else bracket[1:]

    gold_counts = Counter(key(b) for b in gold.brackets)
    test_counts = Counter(key(b) for b in test.brackets)
    score.gold_brackets = len(gold.brackets)
    score.test_brackets = len(test.brackets)
    score.matched = sum((gold_counts & test_counts).values())
    score.crossing = sum(1 for t in test.brackets if any(_crosses(g, t) for g in gold.brackets))
    score.words = len(gold.words)
    score.correct_tags = sum(
        params.canonical(g) == params.canonical(t) for g, t in zip(gold.tags, test.tags)
    )
    return score


@dataclass
class Totals(BracketFigures):
    """Sums over sentences, and the corpus figures of EVALB's summary."""

    sentences: int = 0
    errors: int = 0
    skipped: int = 0
    complete: int = 0
    no_crossing: int = 0
    two_or_less_crossing: int = 0

    def add(self, score: SentenceScore) -> None:
        self.sentences += 1
        if score.status == ERROR:
            self.errors += 1
            return
        if score.status == SKIP:
            self.skipped += 1
            return
        for count in fields(BracketFigures):
            setattr(self, count.name, getattr(self, count.name) + getattr(score, count.name))
        self.complete += int(score.exact)
        self.no_crossing += int(score.crossing == 0)
        self.two_or_less_crossing += int(score.crossing <= 2)

    @property
    def valid(self) -> int:
        return self.sentences - self.errors - self.skipped

    @property
    def complete_match(self) -> float:
        return percent(self.complete, self.valid)

    @property
    def average_crossing(self) -> float:
        return self.crossing / self.valid if self.valid else 0.0

    def as_dict(self) -> Dict[str, float]:
        return {
            "sentences": self.sentences, "error_sentences": self.errors,
            "skipped_sentences": self.skipped, "valid_sentences": self.valid,
            "recall": self.recall, "precision": self.precision, "f1": self.f1,
            "complete_match": self.complete_match, "average_crossing": self.average_crossing,
            "tagging_accuracy": self.tagging_accuracy, "matched_brackets": self.matched,
            "gold_brackets": self.gold_brackets, "test_brackets": self.test_brackets,
        }


@dataclass
class CorpusScore:
    """Every sentence's score, the totals over all of them and over the short ones."""

    sentences: List[SentenceScore] = field(default_factory=list)
    all: Totals = field(default_factory=Totals)
    short: Totals = field(default_factory=Totals)
    cutoff_length: int = COLLINS.cutoff_length


def score_corpus(pairs: Iterable[Tuple[Spans, Spans]],
                 params: EvalbParameters = COLLINS) -> CorpusScore:
    """Score (gold, test) pairs in order; sentence ids count from 1.

    Raises :class:`EvalbError` once more than ``params.max_errors`` sentences are errors (as
    EVALB stops; a negative ``max_errors`` never stops).
    """
    result = CorpusScore(cutoff_length=params.cutoff_length)
    for sentence_id, (gold, test) in enumerate(pairs, start=1):
        score = score_sentence(gold, test, sentence_id, params)
        result.sentences.append(score)
        result.all.add(score)
        if score.length <= params.cutoff_length:
            result.short.add(score)
        if 0 <= params.max_errors < result.all.errors:
            raise EvalbError(
                f"more than {params.max_errors} sentences cannot be compared (the last: "
                f"sentence {sentence_id}: {score.message}); are the files aligned?"
            )
    return result


# -- EVALB's report --------------------------------------------------------------------------

TABLE_HEADER = (
    "  Sent.                        Matched  Bracket   Cross        Correct Tag",
    " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy",
    "=" * 76,
)


def sentence_row(score: SentenceScore) -> str:
    """One line of EVALB's per-sentence table."""
    return (
        f"{score.id:4d}  {score.length:3d}    {score.status:d}  "
        f"{score.recall:6.2f} {score.precision:6.2f}   {score.matched:3d}    "
        f"{score.gold_brackets:3d}  {score.test_brackets:3d}    {score.crossing:3d}"
        f"   {score.words:4d}  {score.correct_tags:4d}   {score.tagging_accuracy:6.2f}"
    )


def totals_row(totals: Totals) -> str:
    """The line under EVALB's table: the summed counts."""
    row = ""
    if totals.gold_brackets > 0 and totals.test_brackets > 0:
        row = (
            f"                {totals.recall:6.2f} {totals.precision:6.2f} {totals.matched:6d} "
            f"{totals.gold_brackets:5d} {totals.test_brackets:5d}  {totals.crossing:5d}"
        )
    return row + f"  {totals.words:5d} {totals.correct_tags:5d}   {totals.tagging_accuracy:6.2f}"


def summary_block(totals: Totals) -> List[str]:
    """EVALB's summary lines for one group of sentences."""

    def line(name: str, value: str) -> str:
        return f"{name:<26}= {value}"

    return [
        line("Number of sentence", f"{totals.sentences:6d}"),
        line("Number of Error sentence", f"{totals.errors:6d}"),
        line("Number of Skip  sentence", f"{totals.skipped:6d}"),
        line("Number of Valid sentence", f"{totals.valid:6d}"),
        line("Bracketing Recall", f"{totals.recall:6.2f}"),
        line("Bracketing Precision", f"{totals.precision:6.2f}"),
        line("Bracketing FMeasure", f"{totals.f1:6.2f}"),
        line("Complete match", f"{totals.complete_match:6.2f}"),
        line("Average crossing", f"{totals.average_crossing:6.2f}"),
        line("No crossing",
             f"{100.0 * totals.no_crossing / totals.valid if totals.valid else 0.0:6.2f}"),
        line("2 or less crossing",
             f"{100.0 * totals.two_or_less_crossing / totals.valid if totals.valid else 0.0:6.2f}"),
        line("Tagging accuracy", f"{totals.tagging_accuracy:6.2f}"),
    ]


def report_lines(result: CorpusScore, table: bool = True) -> List[str]:
    """EVALB's output: the per-sentence table (optional), then the summary for all sentences
    and for those of at most ``cutoff_length`` words."""
    lines: List[str] = []
    if table:
        lines.extend(TABLE_HEADER)
        lines.extend(sentence_row(score) for score in result.sentences)
        lines.append("=" * 76)
        lines.append(totals_row(result.all))
    lines.append("=== Summary ===")
    lines.append("")
    lines.append("-- All --")
    lines.extend(summary_block(result.all))
    lines.append("")
    lines.append(f"-- len<={result.cutoff_length} --")
    lines.extend(summary_block(result.short))
    return lines


def sentence_records(scores: Sequence[SentenceScore]) -> List[Dict[str, object]]:
    """Per-sentence figures (with F1 and exact match, which EVALB's table leaves out)."""
    status_names = {OK: "ok", ERROR: "error", SKIP: "skip"}
    return [
        {
            "id": s.id, "length": s.length, "status": status_names[s.status],
            "recall": s.recall, "precision": s.precision, "f1": s.f1, "exact": s.exact,
            "matched": s.matched, "gold_brackets": s.gold_brackets,
            "test_brackets": s.test_brackets, "crossing": s.crossing, "words": s.words,
            "correct_tags": s.correct_tags, "tagging_accuracy": s.tagging_accuracy,
            **({"message": s.message} if s.message else {}),
        }
        for s in scores
    ]
