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

The table is data: :data:`ROWS` holds one :class:`Table3Row` per architecture (the model options
it sets before the base model's defaults fill in the rest), and one loop registers them.
"""

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

from fairseq.models import register_model_architecture

from ..paper import BASE_TRAIN_STEPS, BIG_TRAIN_STEPS, LABEL_SMOOTHING
from .architectures import MODEL_NAME, SIDES, set_default, vaswani_base, vaswani_big

logger = logging.getLogger(__name__)

BASE_LABEL_SMOOTHING = LABEL_SMOOTHING

Options = Tuple[Tuple[str, Any], ...]


def both(name: str, value: Any) -> Options:
    """``encoder_<name>`` and ``decoder_<name>`` set to ``value``."""
    return tuple((f"{side}_{name}", value) for side in SIDES)


@dataclass(frozen=True)
class Table3Row:
    """One row of Table 3: what changes from the base model and what the paper measured.

    ``options`` are the model options the architecture sets (unless given on the command line)
    before ``defaults`` (``vaswani_base`` or ``vaswani_big``) fills in the rest.
    """

    arch: str
    row: str
    change: str
    paper_ppl: float
    paper_bleu: float
    paper_params_millions: float | None
    label_smoothing: float = BASE_LABEL_SMOOTHING
    train_steps: int = BASE_TRAIN_STEPS
    options: Options = ()
    defaults: Callable[[Any], None] = vaswani_base


_BASE_CHANGE = "none: N 6, d_model 512, d_ff 2048, h 8, d_k = d_v = 64, P_drop 0.1, ε_ls 0.1"
_BIG_CHANGE = "N 6, d_model 1024, d_ff 4096, h 16, P_drop 0.3, 300k steps"

#: Table 3, in the paper's order: (name, row, change, newstest2013 PPL, BLEU, params in millions),
#: then what differs from the base model's training (ε_ls, steps) and the model options set.
ROWS: Tuple[Table3Row, ...] = (
    Table3Row("vaswani_table3_base", "base", _BASE_CHANGE, 4.92, 25.8, 65),
    # A: number of heads at constant computation (d_k = d_v = d_model / h)
    Table3Row("vaswani_table3_a_heads1_dk512", "A", "h 1, d_k = d_v = 512", 5.29, 24.9, None,
              options=both("attention_heads", 1)),
    Table3Row("vaswani_table3_a_heads4_dk128", "A", "h 4, d_k = d_v = 128", 5.00, 25.5, None,
              options=both("attention_heads", 4)),
    Table3Row("vaswani_table3_a_heads16_dk32", "A", "h 16, d_k = d_v = 32", 4.91, 25.8, None,
              options=both("attention_heads", 16)),
    Table3Row("vaswani_table3_a_heads32_dk16", "A", "h 32, d_k = d_v = 16", 5.01, 25.4, None,
              options=both("attention_heads", 32)),
    # B: the attention key size alone; values stay d_model / h = 64
    Table3Row("vaswani_table3_b_dk16", "B", "d_k 16", 5.16, 25.1, 58,
              options=(("attention_key_dim", 16),)),
    Table3Row("vaswani_table3_b_dk32", "B", "d_k 32", 5.01, 25.4, 60,
              options=(("attention_key_dim", 32),)),
    # C: model size (d_ff stays 2048 when d_model changes)
    Table3Row("vaswani_table3_c_layers2", "C", "N 2", 6.11, 23.7, 36, options=both("layers", 2)),
    Table3Row("vaswani_table3_c_layers4", "C", "N 4", 5.19, 25.3, 50, options=both("layers", 4)),
    Table3Row("vaswani_table3_c_layers8", "C", "N 8", 4.88, 25.5, 80, options=both("layers", 8)),
    Table3Row("vaswani_table3_c_dmodel256", "C", "d_model 256, d_k = d_v = 32", 5.75, 24.5, 28,
              options=both("embed_dim", 256)),
    Table3Row("vaswani_table3_c_dmodel1024", "C", "d_model 1024, d_k = d_v = 128", 4.66, 26.0,
              168, options=both("embed_dim", 1024)),
    Table3Row("vaswani_table3_c_dff1024", "C", "d_ff 1024", 5.12, 25.4, 53,
              options=both("ffn_embed_dim", 1024)),
    Table3Row("vaswani_table3_c_dff4096", "C", "d_ff 4096", 4.75, 26.2, 90,
              options=both("ffn_embed_dim", 4096)),
    # D: regularization: residual and embedding dropout (§5.4), label smoothing (criterion)
    Table3Row("vaswani_table3_d_dropout0_0", "D", "P_drop 0.0", 5.77, 24.6, None,
              options=(("dropout", 0.0),)),
    Table3Row("vaswani_table3_d_dropout0_2", "D", "P_drop 0.2", 4.95, 25.5, None,
              options=(("dropout", 0.2),)),
    Table3Row("vaswani_table3_d_ls0_0", "D", "ε_ls 0.0", 4.67, 25.3, None, label_smoothing=0.0),
    Table3Row("vaswani_table3_d_ls0_2", "D", "ε_ls 0.2", 5.47, 25.7, None, label_smoothing=0.2),
    # E: positional information (§3.5)
    Table3Row("vaswani_table3_e_learned_pos", "E",
              "learned positional embedding instead of sinusoids", 4.92, 25.7, None,
              options=both("learned_pos", True)),
    Table3Row("vaswani_table3_big", "big", _BIG_CHANGE, 4.33, 26.4, 213,
              train_steps=BIG_TRAIN_STEPS, defaults=vaswani_big),
)

TABLE3: Dict[str, Table3Row] = {row.arch: row for row in ROWS}
"""Architecture name -> its Table 3 row, in the table's order."""


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


def architecture(entry: Table3Row) -> Callable[[Any], None]:
    """The architecture function of ``entry``: its options unless given, then the defaults of
    its base or big model; a warning when fairseq-train runs it with another ε_ls."""

    def arch_fn(args) -> None:
        for name, value in entry.options:
            set_default(args, name, value)
        entry.defaults(args)
        _check_label_smoothing(args, entry)

    arch_fn.__name__ = entry.arch
    arch_fn.__doc__ = f"Table 3 row {entry.row}: {entry.change}."
    return arch_fn


for _entry in ROWS:
    register_model_architecture(MODEL_NAME, _entry.arch)(architecture(_entry))
