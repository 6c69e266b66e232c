#!/usr/bin/env python3
"""How Hugging Face ``generate`` on a transformers export decodes compared with our exact
decoder (the paper's beam search, §6.1): the share of identical outputs and the sacreBLEU of both.

Our side is the hub (beam 4, GNMT penalty alpha 0.6, each sentence at most its source length + 50
tokens). transformers has neither that penalty nor that limit, so its side is the closest it
offers: ``num_beams=4``, ``length_penalty=0.6`` (its score / |Y|^alpha, fairseq's form),
``early_stopping=True`` (a sentence ends once 4 hypotheses have finished, fairseq's rule), the
padding token blocked, and each sentence decoded alone with ``max_new_tokens`` = its source
tokens + 50. Both read the raw source through the export's exact tokenization route, so any
difference is the decoding's.

    python scripts/compare_hf_generate.py --checkpoint model/checkpoint_avg.pt \\
        --data-dir data-bin --export-dir hf --source test.en --reference test.de

(``--export-dir`` is written first when it does not exist.) Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.files import iter_lines, run_main  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--export-dir", type=Path, required=True)
    parser.add_argument("--source", type=Path, required=True, help="raw source, one per line")
    parser.add_argument("--reference", type=Path, required=True, help="raw reference")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences (0: all)")
    args = parser.parse_args(argv)

    import sacrebleu
    import torch

    from user_plugin.artifacts.transformers_layout import (
        PAD,
        ExportTokenizer,
        require_transformers,
    )
    from user_plugin.export.transformers_model import export_transformers
    from user_plugin.hub import load_translator

    transformers = require_transformers()
    torch.set_num_threads(1)
    # fairseq's batch iterator asks for pinned memory, which torch warns about on a CPU
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true")
    source, reference = list(iter_lines(args.source)), list(iter_lines(args.reference))
    if args.limit:
        source, reference = source[: args.limit], reference[: args.limit]
    if not args.export_dir.exists():
        export_transformers(args.checkpoint, args.data_dir, args.export_dir)
    translator = load_translator(args.checkpoint.parent, checkpoints=[args.checkpoint],
                                 data_dir=args.data_dir)
    ours = [h[0]["tokens"] for h in translator.translate_tokens(
        [translator.codec.encode(line) for line in source])]
    tokenizer = ExportTokenizer(args.export_dir)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(args.export_dir)).eval()
    theirs = []
    with torch.no_grad():
        for line in source:
            ids = torch.tensor([tokenizer.source_ids(line)])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 num_beams=4, length_penalty=0.6, early_stopping=True,
                                 max_new_tokens=ids.size(1) - 1 + 50, bad_words_ids=[[PAD]])
            symbols = tokenizer.target_symbols
            theirs.append(" ".join(symbols[int(i)] for i in out[0].tolist()
                                   if int(i) not in (0, 1, 2)))
    same = sum(a == b for a, b in zip(ours, theirs))
    ours_text = [translator.codec.decode(t) for t in ours]
    their_text = [tokenizer.pipeline.decode(t) for t in theirs]
    print(json.dumps({
        "sentences": len(source), "identical_outputs": same,
        "identical_share": round(same / len(source), 4),
        "bleu_ours": round(sacrebleu.corpus_bleu(ours_text, [reference]).score, 2),
        "bleu_transformers": round(sacrebleu.corpus_bleu(their_text, [reference]).score, 2),
        "model_class": type(model).__name__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, "compare_hf_generate.py"))
