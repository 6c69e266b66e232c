"""Collect the results of ``recipes/ablation.sh`` into a table like the paper's
Table 3 (§6.2, "Model Variations": newstest2013 dev set, no checkpoint averaging).

Subcommands::

    vaswani-ablation-table list
        the Table 3 architectures, one per line, in the table's order
    vaswani-ablation-table info ARCH [ARCH ...]
        "ARCH LABEL_SMOOTHING TRAIN_STEPS" per architecture: the criterion's ε_ls and the
        number of updates its row was trained for; any registered architecture that is not a
        Table 3 row gets the base model's (0.1, 100000); an unknown name is an error
    vaswani-ablation-table collect --results-dir DIR --output TABLE.md [--json RESULTS.json]
                              [--variants V ...] [--checkpoint checkpoint_last.pt]
                              [--subset valid]
        one table row per variant directory ``DIR/<variant>/`` holding what ablation.sh wrote:
        ``train.log`` (fairseq-train; the parameter count it logs), ``validate.log``
        (fairseq-validate --log-format simple; perplexity per word-piece), ``generate.log``
        (fairseq-generate; BLEU) and ``checkpoints/<checkpoint>`` (the configuration, ε_ls and
        number of updates actually trained)

The table sets each variant's measured numbers beside the paper's. Outputs are written
atomically; bad input gives one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

# Logging set up before fairseq is imported (see user_plugin.files).
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.artifacts.checkpoints import read_checkpoint  # noqa: E402
from user_plugin.files import (  # noqa: E402
    UserError,
    atomic_write_text,
    console_script,
    read_lines,
    refuse_input_clash,
)

PARAMS_PATTERN = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")
BLEU_PATTERN = re.compile(r"Generate \S+ with beam=\d+: .*?\bBLEU4? = (-?[\d.]+|nan|inf)")


@dataclass
class VariantResult:
    """What one trained variant measured, with its configuration read from the checkpoint."""

    variant: str
    row: str
    change: str
    layers: int
    d_model: int
    d_ff: int
    heads: int
    d_k: int
    d_v: int
    dropout: float
    label_smoothing: float | None
    train_steps: int
    ppl: float
    nll_loss: float
    bleu: float
    params: int
    paper_ppl: float | None
    paper_bleu: float | None
    paper_params_millions: float | None


# -- parsing fairseq's logs -----------------------------------------------------------------------


def parse_params(text: str, source: str) -> int:
    """The parameter count that fairseq-train logs ("num. shared model params: 63,080,960")."""
    found = PARAMS_PATTERN.findall(text)
    if not found:
        raise UserError(f"{source}: no 'num. shared model params' line (not a fairseq-train log?)")
    return int(found[-1].replace(",", ""))


def parse_validation(text: str, subset: str, source: str) -> dict[str, float]:
    """``loss``, ``nll_loss`` and ``ppl`` of fairseq-validate's summary line for ``subset``."""
    marker = f"valid on '{subset}' subset |"
    lines = [line for line in text.splitlines() if marker in line and "| ppl " in line]
    if not lines:
        raise UserError(
            f"{source}: no \"valid on '{subset}' subset\" summary with a ppl "
            "(not a fairseq-validate --log-format simple log?)"
        )
    fields: dict[str, float] = {}
    for part in lines[-1].split(marker, 1)[1].split("|"):
        words = part.split()
        if len(words) == 2:
            try:
                fields[words[0]] = float(words[1])
            except ValueError:
                continue
    for name in ("ppl", "nll_loss"):
        if name not in fields:
            raise UserError(f"{source}: the validation summary has no numeric {name}")
    return fields


def parse_bleu(text: str, source: str) -> float:
    """The corpus BLEU of fairseq-generate's last "Generate <subset> with beam=..." line."""
    found = BLEU_PATTERN.findall(text)
    if not found:
        raise UserError(f"{source}: no 'Generate ... BLEU' line (not a fairseq-generate log?)")
    return float(found[-1])


# -- reading a checkpoint's configuration ---------------------------------------------------------


def read_checkpoint_config(path: Path) -> dict:
    """``cfg`` and the number of updates of a fairseq checkpoint, loaded without the weights'
    copy into memory (memory-mapped) and with torch's safe loading."""
    state = read_checkpoint(path, mmap=True, required=("cfg",))
    if not isinstance(state["cfg"], dict):
        raise UserError(f"{path}: not a fairseq checkpoint (no 'cfg')")
    history = state.get("optimizer_history") or [{}]
    return {"cfg": state["cfg"], "num_updates": int(history[-1].get("num_updates", 0))}


def _side_values(model: dict, name: str) -> int:
    """Encoder value of a per-side option (the paper's stacks are symmetric)."""
    value = model.get(f"encoder_{name}")
    if value is None:
        raise UserError(f"the checkpoint's model config has no encoder_{name}")
    return int(value)


def collect_variant(directory: Path, checkpoint: str, subset: str) -> VariantResult:
    """Read one variant directory written by ablation.sh."""
    from user_plugin.models.table3_architectures import TABLE3

    if not directory.is_dir():
        raise UserError(f"{directory}: no such variant directory")
    variant = directory.name
    train_log = directory / "train.log"
    validate_log = directory / "validate.log"
    generate_log = directory / "generate.log"
    params = parse_params("\n".join(read_lines(train_log)), str(train_log))
    valid = parse_validation("\n".join(read_lines(validate_log)), subset, str(validate_log))
    bleu = parse_bleu("\n".join(read_lines(generate_log)), str(generate_log))
    state = read_checkpoint_config(directory / "checkpoints" / checkpoint)
    model = state["cfg"].get("model") or {}
    criterion = state["cfg"].get("criterion") or {}
    d_model = _side_values(model, "embed_dim")
    heads = _side_values(model, "attention_heads")
    paper = TABLE3.get(variant)
    return VariantResult(
        variant=variant,
        row=paper.row if paper else "-",
        change=paper.change if paper else "-",
        layers=_side_values(model, "layers"),
        d_model=d_model,
        d_ff=_side_values(model, "ffn_embed_dim"),
        heads=heads,
        d_k=int(model.get("attention_key_dim") or d_model // heads),
        d_v=int(model.get("attention_value_dim") or d_model // heads),
        dropout=float(model.get("dropout", math.nan)),
        label_smoothing=(
            float(criterion["label_smoothing"]) if "label_smoothing" in criterion else None
        ),
        train_steps=state["num_updates"],
        ppl=valid["ppl"],
        nll_loss=valid["nll_loss"],
        bleu=bleu,
        params=params,
        paper_ppl=paper.paper_ppl if paper else None,
        paper_bleu=paper.paper_bleu if paper else None,
        paper_params_millions=paper.paper_params_millions if paper else None,
    )


# -- the table ------------------------------------------------------------------------------------


def format_millions(count: int) -> str:
    """Parameters in millions, as Table 3 gives them; tiny models keep 4 decimals."""
    return f"{count / 1e6:.2f}" if count >= 1_000_000 else f"{count / 1e6:.4f}"


def _optional(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


TABLE_HEADER = (
    "| variant | row | change | N | d_model | d_ff | h | d_k | d_v | P_drop | ε_ls | train steps "
    "| PPL (dev) | BLEU (dev) | params ×10⁶ | paper PPL | paper BLEU | paper params ×10⁶ |"
)


def markdown_table(results: Sequence[VariantResult]) -> str:
    """A Table-3-like markdown table: measured numbers, then the paper's for the same row."""
    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" |")]
    for r in results:
        cells = [
            f"`{r.variant}`", r.row, r.change, str(r.layers), str(r.d_model), str(r.d_ff),
            str(r.heads), str(r.d_k), str(r.d_v), f"{r.dropout:g}",
            "" if r.label_smoothing is None else f"{r.label_smoothing:g}", str(r.train_steps),
            f"{r.ppl:.2f}", f"{r.bleu:.2f}", format_millions(r.params),
            _optional(r.paper_ppl, 2), _optional(r.paper_bleu, 1),
            "" if r.paper_params_millions is None else f"{r.paper_params_millions:g}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table_document(results: Sequence[VariantResult], subset: str, checkpoint: str) -> str:
    """The table with a heading saying what was measured and how."""
    return (
        "# Variations on the Transformer (paper Table 3)\n\n"
        f"Measured on the `{subset}` subset (newstest2013 in the recipe) with `{checkpoint}` "
        "(no checkpoint averaging); PPL per word-piece from fairseq-validate, BLEU from "
        "fairseq-generate; params counted by fairseq-train. The paper's numbers are for "
        "newstest2013 after 100k (big: 300k) steps on 8 P100 GPUs.\n\n"
        + markdown_table(results)
    )


# -- command line ---------------------------------------------------------------------------------


def arch_info(arch: str) -> str:
    """``ARCH LABEL_SMOOTHING TRAIN_STEPS`` for a registered architecture."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from user_plugin.models.table3_architectures import (
        BASE_LABEL_SMOOTHING,
        BASE_TRAIN_STEPS,
        TABLE3,
    )

    if arch in TABLE3:
        row = TABLE3[arch]
        return f"{arch} {row.label_smoothing:g} {row.train_steps}"
    if arch in ARCH_MODEL_REGISTRY:
        return f"{arch} {BASE_LABEL_SMOOTHING:g} {BASE_TRAIN_STEPS}"
    raise UserError(f"unknown architecture {arch!r} (the Table 3 ones: {PROG} list)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the Table 3 architectures, in order")
    info = commands.add_parser("info", help="ε_ls and training steps of architectures")
    info.add_argument("archs", nargs="+", metavar="ARCH")
    collect = commands.add_parser("collect", help="write the Table-3-like markdown table")
    collect.add_argument("--results-dir", type=Path, required=True,
                         help="the directory holding one subdirectory per variant")
    collect.add_argument("--output", type=Path, required=True, help="the markdown table to write")
    collect.add_argument("--json", type=Path, help="also write every number here, exactly")
    collect.add_argument("--variants", nargs="+",
                         help="variants, in table order (default: every subdirectory)")
    collect.add_argument("--checkpoint", default="checkpoint_last.pt",
                         help="checkpoint file evaluated in each variant's checkpoints/")
    collect.add_argument("--subset", default="valid", help="the validation subset evaluated")
    return parser.parse_args(argv)


def default_variants(results_dir: Path) -> list[str]:
    """Every variant subdirectory: Table 3 ones in the table's order, then the rest by name."""
    from user_plugin.models.table3_architectures import TABLE3

    if not results_dir.is_dir():
        raise UserError(f"{results_dir}: no such results directory")
    names = sorted(p.name for p in results_dir.iterdir() if p.is_dir())
    order = {arch: i for i, arch in enumerate(TABLE3)}
    return sorted(names, key=lambda name: (order.get(name, len(order)), name))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "list":
        from user_plugin.models.table3_architectures import TABLE3

        print("\n".join(TABLE3))
        return 0
    if args.command == "info":
        for line in [arch_info(arch) for arch in args.archs]:
            print(line)
        return 0
    variants = args.variants or default_variants(args.results_dir)
    variants = [v for item in variants for v in item.replace(",", " ").split()]
    if not variants:
        raise UserError(f"{args.results_dir}: no variants to collect")
    inputs = [args.results_dir / variant for variant in variants]
    for output in (args.output, args.json):
        if output is not None:
            refuse_input_clash(output, inputs)
    if args.json is not None:
        refuse_input_clash(args.json, [args.output])
    results = [
        collect_variant(args.results_dir / variant, args.checkpoint, args.subset)
        for variant in variants
    ]
    if args.json is not None:
        atomic_write_text(args.json, json.dumps([asdict(r) for r in results], indent=2) + "\n")
    atomic_write_text(args.output, table_document(results, args.subset, args.checkpoint))
    print(f"{PROG}: wrote {len(results)} rows to {args.output}")
    return 0


PROG = "vaswani-ablation-table"


cli_main = console_script(main, PROG)


if __name__ == "__main__":
    sys.exit(cli_main())
