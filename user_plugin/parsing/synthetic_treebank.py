"""A synthetic English-like treebank for tests and the demo (the WSJ trees are LDC-licensed).

Sentences are sampled, with a fixed seed, from a small probabilistic grammar written here in the
Penn Treebank's style: the same phrase labels (S, NP, VP, PP, SBAR, WHNP, ADVP, PRT) and
part-of-speech tags (DT, NN, NNS, NNP, PRP, JJ, VBD, VB, MD, IN, RB, RP, CC, WDT, WP, and the
punctuation tags ``,`` and ``.``). It has what makes parsing hard enough to be a test:

* recursion: noun phrases with prepositional phrases whose objects have their own
  (``the roof of the house of the king``), relative clauses in subjects (SBAR), clausal
  complements that nest (``said that she thought that ...``), coordination of clauses;
* unary chains: ``(S (VP (VBD slept)))`` in relative clauses, ``(NP (PRP he))``,
  ``(ADVP (RB quickly))``, ``(PRT (RP up))``;
* punctuation that EVALB deletes (``,`` and ``.``), and ``PRT``, which EVALB equates with ADVP.

Every sentence has exactly one parse under the grammar, so each gold tree is the only right
answer and a good parser can reach an F1 near 100. Where a phrase could attach to two places,
the words decide: prepositions that attach to nouns (``of``, ``with``...) differ from those that
attach to verbs (``in``, ``near``...); a verb-attached phrase or adverb never follows a clausal
complement or another verb phrase; relative clauses are only in subjects; coordinated noun
phrases are simple ones. :func:`parses` checks this with NLTK's chart parser (tests do).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from nltk import Tree

from .trees import TOP


@dataclass(frozen=True)
class Rule:
    """One expansion of a grammar symbol; ``recursive`` ones get rarer with depth."""

    weight: float
    rhs: Tuple[str, ...]
    recursive: bool = False


def _rules(*specs) -> Tuple[Rule, ...]:
    return tuple(Rule(weight, tuple(rhs.split()), *flags) for weight, rhs, *flags in specs)


#: Part-of-speech symbols: symbol -> (tag, words). A word of two symbols has the same tag in both.
LEXICON: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "DT": ("DT", ("the", "a", "this", "every", "each", "no")),
    "DT_PLURAL": ("DT", ("the", "these", "those", "some", "many", "no")),
    "NN": ("NN", tuple(
        "dog cat man woman city park report company market house king river garden teacher "
        "student doctor letter book car train window door table road bridge child friend "
        "farmer soldier painter island forest village mountain boat song story plan".split())),
    "NNS": ("NNS", tuple(
        "dogs cats men women cities reports companies markets houses books cars trains "
        "children friends farmers soldiers stories plans songs boats".split())),
    "NNP": ("NNP", tuple(
        "John Mary Paris London Smith Anna Peter Berlin Rome Clara Tom Lisa Oslo Max".split())),
    "PRP": ("PRP", ("he", "she", "they", "it", "we")),
    "JJ": ("JJ", tuple(
        "big small old new red green happy sad quiet loud young bright dark famous strange "
        "tall short rich poor clever".split())),
    "RB_MANNER": ("RB", ("quickly", "slowly", "quietly", "carefully", "rarely", "often")),
    "RB_SENTENCE": ("RB", ("yesterday", "today", "later", "meanwhile", "eventually")),
    "VBD_INTR": ("VBD", tuple(
        "slept arrived laughed waited fell left smiled vanished rested spoke danced".split())),
    "VBD_TR": ("VBD", tuple(
        "saw liked bought found praised visited watched sold built chased followed helped "
        "painted".split())),
    "VBD_COMP": ("VBD", ("said", "thought", "believed", "claimed", "reported", "hoped")),
    "VBD_PRT": ("VBD", ("picked", "gave", "looked", "turned", "called")),
    "RP": ("RP", ("up", "out", "off", "down")),
    "MD": ("MD", ("will", "can", "might", "should", "must")),
    "VB_INTR": ("VB", ("sleep", "arrive", "laugh", "wait", "leave", "smile", "rest")),
    "VB_TR": ("VB", ("see", "like", "buy", "find", "visit", "watch", "sell", "build", "help")),
    "IN_NOUN": ("IN", ("of", "with", "about", "from")),
    "IN_VERB": ("IN", ("in", "on", "at", "near", "during", "after", "before", "behind")),
    "IN_COMP": ("IN", ("that",)),
    "WDT": ("WDT", ("which",)),
    "WP": ("WP", ("who",)),
    "CC_NP": ("CC", ("and", "or")),
    "CC_S": ("CC", ("but", "yet")),
    "COMMA": (",", (",",)),
    "PERIOD": (".", (".",)),
}

#: Phrase symbols: symbol -> (tree label, or None for a symbol whose children go straight
#: into its parent, rules).
GRAMMAR: Dict[str, Tuple[Optional[str], Tuple[Rule, ...]]] = {
    "ROOT": ("S", _rules(
        (6.0, "NP_SUBJ VP PERIOD"),
        (1.5, "ADVP_SENTENCE COMMA NP_SUBJ VP PERIOD"),
        (1.0, "S_CLAUSE COMMA CC_S S_CLAUSE PERIOD", True),
        (0.5, "NP_SUBJ VP"),
    )),
    "S_CLAUSE": ("S", _rules((1.0, "NP_SUBJ VP"))),
    "NP_SUBJ": (None, _rules(
        (4.0, "NP_BASE"), (1.0, "NP_PRONOUN"), (1.0, "NP_COORD"),
        (2.0, "NP_PP", True), (1.5, "NP_REL", True),
    )),
    "NP_OBJ": (None, _rules((4.0, "NP_BASE"), (1.0, "NP_COORD"), (2.5, "NP_PP", True))),
    "NP_POBJ": (None, _rules((4.0, "NP_BASE"), (1.5, "NP_PP", True))),
    "NP_BASE": ("NP", _rules(
        (3.0, "DT NN"), (2.0, "DT JJ NN"), (0.5, "DT JJ JJ NN"), (1.0, "NNS"),
        (0.7, "JJ NNS"), (1.0, "DT_PLURAL NNS"), (1.5, "NNP"), (0.4, "NNP NNP"),
    )),
    "NP_PRONOUN": ("NP", _rules((1.0, "PRP"))),
    "NP_PP": ("NP", _rules((1.0, "NP_BASE PP_NOUN"))),
    "NP_REL": ("NP", _rules((1.0, "NP_BASE SBAR_REL"))),
    "NP_COORD": ("NP", _rules((1.0, "NP_BASE CC_NP NP_BASE"))),
    "PP_NOUN": ("PP", _rules((1.0, "IN_NOUN NP_POBJ"))),
    "PP_VERB": ("PP", _rules((1.0, "IN_VERB NP_OBJ"))),
    "SBAR_REL": ("SBAR", _rules((1.0, "WHNP S_GAP"))),
    "WHNP": ("WHNP", _rules((1.0, "WDT"), (1.0, "WP"))),
    "S_GAP": ("S", _rules((1.0, "VP"))),
    "SBAR_COMP": ("SBAR", _rules((1.0, "IN_COMP S_CLAUSE"))),
    "VP": (None, _rules(
        (3.0, "VP_INTR"), (4.0, "VP_TR"), (1.0, "VP_PRT"), (1.5, "VP_MODAL"),
        (1.5, "VP_COMP", True),
    )),
    "VP_INTR": ("VP", _rules(
        (2.0, "VBD_INTR"), (1.0, "VBD_INTR ADVP_MANNER"), (1.5, "VBD_INTR PP_VERB"),
    )),
    "VP_TR": ("VP", _rules((3.0, "VBD_TR NP_OBJ"), (1.5, "VBD_TR NP_OBJ PP_VERB"))),
    "VP_COMP": ("VP", _rules((1.0, "VBD_COMP SBAR_COMP"))),
    "VP_PRT": ("VP", _rules((1.0, "VBD_PRT PRT NP_OBJ"))),
    "PRT": ("PRT", _rules((1.0, "RP"))),
    "VP_MODAL": ("VP", _rules((1.0, "MD VP_BASE"))),
    "VP_BASE": ("VP", _rules(
        (1.5, "VB_INTR"), (0.5, "VB_INTR ADVP_MANNER"), (2.0, "VB_TR NP_OBJ"),
        (1.0, "VB_TR NP_OBJ PP_VERB"),
    )),
    "ADVP_MANNER": ("ADVP", _rules((1.0, "RB_MANNER"))),
    "ADVP_SENTENCE": ("ADVP", _rules((1.0, "RB_SENTENCE"))),
}

START = "ROOT"
#: Each recursive expansion below another multiplies its weight by this ...
RECURSION_DECAY = 0.5
#: ... and none is taken below this many.
MAX_RECURSION = 4
#: Longest sentence kept (WSJ parsers are also compared on sentences of at most 40 words).
MAX_WORDS = 40


class TreeSampler:
    """Draws trees from :data:`GRAMMAR` with its own random generator (fixed by ``seed``)."""

    def __init__(self, seed: int, max_words: int = MAX_WORDS) -> None:
        self.random = random.Random(seed)
        self.max_words = max_words

    def _expand(self, symbol: str, depth: int) -> List[Tree]:
        """The subtrees ``symbol`` yields (one, or its children for a label-less symbol)."""
        if symbol in LEXICON:
            tag, words = LEXICON[symbol]
            return [Tree(tag, [self.random.choice(words)])]
        label, rules = GRAMMAR[symbol]
        weights = [
            0.0 if rule.recursive and depth >= MAX_RECURSION
            else rule.weight * (RECURSION_DECAY ** depth if rule.recursive else 1.0)
            for rule in rules
        ]
        (rule,) = self.random.choices(rules, weights=weights)
        below = depth + 1 if rule.recursive else depth
        children = [tree for child in rule.rhs for tree in self._expand(child, below)]
        return children if label is None else [Tree(label, children)]

    def sample(self) -> Tree:
        """One tree, under a ``TOP`` root, of at most ``max_words`` words."""
        while True:
            (sentence,) = self._expand(START, 0)
            if len(sentence.leaves()) <= self.max_words:
                return Tree(TOP, [sentence])


def generate_trees(count: int, seed: int = 1, max_words: int = MAX_WORDS,
                   exclude: Sequence[Tree] = ()) -> List[Tree]:
    """``count`` trees with pairwise different sentences, none of them a sentence of
    ``exclude``; the same ``seed`` gives the same trees."""
    sampler = TreeSampler(seed, max_words)
    seen = {tuple(tree.leaves()) for tree in exclude}
    trees: List[Tree] = []
    attempts = 0
    while len(trees) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(f"the grammar gave fewer than {count} different sentences")
        tree = sampler.sample()
        sentence = tuple(tree.leaves())
        if sentence not in seen:
            seen.add(sentence)
            trees.append(tree)
    return trees


def generate_splits(sizes: Dict[str, int], seed: int = 1,
                    max_words: int = MAX_WORDS) -> Dict[str, List[Tree]]:
    """Named splits (e.g. train, dev, test) of the given sizes, drawn in that order from one
    seeded stream; no sentence occurs twice, so dev and test sentences are never trained on."""
    total = sum(sizes.values())
    trees = generate_trees(total, seed, max_words)
    splits: Dict[str, List[Tree]] = {}
    start = 0
    for name, size in sizes.items():
        splits[name] = trees[start:start + size]
        start += size
    return splits


# -- checking that the grammar is unambiguous ---------------------------------------------------

@functools.lru_cache(maxsize=1)
def _cfg():
    """The grammar as an NLTK context-free grammar over its own symbols."""
    from nltk.grammar import CFG, Nonterminal, Production

    productions = [
        Production(Nonterminal(symbol), [Nonterminal(child) for child in rule.rhs])
        for symbol, (_, rules) in GRAMMAR.items() for rule in rules
    ]
    productions += [
        Production(Nonterminal(symbol), [word])
        for symbol, (_, words) in LEXICON.items() for word in words
    ]
    return CFG(Nonterminal(START), productions)


def _relabel(node: Tree) -> List[Tree]:
    """A chart parse (internal symbols) as a treebank tree: labels, tags, no label-less nodes."""
    symbol = node.label()
    symbol = symbol.symbol() if hasattr(symbol, "symbol") else str(symbol)
    if symbol in LEXICON:
        return [Tree(LEXICON[symbol][0], list(node))]
    children = [tree for child in node for tree in _relabel(child)]
    label = GRAMMAR[symbol][0]
    return children if label is None else [Tree(label, children)]


def parses(words: Sequence[str], limit: int = 2) -> List[Tree]:
    """The different treebank trees (under ``TOP``) the grammar gives ``words``, at most
    ``limit`` of them: one for every sentence the sampler draws."""
    from nltk.parse.chart import BottomUpLeftCornerChartParser

    parser = BottomUpLeftCornerChartParser(_cfg())
    found: List[Tree] = []
    for chart_tree in parser.parse(list(words)):
        (sentence,) = _relabel(chart_tree)
        tree = Tree(TOP, [sentence])
        if tree not in found:
            found.append(tree)
            if len(found) >= limit:
                break
    return found
