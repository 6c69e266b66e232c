"""Draw a trained model's attention weights as heatmaps, as in the paper's Figures 3-5.

For one sentence pair, the model is run teacher-forced (the target is fed to the decoder) and
every attention distribution is drawn:

* ``encoder_self_layer{L}.png``: encoder self-attention; rows = query source token, columns =
  attended source token (the source ends with ``</s>``);
* ``decoder_self_layer{L}.png``: masked decoder self-attention; rows = the target token being
  predicted at that position, columns = the decoder input tokens (``<s>`` is fairseq's
  start symbol, the EOS);
* ``encoder_decoder_layer{L}.png``: encoder-decoder attention; rows = target token being
  predicted, columns = source tokens.

One PNG per (kind, layer), with one panel per head (layers are numbered from 1), so a run writes
``N_enc + 2 * N_dec`` files. Rows sum to 1; each panel's colours run from 0 to its own largest
weight (given in the panel title). With only a source sentence, the target is first
decoded with the paper's beam search (beam 4, GNMT alpha 0.6); with several checkpoints only
the first is drawn.

    vaswani-plot-attention --model-dir PACKAGE --source "A man rides a bike." \\
        --out-dir attention/ [--target "Ein Mann fährt Rad."]
    vaswani-plot-attention --checkpoint ckpt/checkpoint_best.pt --data-dir data-bin \\
        --source-lang en --target-lang de --source "..." --out-dir attention/

Raw sentences go through the model directory's Moses/BPE settings (see ``user_plugin.hub``);
``--tokenized`` takes them as model tokens (already tokenized and BPE-split) instead.
"""

from __future__ import annotations

import argparse
import io
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

# Logging set up before fairseq is imported (see user_plugin.files).
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.files import (  # noqa: E402
    UserError,
    atomic_write,
    console_script,
    refuse_input_clash,
)
from user_plugin.files.errors import int_between  # noqa: E402
from user_plugin.modules.attention_maps import (  # noqa: E402
    KINDS,
    MAX_DRAWN_TOKENS,
    attention_maps,
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-dir", type=Path, help="a model package (or a folder holding one "
                       "checkpoint, as vaswani-translate takes)")
    where.add_argument("--checkpoint", type=Path, help="a checkpoint file (with --data-dir)")
    parser.add_argument("--data-dir", type=Path,
                        help="fairseq-preprocess output with the dictionaries")
    parser.add_argument("--source-lang")
    parser.add_argument("--target-lang")
    parser.add_argument("--bpe-codes", type=Path)
    parser.add_argument("--sentencepiece-model", type=Path)
    parser.add_argument("--source", required=True, help="the source sentence")
    parser.add_argument("--target", help="its translation (default: decode the source)")
    parser.add_argument("--tokenized", action="store_true",
                        help="sentences are already model tokens (no Moses, no BPE)")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--dpi", type=int_between(1, MAX_DPI), default=100,
                        help=f"the figures' resolution, 1 to {MAX_DPI} (default: 100)")
    args = parser.parse_args(argv)
    if not args.source.strip():
        parser.error("--source is empty")
    return args


def load(args: argparse.Namespace):
    """The translator of ``--model-dir`` or ``--checkpoint``; a bad file is a
    :class:`~user_plugin.artifacts.errors.ArtifactError`, one line naming it."""
    from user_plugin.hub import load_translator

    def absolute(path: Path | None) -> Path | None:
        return None if path is None else path.resolve()

    return load_translator(
        args.model_dir if args.model_dir is not None else args.checkpoint, data_dir=args.data_dir,
        source_lang=args.source_lang, target_lang=args.target_lang,
        bpe_codes=absolute(args.bpe_codes),
        sentencepiece_model=absolute(args.sentencepiece_model),
        moses=False if args.tokenized else None,
    )


#: The largest figure side, in pixels, that matplotlib's PNG writer draws.
MAX_PIXELS = 2**16 - 1
MAX_DPI = 1200
CELL_INCHES = 0.28


def figure_inches(heads: int, rows: int, columns: int) -> tuple[float, float]:
    """The width and height of :func:`draw_heads`' figure for ``heads`` panels of ``rows`` x
    ``columns`` cells."""
    across = min(heads, 4)
    down = math.ceil(heads / across)
    width = max(3.0, CELL_INCHES * columns + 1.2)
    height = max(3.0, CELL_INCHES * rows + 1.2)
    return width * across, height * down


def length_problem(option: str, tokens: int) -> str | None:
    """Why a sentence of ``tokens`` model tokens (with EOS), given by ``option``, is too long
    to draw, or None."""
    if tokens <= MAX_DRAWN_TOKENS:
        return None
    return (f"{option} has {tokens} model tokens (with EOS); the heatmaps draw sentences of at "
            f"most {MAX_DRAWN_TOKENS}: give a shorter sentence")


def resolution_problem(heads: int, tokens: int, dpi: int) -> str | None:
    """Why the figure of ``heads`` panels of sentences up to ``tokens`` cannot be drawn at
    ``dpi`` (wider than a PNG figure may be), naming ``--dpi``, or None."""
    inches = max(figure_inches(heads, tokens, tokens))
    if inches * dpi <= MAX_PIXELS:
        return None
    return (f"--dpi {dpi} makes a figure {int(inches * dpi)} pixels wide, more than the "
            f"{MAX_PIXELS} a PNG figure can have: give --dpi {int(MAX_PIXELS // inches)} or less")


def draw_heads(weights, row_labels: list[str], column_labels: list[str], title: str, dpi: int):
    """A figure with one heatmap per head of ``weights`` [heads, rows, columns]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = weights.size(0)
    columns = min(heads, 4)
    rows = math.ceil(heads / columns)
    figure, axes = plt.subplots(rows, columns, squeeze=False, figsize=figure_inches(
        heads, len(row_labels), len(column_labels)))
    for head in range(rows * columns):
        axis = axes[head // columns][head % columns]
        if head >= heads:
            axis.axis("off")
            continue
        panel = weights[head].float()
        peak = max(float(panel.max()), 1e-9)
        axis.imshow(panel.numpy(), cmap="viridis", vmin=0.0, vmax=peak, aspect="auto")
        axis.set_title(f"head {head + 1} (max {peak:.2f})", fontsize=9)
        axis.set_xticks(range(len(column_labels)))
        axis.set_xticklabels(column_labels, rotation=90, fontsize=7)
        axis.set_yticks(range(len(row_labels)))
        axis.set_yticklabels(row_labels, fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    plt.close(figure)
    return buffer.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for noisy in ("matplotlib", "fairseq", "user_plugin"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    inputs = [path for path in (args.model_dir, args.checkpoint, args.data_dir, args.bpe_codes,
                                args.sentencepiece_model) if path is not None]
    refuse_input_clash(args.out_dir, inputs)
    translator = load(args)
    codec, task = translator.codec, translator.task
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary

    source_line = args.source.strip() if args.tokenized else codec.encode(args.source)
    source_length = len(source_line.split()) + 1
    problem = length_problem("--source", source_length)
    if args.target is not None:
        target_line = args.target.strip() if args.tokenized else codec.encode(args.target, True)
        problem = problem or length_problem("--target", len(target_line.split()) + 1)
    elif problem is None:
        target_line = translator.translate_tokens([source_line])[0][0]["tokens"]
        print(f"decoded target: {target_line}")
    if problem is not None:
        raise UserError(problem)
    src_tokens = src_dict.encode_line(source_line, add_if_not_exist=False).long()
    tgt_tokens = tgt_dict.encode_line(target_line, add_if_not_exist=False).long()

    model = translator.models[0]
    maps = attention_maps(model, src_tokens, tgt_tokens, tgt_dict.eos())
    source_labels = [src_dict[i] for i in src_tokens.tolist()]
    target_labels = [tgt_dict[i] for i in tgt_tokens.tolist()]
    decoder_inputs = ["<s>"] + target_labels[:-1]
    heads = max(weights.size(0) for layers in maps.values() for weights in layers)
    problem = resolution_problem(heads, max(len(src_tokens), len(tgt_tokens)), args.dpi)
    if problem is not None:
        raise UserError(problem)
    axes = {
        "encoder_self": (source_labels, source_labels),
        "decoder_self": (target_labels, decoder_inputs),
        "encoder_decoder": (target_labels, source_labels),
    }
    written = []
    for kind in KINDS:
        row_labels, column_labels = axes[kind]
        for layer, weights in enumerate(maps[kind], start=1):
            png = draw_heads(weights, row_labels, column_labels,
                             f"{kind.replace('_', '-')} attention, layer {layer}", args.dpi)
            path = args.out_dir / f"{kind}_layer{layer}.png"

            def write(temp: str, data: bytes = png) -> None:
                Path(temp).write_bytes(data)

            atomic_write(path, write, inputs)
            written.append(path)
    print(f"wrote {len(written)} PNG files to {args.out_dir}")
    return 0


PROG = "vaswani-plot-attention"


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
