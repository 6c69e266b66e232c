"""The standard splits of a Penn Treebank directory (WSJ sections 02-21 / 22 / 23).

Parsing papers since Collins 1997, Vinyals et al. 2015 and the paper (§6.3) train on WSJ
sections 02-21 (about 40K sentences), tune on section 22 and report section 23. A treebank
directory is accepted in either of two layouts:

* the LDC's: ``wsj/SS/wsj_SSNN.mrg`` (also found as ``parsed/mrg/wsj/SS/...`` in Treebank-3,
  or with the section folders directly in the directory);
* one tree per line, already split: ``train.trees``, ``dev.trees``, ``test.trees``.

The splits get fairseq's names: ``train``, ``valid`` (section 22) and ``test`` (section 23).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

from .trees import TreebankError

TRAIN_SECTIONS: Tuple[str, ...] = tuple(f"{section:02d}" for section in range(2, 22))
DEV_SECTIONS: Tuple[str, ...] = ("22",)
TEST_SECTIONS: Tuple[str, ...] = ("23",)
SECTIONS_OF_SPLIT: Dict[str, Tuple[str, ...]] = {
    "train": TRAIN_SECTIONS,
    "valid": DEV_SECTIONS,
    "test": TEST_SECTIONS,
}
#: File of each split in the one-tree-per-line layout.
LINE_FILES: Dict[str, str] = {"train": "train.trees", "valid": "dev.trees", "test": "test.trees"}
#: Where the section folders may be, relative to the treebank directory.
WSJ_CANDIDATES: Tuple[str, ...] = ("wsj", "parsed/mrg/wsj", ".")

LAYOUTS = (
    "the LDC layout wsj/SS/wsj_SSNN.mrg (sections 02-21 train, 22 dev, 23 test) or "
    "train.trees, dev.trees, test.trees (one tree per line)"
)


def _section_dirs(directory: Path) -> List[Path]:
    return [p for p in directory.iterdir() if p.is_dir() and p.name.isdigit() and len(p.name) == 2]


def _mrg_files(section_dir: Path) -> List[Path]:
    return sorted(p for p in section_dir.iterdir() if p.is_file() and p.suffix.lower() == ".mrg")


def find_split_files(ptb_dir: Path) -> Dict[str, List[Path]]:
    """The files of each split (``train``, ``valid``, ``test``), in reading order.

    Raises :class:`TreebankError` with one line naming what is missing; the files themselves
    are not read here.
    """
    ptb_dir = Path(ptb_dir)
    if not ptb_dir.exists():
        raise TreebankError(f"PTB_DIR {ptb_dir}: no such directory (expected {LAYOUTS})")
    if not ptb_dir.is_dir():
        raise TreebankError(f"PTB_DIR {ptb_dir}: not a directory (expected {LAYOUTS})")

    line_files = {split: ptb_dir / name for split, name in LINE_FILES.items()}
    if any(path.exists() for path in line_files.values()):
        missing = [path.name for path in line_files.values() if not path.is_file()]
        if missing:
            raise TreebankError(
                f"PTB_DIR {ptb_dir}: {', '.join(missing)} missing (the one-tree-per-line "
                "layout needs train.trees, dev.trees and test.trees)"
            )
        return {split: [path] for split, path in line_files.items()}

    for candidate in WSJ_CANDIDATES:
        wsj = (ptb_dir / candidate).resolve()
        if wsj.is_dir() and _section_dirs(wsj):
            break
    else:
        raise TreebankError(f"PTB_DIR {ptb_dir}: no treebank found (expected {LAYOUTS})")

    files: Dict[str, List[Path]] = {}
    missing_sections: List[str] = []
    for split, sections in SECTIONS_OF_SPLIT.items():
        files[split] = []
        for section in sections:
            section_dir = wsj / section
            found = _mrg_files(section_dir) if section_dir.is_dir() else []
            if not found:
                missing_sections.append(section)
            files[split].extend(found)
    if missing_sections:
        raise TreebankError(
            f"PTB_DIR {ptb_dir}: WSJ section(s) {', '.join(missing_sections)} missing or "
            f"without .mrg files in {wsj} (needed: 02-21 train, 22 dev, 23 test)"
        )
    return files
