"""The paper's parsing model (§6.3, Table 4) as an architecture of ``vaswani_transformer``.

For English constituency parsing the paper trains "a 4-layer transformer with d_model = 1024"
on the WSJ part of the Penn Treebank; everything else is the base model of Table 3 (d_ff 2048,
h 8 heads, so d_k = d_v = 128, P_drop 0.1). Only dropout, the learning rate and the beam size
were tuned (on section 22): ``--dropout`` and ``--lr-scale`` (of ``vaswani_inverse_sqrt``) given
on the command line win over the defaults here, as for every architecture. Nothing in the model
is parser-specific: source words and target brackets are two vocabularies, so the recipe ties
only the decoder's input and output embeddings (``--share-decoder-input-output-embed``).
"""

from fairseq.models import register_model_architecture

from .architectures import MODEL_NAME, set_both_sides, vaswani_base

PARSING_LAYERS = 4
PARSING_D_MODEL = 1024


@register_model_architecture(MODEL_NAME, "vaswani_parsing_wsj")
def vaswani_parsing_wsj(args) -> None:
    """§6.3: N 4, d_model 1024; otherwise the base model (d_ff 2048, h 8, P_drop 0.1)."""
    set_both_sides(args, "layers", PARSING_LAYERS)
    set_both_sides(args, "embed_dim", PARSING_D_MODEL)
    vaswani_base(args)
