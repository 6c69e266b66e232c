"""Every row of the paper's Table 3 (§6.2, "Model Variations") as an architecture of
``vaswani_transformer``.

Each architecture is the base model with the one change of its row; options given on the command
line still win (``--arch vaswani_table3_c_layers2 --encoder-embed-dim 64`` is a narrow 2-layer
model). Names read as ``vaswani_table3_<row>_<change>``:

* A: ``a_heads1_dk512``, ``a_heads4_dk128``, ``a_heads16_dk32``, ``a_heads32_dk16`` (d_k = d_v =
  d_model / h, at constant computation);
* B: ``b_dk16``, ``b_dk32`` (the attention key size d_k alone, d_v stays d_model / h);
* C: ``c_layers2/4/8``, ``c_dmodel256``, ``c_dmodel1024``, ``c_dff1024``, ``c_dff4096``;
* D: ``d_dropout0_0``, ``d_dropout0_2``, ``d_ls0_0``, ``d_ls0_2``;
* E: ``e_learned_pos`` (learned instead of sinusoidal positions, §3.5);
* ``base`` and ``big``, the table's reference rows.

Label smoothing (rows ``d_ls*``) is an option of the criterion, not of the model, and an
architecture cannot tell a user's ``--label-smoothing`` from the criterion's default. So the
architectures never change it: each row records the ε_ls it is meant to be trained with in
:data:`TABLE3` (``label_smoothing_for(arch)``), the ablation recipe passes it as
``--label-smoothing``, and ``fairseq-train`` logs a warning when the two differ.

:data:`TABLE3` also keeps the paper's dev-set numbers of each row (newstest2013 perplexity per
word-piece, BLEU, parameters in millions) so results can be set beside them.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass

from fairseq.models import register_model_architecture

from ..paper import BASE_TRAIN_STEPS, BIG_TRAIN_STEPS, LABEL_SMOOTHING
from .architectures import MODEL_NAME, set_both_sides, set_default, vaswani_base, vaswani_big

logger = logging.getLogger(__name__)

BASE_LABEL_SMOOTHING = LABEL_SMOOTHING


@dataclass(frozen=True)
class Table3Row:
    """One row of Table 3: what changes from the base model and what the paper measured."""

    arch: str
    row: str
    change: str
    paper_ppl: float
    paper_bleu: float
    paper_params_millions: float | None
    label_smoothing: float = BASE_LABEL_SMOOTHING
    train_steps: int = BASE_TRAIN_STEPS


TABLE3: dict[str, Table3Row] = {}
"""Architecture name -> its Table 3 row, in the table's order."""

ArchFn = Callable[[object], None]


def table3_variant(
    row: str,
    change: str,
    ppl: float,
    bleu: float,
    params: float | None = None,
    label_smoothing: float = BASE_LABEL_SMOOTHING,
    train_steps: int = BASE_TRAIN_STEPS,
) -> Callable[[ArchFn], ArchFn]:
    """Register the decorated function as architecture ``<its name>`` and record its row."""

    def decorator(fn: ArchFn) -> ArchFn:
        arch = fn.__name__
        entry = Table3Row(arch, row, change, ppl, bleu, params, label_smoothing, train_steps)

        def arch_fn(args) -> None:
            fn(args)
            _check_label_smoothing(args, entry)

        arch_fn.__name__ = arch
        arch_fn.__doc__ = fn.__doc__
        register_model_architecture(MODEL_NAME, arch)(arch_fn)
        TABLE3[arch] = entry
        return arch_fn

    return decorator


def label_smoothing_for(arch: str) -> float:
    """The ε_ls a Table 3 architecture is trained with (0.1 except rows ``d_ls*``)."""
    if arch not in TABLE3:
        known = ", ".join(TABLE3)
        raise KeyError(f"{arch!r} is not a Table 3 architecture; known: {known}")
    return TABLE3[arch].label_smoothing


def _check_label_smoothing(args, entry: Table3Row) -> None:
    """Warn when fairseq-train was given another ε_ls than the row's (criterion option)."""
    given = getattr(args, "label_smoothing", None)
    if given is not None and abs(float(given) - entry.label_smoothing) > 1e-12:
        logger.warning(
            "--arch %s is Table 3 row %s, trained with --label-smoothing %s; this run uses %s",
            entry.arch, entry.row, entry.label_smoothing, given,
        )


# -- reference rows -------------------------------------------------------------------------------


@table3_variant("base", "none: N 6, d_model 512, d_ff 2048, h 8, d_k = d_v = 64, P_drop 0.1, "
                "ε_ls 0.1", 4.92, 25.8, 65)
def vaswani_table3_base(args) -> None:
    """Table 3 base: the base model itself."""
    vaswani_base(args)


# -- row A: number of heads at constant computation -----------------------------------------------


@table3_variant("A", "h 1, d_k = d_v = 512", 5.29, 24.9)
def vaswani_table3_a_heads1_dk512(args) -> None:
    """Table 3 row A: one head of width 512."""
    set_both_sides(args, "attention_heads", 1)
    vaswani_base(args)


@table3_variant("A", "h 4, d_k = d_v = 128", 5.00, 25.5)
def vaswani_table3_a_heads4_dk128(args) -> None:
    """Table 3 row A: 4 heads of width 128."""
    set_both_sides(args, "attention_heads", 4)
    vaswani_base(args)


@table3_variant("A", "h 16, d_k = d_v = 32", 4.91, 25.8)
def vaswani_table3_a_heads16_dk32(args) -> None:
    """Table 3 row A: 16 heads of width 32."""
    set_both_sides(args, "attention_heads", 16)
    vaswani_base(args)


@table3_variant("A", "h 32, d_k = d_v = 16", 5.01, 25.4)
def vaswani_table3_a_heads32_dk16(args) -> None:
    """Table 3 row A: 32 heads of width 16."""
    set_both_sides(args, "attention_heads", 32)
    vaswani_base(args)


# -- row B: attention key size alone --------------------------------------------------------------


@table3_variant("B", "d_k 16", 5.16, 25.1, 58)
def vaswani_table3_b_dk16(args) -> None:
    """Table 3 row B: queries and keys of 16 per head; values stay d_model / h = 64."""
    set_default(args, "attention_key_dim", 16)
    vaswani_base(args)


@table3_variant("B", "d_k 32", 5.01, 25.4, 60)
def vaswani_table3_b_dk32(args) -> None:
    """Table 3 row B: queries and keys of 32 per head; values stay d_model / h = 64."""
    set_default(args, "attention_key_dim", 32)
    vaswani_base(args)


# -- row C: model size ----------------------------------------------------------------------------


@table3_variant("C", "N 2", 6.11, 23.7, 36)
def vaswani_table3_c_layers2(args) -> None:
    """Table 3 row C: 2 encoder and 2 decoder layers."""
    set_both_sides(args, "layers", 2)
    vaswani_base(args)


@table3_variant("C", "N 4", 5.19, 25.3, 50)
def vaswani_table3_c_layers4(args) -> None:
    """Table 3 row C: 4 encoder and 4 decoder layers."""
    set_both_sides(args, "layers", 4)
    vaswani_base(args)


@table3_variant("C", "N 8", 4.88, 25.5, 80)
def vaswani_table3_c_layers8(args) -> None:
    """Table 3 row C: 8 encoder and 8 decoder layers."""
    set_both_sides(args, "layers", 8)
    vaswani_base(args)


@table3_variant("C", "d_model 256, d_k = d_v = 32", 5.75, 24.5, 28)
def vaswani_table3_c_dmodel256(args) -> None:
    """Table 3 row C: d_model 256 (8 heads of 32), d_ff stays 2048."""
    set_both_sides(args, "embed_dim", 256)
    vaswani_base(args)


@table3_variant("C", "d_model 1024, d_k = d_v = 128", 4.66, 26.0, 168)
def vaswani_table3_c_dmodel1024(args) -> None:
    """Table 3 row C: d_model 1024 (8 heads of 128), d_ff stays 2048."""
    set_both_sides(args, "embed_dim", 1024)
    vaswani_base(args)


@table3_variant("C", "d_ff 1024", 5.12, 25.4, 53)
def vaswani_table3_c_dff1024(args) -> None:
    """Table 3 row C: inner feed-forward size 1024."""
    set_both_sides(args, "ffn_embed_dim", 1024)
    vaswani_base(args)


@table3_variant("C", "d_ff 4096", 4.75, 26.2, 90)
def vaswani_table3_c_dff4096(args) -> None:
    """Table 3 row C: inner feed-forward size 4096."""
    set_both_sides(args, "ffn_embed_dim", 4096)
    vaswani_base(args)


# -- row D: regularization ------------------------------------------------------------------------


@table3_variant("D", "P_drop 0.0", 5.77, 24.6)
def vaswani_table3_d_dropout0_0(args) -> None:
    """Table 3 row D: no residual or embedding dropout (§5.4)."""
    set_default(args, "dropout", 0.0)
    vaswani_base(args)


@table3_variant("D", "P_drop 0.2", 4.95, 25.5)
def vaswani_table3_d_dropout0_2(args) -> None:
    """Table 3 row D: residual and embedding dropout 0.2 (§5.4)."""
    set_default(args, "dropout", 0.2)
    vaswani_base(args)


@table3_variant("D", "ε_ls 0.0", 4.67, 25.3, label_smoothing=0.0)
def vaswani_table3_d_ls0_0(args) -> None:
    """Table 3 row D: the base model trained with --label-smoothing 0.0 (criterion option)."""
    vaswani_base(args)


@table3_variant("D", "ε_ls 0.2", 5.47, 25.7, label_smoothing=0.2)
def vaswani_table3_d_ls0_2(args) -> None:
    """Table 3 row D: the base model trained with --label-smoothing 0.2 (criterion option)."""
    vaswani_base(args)


# -- row E: positional information ----------------------------------------------------------------


@table3_variant("E", "learned positional embedding instead of sinusoids", 4.92, 25.7)
def vaswani_table3_e_learned_pos(args) -> None:
    """Table 3 row E: learned positional embeddings in both stacks (§3.5)."""
    set_both_sides(args, "learned_pos", True)
    vaswani_base(args)


# -- big ------------------------------------------------------------------------------------------


@table3_variant("big", "N 6, d_model 1024, d_ff 4096, h 16, P_drop 0.3, 300k steps", 4.33, 26.4,
                213, train_steps=BIG_TRAIN_STEPS)
def vaswani_table3_big(args) -> None:
    """Table 3 big: the big model (same as ``vaswani_big``)."""
    vaswani_big(args)
