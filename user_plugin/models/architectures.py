"""Named architectures of ``vaswani_transformer`` (paper Table 3, §5.4).

Each architecture fills in the options the user did not give on the command line. A user can
register more the same way in their own ``--user-dir`` (see the README's extension guide)::

    @register_model_architecture("vaswani_transformer", "my_arch")
    def my_arch(args):
        set_default(args, "encoder_layers", 12)
        vaswani_base(args)

The helpers below are public: :func:`set_default` fills one option the user did not give,
:func:`set_both_sides` one option of both stacks, :func:`set_dims` a model's sizes.
"""

from __future__ import annotations

from fairseq.models import register_model_architecture

# Architectures attach to a registered model: importing the model module registers it first.
from ..paper import BIG_DROPOUT, DROPOUT
from .vaswani_transformer import VaswaniTransformerModel  # noqa: F401

MODEL_NAME = "vaswani_transformer"


SIDES = ("encoder", "decoder")


def set_default(args, name: str, value) -> None:
    """Set ``args.name`` unless the user gave it (fairseq leaves options not given out of the
    namespace it hands an architecture, or sets them to None)."""
    if getattr(args, name, None) is None:
        setattr(args, name, value)


def set_both_sides(args, name: str, value) -> None:
    """Default ``encoder_<name>`` and ``decoder_<name>`` to ``value`` unless the user set them."""
    for side in SIDES:
        set_default(args, f"{side}_{name}", value)


def set_dims(
    args,
    *,
    layers: int,
    embed_dim: int,
    ffn_dim: int,
    heads: int,
    dropout: float,
) -> None:
    """Fill encoder and decoder sizes symmetrically (the paper uses equal stacks)."""
    set_both_sides(args, "layers", layers)
    set_both_sides(args, "embed_dim", embed_dim)
    set_both_sides(args, "ffn_embed_dim", ffn_dim)
    set_both_sides(args, "attention_heads", heads)
    set_default(args, "dropout", dropout)


@register_model_architecture(MODEL_NAME, "vaswani_base")
def vaswani_base(args) -> None:
    """Base model (Table 3): N 6, d_model 512, d_ff 2048, h 8, d_k = d_v = 64, P_drop 0.1."""
    set_dims(args, layers=6, embed_dim=512, ffn_dim=2048, heads=8, dropout=DROPOUT)


@register_model_architecture(MODEL_NAME, "vaswani_big")
def vaswani_big(args) -> None:
    """Big model (Table 3): d_model 1024, d_ff 4096, h 16, P_drop 0.3 (EN-DE)."""
    set_dims(args, layers=6, embed_dim=1024, ffn_dim=4096, heads=16, dropout=BIG_DROPOUT)


@register_model_architecture(MODEL_NAME, "vaswani_big_en_fr")
def vaswani_big_en_fr(args) -> None:
    """Big model for EN-FR: as ``vaswani_big`` with P_drop 0.1 (§5.4)."""
    set_default(args, "dropout", DROPOUT)
    vaswani_big(args)
