"""Translate raw text with trained checkpoints, decoding as the paper does (§6.1).

::

    from user_plugin.hub import load_translator

    translator = load_translator("path/to/package")             # a model package
    translator.translate("A man is riding a bike.")            # -> "Ein Mann fährt ..."
    translator.translate(["One sentence.", "Another one."])    # -> [str, str]
    translator.translate("A dog runs.", nbest=3)               # -> [str, str, str], best first
    load_translator("model_dir", checkpoints=["a.pt", "b.pt"])  # an ensemble (averaged probs)
    translator.translate("A dog runs.", constraints=["Hund"])  # lexically constrained
    translator.translate("A dog runs.", sampling=True, nbest=3, sampling_topk=10, seed=1)
    translator.translate_tokens(["A dog runs ."], alignment=True)  # + (source, target) pairs

A model is opened by the one reader,
:func:`~user_plugin.artifacts.model_files.open_model`:

* a **model package** (``vaswani-package``, or the recipes' ``$RUN_DIR/model``): complete, every
  file checked against its manifest; the usual thing to hand around;
* a checkpoint file, with ``data_dir=`` the folder of its ``dict.<src>.txt`` and
  ``dict.<tgt>.txt`` (a ``fairseq-preprocess`` output) unless they are beside it;
* a folder holding exactly one checkpoint (several: ``checkpoints=`` picks, paths relative to
  the folder or absolute; several = an ensemble); its text pipeline record
  ``text_pipeline.json`` beside it or in ``data_dir``, else a subword model by its usual name
  (``bpecodes``, ``spm.model``, ...) or ``bpe_codes=`` / ``sentencepiece_model=``.

Raw text goes through the model's text pipeline
(:class:`~user_plugin.artifacts.text_pipeline.TextPipeline`): the ``text_pipeline.json``
record that the recipes write beside the prepared data and carry into the averaged model
directory (Moses punctuation normalization, Moses tokenization with aggressive dash splits for
BPE, the subword model checked by sha256), or, for a directory without a record, the recipes'
pipeline assumed and said in one warning line. Outputs go back through the target dictionary,
subword removal and sacremoses ``detokenize``. ``vaswani-translate MODEL_DIR
--print-tokens < raw.txt`` prints the model tokens each raw line becomes.
The languages come from the keywords, the checkpoint, or the binarized file names in the data
directory.

Decoding defaults are the paper's: beam 4, GNMT length penalty with alpha 0.6, at most
source length + 50 output tokens per sentence (the ``vaswani_translation`` task's generator);
n-best lists, lexical constraints, sampling and alignments are options of each call
(docs/decoding.md).

Command line: ``vaswani-translate MODEL_DIR [--source-lang en --target-lang de ...]``
(:mod:`user_plugin.commands.translate`) translates stdin line by line.

``load_translator(EXPORT_DIR, backend="ctranslate2")`` (``--backend ctranslate2``) translates
with a CTranslate2 export (``vaswani-export ... --to ctranslate2``) instead: the
same text pipeline, the paper's decoding as closely as that engine allows.

Text prepared by hand, without a record: ``TextPipeline.from_files(...)``.

Modules: :mod:`.translator` (:class:`Translator`),
:mod:`.loader` (:func:`load_translator`), :mod:`.ctranslate2_translator` (the ``ctranslate2``
backend). Files that cannot be used raise :class:`~user_plugin.artifacts.errors.ArtifactError`
(a :class:`~user_plugin.files.errors.UserError`), one line naming the file. A model
directory's files are found by :mod:`user_plugin.artifacts.model_files`.
"""

from ..artifacts.errors import ArtifactError
from ..artifacts.model_files import (
    BPE_CODES_NAMES,
    SENTENCEPIECE_NAMES,
    ModelFiles,
    language_pair,
    open_model,
)
from ..artifacts.text_pipeline import TextPipeline
from .loader import load_translator
from .translator import Translator, max_source_tokens

#: ``max_source_tokens`` under the name the fault tests read it by.
_max_source_tokens = max_source_tokens

__all__ = [
    "BPE_CODES_NAMES",
    "SENTENCEPIECE_NAMES",
    "ArtifactError",
    "ModelFiles",
    "TextPipeline",
    "Translator",
    "language_pair",
    "load_translator",
    "max_source_tokens",
    "open_model",
]
