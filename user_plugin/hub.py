"""Translate raw text with trained checkpoints, decoding as the paper does (§6.1).

::

    from user_plugin.hub import load_translator

    translator = load_translator("path/to/model_dir", source_lang="en", target_lang="de")
    translator.translate("A man is riding a bike.")            # -> "Ein Mann fährt ..."
    translator.translate(["One sentence.", "Another one."])    # -> [str, str]
    translator.translate("A dog runs.", nbest=3)               # -> [str, str, str], best first
    load_translator("model_dir", checkpoints=["a.pt", "b.pt"])  # an ensemble (averaged probs)

A model directory holds (names tried in this order, each overridable by a keyword):

* checkpoints: ``checkpoint_best.pt``, ``checkpoint_last.pt``, ``model.pt`` (or ``checkpoints=``,
  paths relative to the directory or absolute; several = an ensemble);
* the dictionaries ``dict.<src>.txt`` and ``dict.<tgt>.txt`` (or ``data_dir=`` a
  ``fairseq-preprocess`` output);
* optional subword model: subword-nmt codes ``bpecodes`` / ``codes`` / ``code``
  (``bpe_codes=``), or a SentencePiece model ``sentencepiece.bpe.model`` / ``spm.model``
  (``sentencepiece_model=``).

Text goes through sacremoses ``tokenize`` (source language, no escaping) unless a SentencePiece
model is used (``moses=`` overrides), then BPE, then the source dictionary; outputs go back
through the target dictionary, BPE removal and sacremoses ``detokenize`` (target language).
The languages come from the keywords, the checkpoint, or the binarized file names in the data
directory.

Decoding defaults are the paper's: beam 4, GNMT length penalty with alpha 0.6, at most
source length + 50 output tokens per sentence (the ``vaswani_translation`` task's generator).

Command line: ``python -m user_plugin.hub MODEL_DIR [--source-lang en --target-lang de ...]``
translates stdin line by line.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from argparse import Namespace
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

CHECKPOINT_NAMES = ("checkpoint_best.pt", "checkpoint_last.pt", "model.pt")
BPE_CODES_NAMES = ("bpecodes", "codes", "code")
SENTENCEPIECE_NAMES = ("sentencepiece.bpe.model", "spm.model")
TASK_NAME = "vaswani_translation"
# what torch.load / fairseq raise on truncated, empty, foreign or incompatible files
LOAD_ERRORS = (OSError, EOFError, RuntimeError, ValueError, KeyError, AttributeError, TypeError,
               pickle.UnpicklingError)


class HubError(RuntimeError):
    """A model directory or checkpoint that cannot be used; the message names the file."""


def _first_existing(directory: Path, names: Iterable[str]) -> Path | None:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    return None


def _resolve(directory: Path, name: str | os.PathLike) -> Path:
    path = Path(name)
    return path if path.is_absolute() else directory / path


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6
PICKLE_MAGIC = b"\x80"  # the legacy torch.save format starts with a pickle protocol opcode


def checkpoint_file_problem(path: str | os.PathLike) -> str | None:
    """What is visibly wrong with a checkpoint file without unpickling it, or None.

    Reads the first bytes and, for a zip, its central directory (at the end of the file): an
    empty file, a foreign format and a truncated zip (a copy or write cut short) are told apart.
    """
    import zipfile

    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        return "empty file (0 bytes)"
    with open(path, "rb") as handle:
        head = handle.read(len(ZIP_MAGIC))
    if head == ZIP_MAGIC:
        if not zipfile.is_zipfile(path):
            return f"truncated or corrupt (an incomplete zip archive of {size} bytes)"
        return None
    if not head.startswith(PICKLE_MAGIC):
        return f"not a PyTorch file (unknown format, starts with {head!r})"
    return None


def _read_checkpoint(path: Path) -> dict:
    from fairseq import checkpoint_utils

    if not path.is_file():
        raise HubError(f"checkpoint not found: {path}")
    problem = checkpoint_file_problem(path)
    if problem is not None:
        raise HubError(f"cannot read checkpoint {path}: {problem}")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    except KeyError as exc:  # fairseq's upgrade of an old checkpoint did not find its fields
        raise HubError(f"not a fairseq checkpoint (no {exc} entry): {path}") from None
    except LOAD_ERRORS as exc:
        raise HubError(f"cannot read checkpoint {path}: {_one_line(exc)}") from None
    if not isinstance(state, dict) or state.get("cfg") is None or "model" not in state:
        raise HubError(f"not a fairseq checkpoint (no cfg/model): {path}")
    return state


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return type(exc).__name__ + (": " + text.splitlines()[0] if text else "")


def _languages(
    source_lang: str | None, target_lang: str | None, task_cfg, data_dir: Path
) -> tuple[str, str]:
    from fairseq.data import data_utils

    src = source_lang or task_cfg.get("source_lang")
    tgt = target_lang or task_cfg.get("target_lang")
    if src is None or tgt is None:
        inferred = data_utils.infer_language_pair(str(data_dir))
        src, tgt = src or inferred[0], tgt or inferred[1]
    if src is None or tgt is None:
        raise HubError(
            f"cannot tell the language pair of {data_dir}: pass source_lang= and target_lang="
        )
    for lang in (src, tgt):
        if not (data_dir / f"dict.{lang}.txt").is_file():
            raise HubError(f"dictionary not found: {data_dir / f'dict.{lang}.txt'}")
    return src, tgt


class TextCodec:
    """Raw text <-> the model's token strings: Moses (sacremoses) and subword-nmt/SentencePiece."""

    def __init__(
        self,
        source_lang: str,
        target_lang: str,
        moses: bool,
        bpe_codes: Path | None = None,
        sentencepiece_model: Path | None = None,
    ) -> None:
        if bpe_codes is not None and sentencepiece_model is not None:
            raise HubError("give either BPE codes or a SentencePiece model, not both")
        self.tokenizer = self.target_tokenizer = self.detokenizer = None
        if moses:
            from sacremoses import MosesDetokenizer, MosesTokenizer

            self.tokenizer = MosesTokenizer(lang=source_lang)
            self.target_tokenizer = MosesTokenizer(lang=target_lang)
            self.detokenizer = MosesDetokenizer(lang=target_lang)
        self.bpe = self.spm = None
        if bpe_codes is not None:
            from subword_nmt.apply_bpe import BPE

            try:
                with open(bpe_codes, encoding="utf-8") as codes:
                    self.bpe = BPE(codes)
            except (OSError, ValueError, IndexError) as exc:
                raise HubError(f"cannot read BPE codes {bpe_codes}: {exc}") from None
        if sentencepiece_model is not None:
            import sentencepiece

            try:
                self.spm = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model))
            except (OSError, RuntimeError) as exc:
                raise HubError(
                    f"cannot read SentencePiece model {sentencepiece_model}: {exc}"
                ) from None

    def encode(self, sentence: str, target: bool = False) -> str:
        """Raw source (or, with ``target``, target) sentence -> space-separated model tokens."""
        text = sentence.strip()
        tokenizer = self.target_tokenizer if target else self.tokenizer
        if tokenizer is not None:
            text = tokenizer.tokenize(text, escape=False, return_str=True)
        if self.bpe is not None:
            text = self.bpe.process_line(text)
        if self.spm is not None:
            text = " ".join(self.spm.encode(text, out_type=str))
        return text

    def decode(self, tokens: str) -> str:
        """Space-separated model tokens -> raw target sentence."""
        text = tokens
        if self.bpe is not None:
            text = (text + " ").replace("@@ ", "").rstrip()
        if self.spm is not None:
            text = "".join(text.split()).replace("\u2581", " ").strip()
        if self.detokenizer is not None:
            text = self.detokenizer.detokenize(text.split())
        return text


class Translator:
    """An ensemble of checkpoints with its task, dictionaries and text pre/post-processing."""

    def __init__(
        self,
        task,
        models: Sequence[torch.nn.Module],
        codec: TextCodec,
        beam: int = 4,
        lenpen: float = 0.6,
        batch_size: int = 64,
        max_tokens: int | None = None,
    ) -> None:
        from fairseq import utils

        self.task = task
        self.models = list(models)
        self.codec = codec
        self.beam = beam
        self.lenpen = lenpen
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.max_positions = utils.resolve_max_positions(
            task.max_positions(), *[model.max_positions() for model in self.models]
        )
        self._generators: dict = {}

    @property
    def device(self) -> torch.device:
        return next(self.models[0].parameters()).device

    def generator(self, beam: int, lenpen: float):
        key = (beam, lenpen)
        if key not in self._generators:
            args = Namespace(beam=beam, lenpen=lenpen, max_len_a=0, max_len_b=200, min_len=1)
            self._generators[key] = self.task.build_generator(self.models, args)
        return self._generators[key]

    def translate_tokens(
        self, lines: Sequence[str], nbest: int = 1, beam: int | None = None,
        lenpen: float | None = None,
    ) -> list[list[dict]]:
        """Decode already encoded source lines (model tokens, space separated).

        Returns, per line, ``nbest`` dicts best first: ``tokens`` (target token string),
        ``score`` (length-normalized log-probability), ``positional_scores`` (tensor).
        """
        from fairseq import utils

        beam = self.beam if beam is None else beam
        lenpen = self.lenpen if lenpen is None else lenpen
        if not 1 <= nbest <= beam:
            raise ValueError(f"nbest must be between 1 and the beam size {beam}, got {nbest}")
        generator = self.generator(beam, lenpen)
        src_dict, tgt_dict = self.task.source_dictionary, self.task.target_dictionary
        tokens = [src_dict.encode_line(line, add_if_not_exist=False).long() for line in lines]
        if not tokens:
            return []
        longest = _max_source_tokens(self.max_positions)
        for number, sentence in enumerate(tokens, start=1):
            if longest is not None and sentence.numel() > longest:
                raise ValueError(
                    f"sentence {number} has {sentence.numel()} tokens (with EOS), more than the "
                    f"model's {longest} source positions: split or shorten it"
                )
        dataset = self.task.build_dataset_for_inference(
            tokens, torch.LongTensor([t.numel() for t in tokens])
        )
        batches = self.task.get_batch_iterator(
            dataset=dataset, max_tokens=self.max_tokens, max_sentences=self.batch_size,
            max_positions=self.max_positions, disable_iterator_cache=True,
        ).next_epoch_itr(shuffle=False)
        results: dict = {}
        with torch.no_grad():
            for batch in batches:
                batch = utils.apply_to_sample(lambda t: t.to(self.device), batch)
                hypos = self.task.inference_step(generator, self.models, batch)
                for sample_id, sentence_hypos in zip(batch["id"].tolist(), hypos):
                    results[sample_id] = [
                        {
                            "tokens": tgt_dict.string(hypo["tokens"].int().cpu()),
                            "score": float(hypo["score"]),
                            "positional_scores": hypo["positional_scores"].cpu(),
                        }
                        for hypo in sentence_hypos[:nbest]
                    ]
        return [results[i] for i in range(len(tokens))]

    def translate(
        self, sentences: str | Sequence[str], nbest: int = 1, beam: int | None = None,
        lenpen: float | None = None,
    ):
        """Translate raw text.

        ``translate("s")`` -> str; ``translate("s", nbest=k)`` -> k strings (best first);
        ``translate([...])`` -> one str (or one list of k strings) per sentence. An empty (or
        blank) sentence gives an empty translation without decoding. A sentence longer than the
        model's source positions is a ``ValueError`` naming it, raised before any decoding.
        """
        single = isinstance(sentences, str)
        lines = [sentences] if single else list(sentences)
        encoded = [self.codec.encode(line) for line in lines]
        # An empty line translates to an empty line (not decoded), so outputs stay aligned.
        kept = [i for i, line in enumerate(encoded) if line.strip()]
        hypos = self.translate_tokens(
            [encoded[i] for i in kept], nbest=nbest, beam=beam, lenpen=lenpen
        )
        outputs = [[""] * nbest for _ in lines]
        for i, per_line in zip(kept, hypos):
            outputs[i] = [self.codec.decode(h["tokens"]) for h in per_line]
        if nbest == 1:
            outputs = [per_line[0] for per_line in outputs]
        return outputs[0] if single else outputs


def _max_source_tokens(max_positions) -> int | None:
    """The source part of fairseq's resolved ``max_positions`` (an int or a (source, target)
    pair, None when unlimited)."""
    if isinstance(max_positions, (tuple, list)):
        max_positions = max_positions[0]
    return None if max_positions is None else int(max_positions)


def load_translator(
    model_dir: str | os.PathLike,
    checkpoints: Sequence[str | os.PathLike] | None = None,
    data_dir: str | os.PathLike | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    bpe_codes: str | os.PathLike | None = None,
    sentencepiece_model: str | os.PathLike | None = None,
    moses: bool | None = None,
    beam: int = 4,
    lenpen: float = 0.6,
    length_penalty_form: str = "gnmt",
    max_len_over_source: int = 50,
    batch_size: int = 64,
    max_tokens: int | None = None,
    device: str = "cpu",
) -> Translator:
    """Load a model directory (see the module docstring); raises :class:`HubError` naming the
    file when something is missing or unreadable."""
    from fairseq import checkpoint_utils, tasks
    from omegaconf import open_dict

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise HubError(f"model directory not found: {model_dir}")
    if checkpoints is None:
        found = _first_existing(model_dir, CHECKPOINT_NAMES)
        if found is None:
            raise HubError(f"no checkpoint ({', '.join(CHECKPOINT_NAMES)}) in {model_dir}")
        paths = [found]
    else:
        paths = [_resolve(model_dir, name) for name in checkpoints]
        if not paths:
            raise HubError("checkpoints= is empty")
    data_dir = Path(data_dir) if data_dir is not None else model_dir
    if not data_dir.is_dir():
        raise HubError(f"data directory not found: {data_dir}")
    bpe_path = (_resolve(model_dir, bpe_codes) if bpe_codes is not None
                else _first_existing(model_dir, BPE_CODES_NAMES))
    spm_path = (_resolve(model_dir, sentencepiece_model) if sentencepiece_model is not None
                else _first_existing(model_dir, SENTENCEPIECE_NAMES))
    for path in (bpe_path, spm_path):
        if path is not None and not path.is_file():
            raise HubError(f"file not found: {path}")

    states = [_read_checkpoint(path) for path in paths]
    task_cfg = states[0]["cfg"].task
    src, tgt = _languages(source_lang, target_lang, task_cfg, data_dir)
    with open_dict(task_cfg):
        task_cfg._name = TASK_NAME
        task_cfg.data = str(data_dir)
        task_cfg.source_lang, task_cfg.target_lang = src, tgt
        task_cfg.length_penalty_form = length_penalty_form
        task_cfg.max_len_over_source = max_len_over_source
        task_cfg.eval_bleu = False
    try:
        task = tasks.setup_task(task_cfg)
    except LOAD_ERRORS as exc:
        raise HubError(f"cannot set up the task on {data_dir}: {_one_line(exc)}") from None

    models = []
    for path, state in zip(paths, states):
        try:
            loaded, _, _ = checkpoint_utils.load_model_ensemble_and_task(
                [str(path)], task=task, state=state
            )
        except LOAD_ERRORS as exc:
            raise HubError(f"cannot build the model of {path}: {_one_line(exc)}") from None
        model = loaded[0].to(device)
        model.eval()
        models.append(model)

    codec = TextCodec(
        src, tgt, moses=(spm_path is None) if moses is None else moses,
        bpe_codes=bpe_path, sentencepiece_model=spm_path,
    )
    return Translator(task, models, codec, beam=beam, lenpen=lenpen, batch_size=batch_size,
                      max_tokens=max_tokens)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m user_plugin.hub MODEL_DIR``: translate stdin, one sentence per line."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model_dir")
    parser.add_argument("--checkpoints", nargs="+", help="several = an ensemble")
    parser.add_argument("--data-dir")
    parser.add_argument("--source-lang")
    parser.add_argument("--target-lang")
    parser.add_argument("--bpe-codes")
    parser.add_argument("--sentencepiece-model")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=0.6)
    parser.add_argument("--nbest", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    try:
        translator = load_translator(
            args.model_dir, checkpoints=args.checkpoints, data_dir=args.data_dir,
            source_lang=args.source_lang, target_lang=args.target_lang,
            bpe_codes=args.bpe_codes, sentencepiece_model=args.sentencepiece_model,
            beam=args.beam, lenpen=args.lenpen, batch_size=args.batch_size,
        )
        lines = [line.rstrip("\n") for line in sys.stdin]
        outputs = translator.translate(lines, nbest=args.nbest)
    except (HubError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for output in outputs:
        for text in [output] if args.nbest == 1 else output:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
