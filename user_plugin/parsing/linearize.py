"""Trees as token sequences and back (Vinyals et al. 2015, "Grammar as a Foreign Language").

The paper's parser (§6.3) is a translation model from words to a linearized tree. Following
Vinyals et al., a tree is written depth-first with labelled opening and closing brackets, and
each word is replaced by one slot symbol; the words themselves are only on the source side::

    (TOP (S (NP (DT The) (NN dog)) (VP (VBD ran)) (. .)))
    source: The dog ran .
    target: (S (NP XX XX )NP (VP XX )VP XX )S

The ``TOP`` root is not written (every tree has it). Vinyals et al. write every part-of-speech
tag as ``XX`` (the default here, since EVALB's F1 does not score tags); ``keep_tags=True``
writes the tags instead, as the paper's own implementation (tensor2tensor's WSJ parsing data)
does and the recipe does by default: ``(S (NP DT NN )NP (VP VBD )VP . )S``. Then the model
predicts the tags, and each target symbol of a word says what kind of word it stands for,
which lets the decoder find its place in the source by content rather than by counting ``XX``.

Turning a model's output back into a tree (:func:`delinearize`) must never fail, since a
decoder can emit anything. Malformed outputs are repaired, and every repair is counted:

* a closing bracket closes the innermost open bracket of its label (and the brackets opened
  inside it); a closing bracket whose label is not open closes the innermost bracket; one with
  nothing open is dropped; brackets still open at the end are closed;
* special symbols such as ``<unk>`` are dropped;
* words are re-attached to the slots left to right; slots beyond the sentence's length are
  dropped from the end, and missing ones are added at the end, under the root;
* constituents left without words are removed;
* an output with nothing usable in it becomes the flat tree ``(TOP (S w1 ... wn))``
  (a *fallback* tree), counted as such.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from nltk import Tree

from .trees import TOP, is_preterminal

#: The symbol that stands for a word's part-of-speech tag in the target (Vinyals et al.).
SLOT = "XX"
#: The label of the one constituent of a fallback tree (the usual root label of WSJ trees).
FALLBACK_LABEL = "S"
#: Brackets nested deeper than this in a model's output are dropped (real trees stay far below).
MAX_DEPTH = 256

UNKNOWN_TOKENS = "unknown_tokens"
EXTRA_CLOSING = "extra_closing_brackets"
MISMATCHED_CLOSING = "mismatched_closing_labels"
MISSING_CLOSING = "missing_closing_brackets"
TOO_DEEP = "brackets_too_deep"
EXTRA_SLOTS = "extra_word_slots"
MISSING_SLOTS = "missing_word_slots"
EMPTY_CONSTITUENTS = "empty_constituents"
FALLBACK = "fallback_trees"
#: Every kind of repair, in the order reports list them.
REPAIR_KINDS = (
    UNKNOWN_TOKENS, EXTRA_CLOSING, MISMATCHED_CLOSING, MISSING_CLOSING, TOO_DEEP,
    EXTRA_SLOTS, MISSING_SLOTS, EMPTY_CONSTITUENTS, FALLBACK,
)


def linearize(tree: Tree, keep_tags: bool = False) -> List[str]:
    """The tokens of ``tree`` (its ``TOP`` root left out), depth-first: ``(X`` ... ``)X`` for
    each constituent, ``XX`` (or the tag, with ``keep_tags``) for each word."""
    tokens: List[str] = []

    def visit(node: Tree) -> None:
        label = node.label()
        if is_preterminal(node):
            if keep_tags and (label.startswith("(") or label.startswith(")") or not label):
                raise ValueError(f"tag {label!r} cannot be written as a target token")
            tokens.append(label if keep_tags else SLOT)
            return
        if not label or any(c.isspace() for c in label):
            raise ValueError(f"label {label!r} cannot be written as a target token")
        tokens.append("(" + label)
        for child in node:
            visit(child)
        tokens.append(")" + label)

    for node in (tree if tree.label() == TOP and not is_preterminal(tree) else [tree]):
        visit(node)
    return tokens


class _Node:
    __slots__ = ("label", "children")

    def __init__(self, label: str) -> None:
        self.label = label
        self.children: List[Union["_Node", "_Slot"]] = []


class _Slot:
    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token


@dataclass
class Delinearized:
    """A tree over the input words, and the repairs it took (kind -> count)."""

    tree: Tree
    repairs: Counter = field(default_factory=Counter)

    @property
    def fallback(self) -> bool:
        """True when the output was unusable and the flat fallback tree replaced it."""
        return self.repairs[FALLBACK] > 0

    @property
    def repaired(self) -> bool:
        return sum(self.repairs.values()) > 0


def _is_special(token: str) -> bool:
    """fairseq's special symbols (``<unk>``, ``<pad>``, ``</s>``, ``<s>``) and the like."""
    return len(token) > 2 and token.startswith("<") and token.endswith(">")


def _read_structure(tokens: Sequence[str], repairs: Counter) -> Optional[_Node]:
    """Build the bracket structure of ``tokens`` under a ``TOP`` node, repairing as it goes;
    None when no token was usable."""
    root = _Node(TOP)
    stack = [root]
    usable = 0
    for token in tokens:
        if token.startswith("(") and len(token) > 1 and not _is_special(token):
            if len(stack) > MAX_DEPTH:
                repairs[TOO_DEEP] += 1
                continue
            node = _Node(token[1:])
            stack[-1].children.append(node)
            stack.append(node)
            usable += 1
        elif token.startswith(")"):
            if len(stack) == 1:
                repairs[EXTRA_CLOSING] += 1
                continue
            label = token[1:]
            depth = next((i for i in range(len(stack) - 1, 0, -1) if stack[i].label == label),
                         None)
            if depth is None:
                if label:
                    repairs[MISMATCHED_CLOSING] += 1
                depth = len(stack) - 1
            repairs[MISSING_CLOSING] += len(stack) - 1 - depth
            del stack[depth:]
            usable += 1
        elif not token or token == "(" or _is_special(token):
            repairs[UNKNOWN_TOKENS] += 1
        else:
            stack[-1].children.append(_Slot(token))
            usable += 1
    repairs[MISSING_CLOSING] += len(stack) - 1
    return root if usable else None


def _keep_slots(node: _Node, budget: List[int]) -> None:
    """Keep the first ``budget[0]`` slots (depth-first), drop the rest."""
    kept: List[Union[_Node, _Slot]] = []
    for child in node.children:
        if isinstance(child, _Slot):
            if budget[0] > 0:
                kept.append(child)
                budget[0] -= 1
        else:
            _keep_slots(child, budget)
            kept.append(child)
    node.children = kept


def _count_slots(node: _Node) -> int:
    return sum(1 if isinstance(c, _Slot) else _count_slots(c) for c in node.children)


def _prune_empty(node: _Node, repairs: Counter) -> None:
    """Remove constituents without words (counting each one removed)."""
    kept: List[Union[_Node, _Slot]] = []
    for child in node.children:
        if isinstance(child, _Node):
            _prune_empty(child, repairs)
            if not child.children:
                repairs[EMPTY_CONSTITUENTS] += 1
                continue
        kept.append(child)
    node.children = kept


def _to_tree(node: _Node, words: Sequence[str], tags: Optional[Sequence[str]],
             position: List[int]) -> Tree:
    children = []
    for child in node.children:
        if isinstance(child, _Slot):
            i = position[0]
            children.append(Tree(tags[i] if tags is not None else child.token, [words[i]]))
            position[0] += 1
        else:
            children.append(_to_tree(child, words, tags, position))
    return Tree(node.label, children)


def fallback_tree(words: Sequence[str], tags: Optional[Sequence[str]] = None) -> Tree:
    """The flat tree ``(TOP (S (XX w1) ... (XX wn)))`` (with ``tags`` instead of XX if given)."""
    leaves = [Tree(tags[i] if tags is not None else SLOT, [word]) for i, word in enumerate(words)]
    return Tree(TOP, [Tree(FALLBACK_LABEL, leaves)])


def delinearize(tokens: Sequence[str], words: Sequence[str],
                tags: Optional[Sequence[str]] = None) -> Delinearized:
    """A valid tree over ``words`` from a model's output ``tokens`` (see the module docstring).

    The part-of-speech tag of each word is ``tags[i]`` when given (e.g. the gold tags, so that
    EVALB deletes the same punctuation on both sides), otherwise the slot token itself.
    """
    words = list(words)
    if not words:
        raise ValueError("a tree needs at least one word")
    if tags is not None and len(tags) != len(words):
        raise ValueError(f"{len(tags)} tags for {len(words)} words")
    repairs: Counter = Counter()
    root = _read_structure(tokens, repairs)
    if root is None:
        repairs[FALLBACK] += 1
        return Delinearized(fallback_tree(words, tags), +repairs)
    slots = _count_slots(root)
    if slots > len(words):
        repairs[EXTRA_SLOTS] += slots - len(words)
        _keep_slots(root, [len(words)])
    elif slots < len(words):
        repairs[MISSING_SLOTS] += len(words) - slots
        root.children.extend(_Slot(SLOT) for _ in range(len(words) - slots))
    _prune_empty(root, repairs)
    tree = _to_tree(root, words, tags, [0])
    return Delinearized(tree, +repairs)
