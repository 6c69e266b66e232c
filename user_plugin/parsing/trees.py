"""Penn Treebank trees: reading bracketed files and normalizing them as parsing papers do.

Reading. A treebank file holds bracketed trees, one after the other: the LDC's ``.mrg`` files
spread each tree over several lines inside an unlabelled wrapper, ``( (S ...) )``; other
distributions write one tree per line, often wrapped in ``(TOP ...)`` or ``(ROOT ...)``. Each
top-level bracketed expression is cut out here (so that an error can name its line) and read by
``nltk.Tree.fromstring``. Every word must sit alone under a part-of-speech tag.

Normalization (the usual preprocessing of WSJ parsing since Collins 1997, and that of Vinyals
et al. 2015, which the paper follows):

* ``-NONE-`` elements (traces, null complementizers) are removed, and so is every constituent
  left without words, recursively: ``(NP-SBJ (-NONE- *))`` disappears;
* function tags and co-indices are removed from phrase labels: ``NP-SBJ-1`` -> ``NP``,
  ``PP-LOC=2`` -> ``PP``, ``ADVP|PRT`` -> ``ADVP`` (labels that start with ``-``, such as
  ``-LRB-``, are kept whole);
* part-of-speech tags are kept as they are;
* the sentence is put under one root labelled ``TOP`` (the wrappers ``( ...)``, ``(TOP ...)``
  and ``(ROOT ...)`` are replaced by it), which EVALB's COLLINS.prm does not score.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Union

from nltk import Tree

#: The root label of normalized trees (COLLINS.prm deletes it when scoring).
TOP = "TOP"
#: Root labels that wrap a sentence rather than being one of its constituents.
ROOT_WRAPPER_LABELS = ("", TOP, "ROOT")
#: The part-of-speech tag of empty elements (traces, null elements) in the Penn Treebank.
NONE_TAG = "-NONE-"

_TOKEN = re.compile(r"[()]|[^\s()]+")
_FUNCTION_TAG_START = re.compile(r"[-=|]")


class TreebankError(ValueError):
    """A treebank file or directory that cannot be read, with a one-line message naming it."""


def line_of(text: str, position: int) -> int:
    """The 1-based line number of a character offset in ``text``."""
    return text.count("\n", 0, position) + 1


def iter_bracketed(text: str, source: str = "<text>",
                   one_line: bool = False) -> Iterator[Tuple[int, str]]:
    """Each top-level bracketed expression of ``text`` with the line it starts on.

    Raises :class:`TreebankError` on text outside brackets and on unbalanced brackets, naming
    ``source`` and the line (``source`` alone when ``one_line``).
    """

    def where(position: int) -> str:
        return source if one_line else f"{source}:{line_of(text, position)}"

    depth = 0
    start = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token == "(":
            if depth == 0:
                start = match.start()
            depth += 1
        elif token == ")":
            if depth == 0:
                raise TreebankError(
                    f"{where(match.start())}: unbalanced brackets (a ')' closes nothing)"
                )
            depth -= 1
            if depth == 0:
                yield line_of(text, start), text[start:match.end()]
        elif depth == 0:
            raise TreebankError(
                f"{where(match.start())}: not a bracketed tree "
                f"(text {token[:40]!r} outside brackets)"
            )
    if depth > 0:
        raise TreebankError(
            f"{where(start)}: unbalanced brackets (a tree opened here is never closed)"
        )


def is_preterminal(node: Union[Tree, str]) -> bool:
    """A part-of-speech bracket: a tree node whose children are words."""
    return isinstance(node, Tree) and len(node) > 0 and all(isinstance(c, str) for c in node)


def check_structure(tree: Tree, where: str) -> None:
    """Every word alone under a part-of-speech tag; otherwise a :class:`TreebankError`."""
    if is_preterminal(tree) and tree.label() in ROOT_WRAPPER_LABELS:
        raise TreebankError(f"{where}: the word {tree[0]!r} has no part-of-speech tag")
    stack = [tree]
    while stack:
        node = stack.pop()
        if node is not tree and not node.label():
            raise TreebankError(f"{where}: a bracket without a label below the root")
        words = [child for child in node if isinstance(child, str)]
        if not words:
            stack.extend(node)
        elif len(words) < len(node):
            raise TreebankError(
                f"{where}: the word {words[0]!r} is not under a part-of-speech tag "
                f"(it sits in ({node.label()} ...) beside brackets)"
            )
        elif len(words) > 1:
            raise TreebankError(
                f"{where}: ({node.label()} {' '.join(words[:3])} ...) holds more than one "
                "word; each word needs its own part-of-speech bracket"
            )


def parse_tree(text: str, where: str = "<tree>") -> Tree:
    """One bracketed tree (``nltk.Tree.fromstring``), checked by :func:`check_structure`."""
    chunks = [chunk for _, chunk in iter_bracketed(text, where, one_line=True)]
    if len(chunks) != 1:
        raise TreebankError(f"{where}: {'no tree' if not chunks else 'more than one tree'}")
    try:
        tree = Tree.fromstring(chunks[0])
    except ValueError as error:
        detail = str(error).splitlines()[0] if str(error).strip() else "malformed"
        raise TreebankError(f"{where}: not a tree ({detail})") from None
    if not isinstance(tree, Tree):
        raise TreebankError(f"{where}: not a tree")
    check_structure(tree, where)
    return tree


def read_text(path: Path) -> str:
    """A UTF-8 text file's contents, or a :class:`TreebankError` naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TreebankError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TreebankError(f"{path}: is a directory, expected a treebank file") from None
    except UnicodeDecodeError:
        raise TreebankError(f"{path}: not a text file (not valid UTF-8)") from None
    except OSError as error:
        raise TreebankError(f"{path}: cannot read ({error.strerror})") from None


def read_trees(path: Path) -> List[Tree]:
    """All trees of a treebank file (``.mrg`` layout or one tree per line), in order."""
    text = read_text(path)
    trees = [parse_tree(chunk, f"{path}:{line}") for line, chunk in iter_bracketed(text, str(path))]
    if not trees:
        raise TreebankError(f"{path}: no trees in this file")
    return trees


def strip_function_tags(label: str) -> str:
    """A phrase label without function tags and indices (``NP-SBJ-1`` -> ``NP``)."""
    if label.startswith("-"):
        return label
    return _FUNCTION_TAG_START.split(label, maxsplit=1)[0]


def _clean(node: Tree) -> Optional[Tree]:
    """``node`` without empty elements, empty constituents and function tags (None if empty)."""
    if is_preterminal(node):
        return None if node.label() == NONE_TAG else Tree(node.label(), [node[0]])
    children = [cleaned for cleaned in (_clean(child) for child in node) if cleaned is not None]
    if not children:
        return None
    return Tree(strip_function_tags(node.label()), children)


def normalize(tree: Tree) -> Optional[Tree]:
    """The tree as parsers are trained and scored on it, under a ``TOP`` root (see the module
    docstring); None when nothing but empty elements remains."""
    if tree.label() in ROOT_WRAPPER_LABELS and not is_preterminal(tree):
        constituents = list(tree)
    else:
        constituents = [tree]
    children = [c for c in (_clean(node) for node in constituents) if c is not None]
    return Tree(TOP, children) if children else None


def tree_to_line(tree: Union[Tree, str]) -> str:
    """The tree in bracketed form on one line: ``(TOP (S (NP (DT The) (NN dog)) ...))``."""
    if isinstance(tree, str):
        return tree
    return "(" + " ".join([tree.label(), *(tree_to_line(child) for child in tree)]) + ")"


def words_of(tree: Tree) -> List[str]:
    """The words of a tree, left to right."""
    return list(tree.leaves())


def tags_of(tree: Tree) -> List[str]:
    """The part-of-speech tags of a tree's words, left to right."""
    return [tag for _, tag in tree.pos()]
