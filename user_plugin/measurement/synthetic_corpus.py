"""A synthetic parallel corpus with WMT14 English-German's sentence lengths, binarized for
fairseq, made in seconds: the workload of the GPU check's throughput measurement.

Throughput depends on the shapes of the batches, not on the words: how many sentences of which
lengths fill a batch of 25k tokens, how much of it is padding, how long attention's rows are.
So the corpus takes its (source, target) length pairs from real text, newstest2014 EN-DE (the
paper's test set, 3,003 pairs, in ``../shared/data``), and fills them with random tokens:

* each side is Moses-tokenized (sacremoses, as the recipes do) and its token count scaled by
  :data:`BPE_TOKENS_PER_WORD`, the growth that joint BPE with about 32k types gives on this test
  set (about 22 Moses tokens become about 26 BPE tokens per sentence), rounded at random so that
  lengths do not fall on a lattice; then one more for the end-of-sentence token fairseq appends;
* pairs are drawn from the 3,003 with replacement, keeping each source with its own target (the
  source/target length ratio of real pairs);
* tokens are uniform over a joined dictionary of :data:`VOCABULARY` types (special symbols
  included: a multiple of 8, as ``fairseq-preprocess`` pads it).

The files are those of ``fairseq-preprocess --joined-dictionary`` (``dict.{en,de}.txt``,
``{split}.en-de.{en,de}.{bin,idx}`` in fairseq's mmap format), written directly with numpy.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

#: Types of the joined dictionary, fairseq's four special symbols included.
VOCABULARY = 32000
#: BPE tokens per Moses token on newstest2014 with a joint BPE of about 32k types.
BPE_TOKENS_PER_WORD = 26 / 22
SPECIALS = 4  # <s>, <pad>, </s>, <unk>
EOS = 2
LENGTHS_FILE = "wmt14_length_pairs.json"


def length_pairs(source: Path, target: Path, scale: float = BPE_TOKENS_PER_WORD,
                 source_lang: str = "en", target_lang: str = "de",
                 seed: int = 1) -> List[Tuple[int, int]]:
    """``(source, target)`` lengths in BPE tokens with end-of-sentence, one per line pair of
    ``source`` and ``target`` (see the module description)."""
    from sacremoses import MosesTokenizer

    rng = random.Random(seed)
    tokenizers = MosesTokenizer(lang=source_lang), MosesTokenizer(lang=target_lang)
    lines = [Path(p).read_text(encoding="utf-8").splitlines() for p in (source, target)]
    if len(lines[0]) != len(lines[1]):
        raise ValueError(f"{source} and {target} differ in lines: "
                         f"{len(lines[0])} and {len(lines[1])}")

    def bpe_length(tokenizer, line: str) -> int:
        words = len(tokenizer.tokenize(line.strip(), escape=False))
        scaled = words * scale
        whole = int(scaled)
        return max(1, whole + (rng.random() < scaled - whole)) + 1

    return [(bpe_length(tokenizers[0], s), bpe_length(tokenizers[1], t))
            for s, t in zip(*lines)]


def write_length_pairs(pairs: Sequence[Tuple[int, int]], path: Path) -> None:
    path.write_text(json.dumps({"source": "newstest2014 en-de", "bpe_tokens_per_word":
                                BPE_TOKENS_PER_WORD, "pairs": [list(p) for p in pairs]}) + "\n")


def read_length_pairs(path: Path) -> List[Tuple[int, int]]:
    return [tuple(p) for p in json.loads(Path(path).read_text())["pairs"]]


def length_statistics(pairs: Sequence[Tuple[int, int]]) -> Dict[str, float]:
    """Means and the length-weighted means (sum L^2 / sum L) of each side."""
    src = np.array([p[0] for p in pairs], dtype=np.float64)
    tgt = np.array([p[1] for p in pairs], dtype=np.float64)
    return {"pairs": len(pairs), "source_mean": float(src.mean()),
            "target_mean": float(tgt.mean()),
            "source_weighted_mean": float((src ** 2).sum() / src.sum()),
            "target_weighted_mean": float((tgt ** 2).sum() / tgt.sum())}


def _dtype(vocabulary: int) -> type:
    """The token type fairseq-preprocess would choose (fairseq's index stores its code)."""
    return np.uint16 if vocabulary < 65500 else np.int32


def _write_split(prefix: Path, lengths: np.ndarray, vocabulary: int,
                 rng: np.random.Generator) -> None:
    """``prefix.bin`` and ``prefix.idx`` of fairseq's mmap indexed dataset: random tokens in
    sentences of ``lengths`` (each ending with EOS)."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    dtype = _dtype(vocabulary)
    tokens = rng.integers(SPECIALS, vocabulary, size=int(lengths.sum()), dtype=np.int64)
    tokens[np.cumsum(lengths) - 1] = EOS
    Path(f"{prefix}.bin").write_bytes(tokens.astype(dtype).tobytes())
    with MMapIndexedDataset.Index.writer(f"{prefix}.idx", dtype) as index:
        index.write(lengths.astype(np.int32).tolist())


def write_corpus(out_dir: Path, pairs: Sequence[Tuple[int, int]], train_pairs: int,
                 valid_pairs: int = 200, vocabulary: int = VOCABULARY, seed: int = 1,
                 langs: Tuple[str, str] = ("en", "de")) -> Dict[str, float]:
    """Write the binarized corpus into ``out_dir`` (created): ``train_pairs`` training and
    ``valid_pairs`` validation pairs drawn from the length ``pairs``. Returns the training
    split's statistics: :func:`length_statistics`, the vocabulary, and the sums of
    :class:`~.flops.TokenCounts` (``source_tokens``, ``target_tokens``, ``source_squares``,
    ``target_squares``, ``source_target``)."""
    if vocabulary <= SPECIALS or vocabulary % 8:
        raise ValueError(f"vocabulary must be a multiple of 8 above {SPECIALS}, got {vocabulary}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    table = np.array(pairs, dtype=np.int64)
    words = "".join(f"w{i} 1\n" for i in range(vocabulary - SPECIALS))
    for lang in langs:
        (out_dir / f"dict.{lang}.txt").write_text(words, encoding="utf-8")
    stats: Dict[str, float] = {}
    for split, count in (("train", train_pairs), ("valid", valid_pairs)):
        drawn = table[rng.integers(0, len(table), size=count)]
        for side, lang in enumerate(langs):
            _write_split(out_dir / f"{split}.{langs[0]}-{langs[1]}.{lang}", drawn[:, side],
                         vocabulary, rng)
        if split == "train":
            stats = length_statistics([tuple(p) for p in drawn.tolist()])
            source, target = drawn[:, 0].astype(np.float64), drawn[:, 1].astype(np.float64)
            stats.update(source_tokens=float(source.sum()), target_tokens=float(target.sum()),
                         source_squares=float((source ** 2).sum()),
                         target_squares=float((target ** 2).sum()),
                         source_target=float((source * target).sum()))
    stats["vocabulary"] = vocabulary
    return stats


def pairs_for(target_tokens: float, pairs: Sequence[Tuple[int, int]], margin: float = 1.25
              ) -> int:
    """How many pairs hold ``target_tokens`` target tokens (with ``margin`` to spare, for the
    padding and the batches fairseq leaves out): enough that no epoch ends inside a window."""
    mean = sum(p[1] for p in pairs) / len(pairs)
    return int(target_tokens * margin / mean) + 1
