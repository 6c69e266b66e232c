"""Configuration of the ``vaswani_transformer`` model.

Option names are those of fairseq's built-in ``transformer`` (``--encoder-embed-dim``,
``--share-all-embeddings``...), so a command line moves between ``--arch transformer`` and
``--arch vaswani_base`` unchanged. Defaults are the paper's base model (§3, Table 3 "base").

Registering the model with this dataclass (rather than argparse) means checkpoints store the
configuration as plain containers, which load under torch's ``weights_only`` safe loading.
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from fairseq import utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

ActivationChoice = ChoiceEnum(utils.get_available_activation_fns())


@dataclass
class VaswaniTransformerConfig(FairseqDataclass):
    activation_fn: ActivationChoice = field(  # type: ignore[valid-type]
        default="relu", metadata={"help": "activation of the feed-forward network (§3.3: relu)"}
    )
    dropout: float = field(
        default=0.1, metadata={"help": "residual and embedding dropout P_drop (§5.4)"}
    )
    attention_dropout: float = field(
        default=0.0, metadata={"help": "dropout on attention probabilities (not in the paper)"}
    )
    activation_dropout: float = field(
        default=0.0, metadata={"help": "dropout after the FFN activation (not in the paper)"}
    )
    encoder_embed_dim: int = field(default=512, metadata={"help": "d_model of the encoder"})
    encoder_ffn_embed_dim: int = field(default=2048, metadata={"help": "d_ff of the encoder"})
    encoder_layers: int = field(default=6, metadata={"help": "N, encoder layers"})
    encoder_attention_heads: int = field(default=8, metadata={"help": "h, encoder heads"})
    encoder_normalize_before: bool = field(
        default=False, metadata={"help": "pre-norm encoder layers (the paper is post-norm)"}
    )
    encoder_learned_pos: bool = field(
        default=False, metadata={"help": "learned encoder positions (Table 3 row E)"}
    )
    decoder_embed_dim: int = field(default=512, metadata={"help": "d_model of the decoder"})
    decoder_ffn_embed_dim: int = field(default=2048, metadata={"help": "d_ff of the decoder"})
    decoder_layers: int = field(default=6, metadata={"help": "N, decoder layers"})
    decoder_attention_heads: int = field(default=8, metadata={"help": "h, decoder heads"})
    decoder_normalize_before: bool = field(
        default=False, metadata={"help": "pre-norm decoder layers (the paper is post-norm)"}
    )
    decoder_learned_pos: bool = field(
        default=False, metadata={"help": "learned decoder positions (Table 3 row E)"}
    )
    attention_key_dim: Optional[int] = field(
        default=None,
        metadata={"help": "d_k per head; default d_model / heads (set alone: Table 3 row B)"},
    )
    attention_value_dim: Optional[int] = field(
        default=None, metadata={"help": "d_v per head; default d_model / heads"}
    )
    share_decoder_input_output_embed: bool = field(
        default=False, metadata={"help": "tie the decoder embedding and pre-softmax weights"}
    )
    share_all_embeddings: bool = field(
        default=False,
        metadata={
            "help": "one weight matrix for both embeddings and the pre-softmax linear (§3.4); "
            "needs a joined dictionary"
        },
    )
    no_scale_embedding: bool = field(
        default=False, metadata={"help": "do not multiply embeddings by sqrt(d_model) (§3.4)"}
    )
    max_source_positions: int = field(
        default=1024, metadata={"help": "longest source sentence, in tokens"}
    )
    max_target_positions: int = field(
        default=1024, metadata={"help": "longest target sentence, in tokens"}
    )
    alignment_layer: Optional[int] = field(
        default=None,
        metadata={
            "help": "decoder layer whose encoder-decoder attention gives alignments "
            "(--print-alignment, --replace-unk); 0 = the bottom layer; default: the last"
        },
    )
    alignment_heads: Optional[int] = field(
        default=None,
        metadata={"help": "alignments average the first N heads of that layer; default: all"},
    )
    full_context_alignment: bool = field(
        default=False,
        metadata={
            "help": "alignments of a finished output from a pass without the causal mask "
            "(fairseq's transformer_align option)"
        },
    )


SIDES = ("encoder", "decoder")


@dataclass(frozen=True)
class StackConfig:
    """The options of one stack, encoder or decoder, without the side in their names.

    fairseq's option names carry the side (``--encoder-layers``, ``--decoder-layers``); the
    stacks and their layers are written once for both sides and read this view instead
    (:meth:`of`). ``cfg`` is the whole model configuration, for options of extensions.
    """

    side: str
    embed_dim: int
    ffn_embed_dim: int
    layers: int
    attention_heads: int
    normalize_before: bool
    learned_pos: bool
    max_positions: int
    dropout: float
    attention_dropout: float
    activation_dropout: float
    activation_fn: str
    key_dim: Optional[int]
    value_dim: Optional[int]
    scale_embedding: bool
    cfg: Any = field(repr=False, compare=False)

    @classmethod
    def of(cls, cfg, side: str) -> "StackConfig":
        """The ``side`` ("encoder" or "decoder") stack's options of the model config ``cfg``."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")

        def sided(name: str):
            return getattr(cfg, f"{side}_{name}")

        return cls(
            side=side,
            embed_dim=sided("embed_dim"),
            ffn_embed_dim=sided("ffn_embed_dim"),
            layers=sided("layers"),
            attention_heads=sided("attention_heads"),
            normalize_before=bool(sided("normalize_before")),
            learned_pos=bool(sided("learned_pos")),
            max_positions=getattr(cfg, "max_source_positions" if side == "encoder"
                                  else "max_target_positions"),
            dropout=cfg.dropout,
            attention_dropout=cfg.attention_dropout,
            activation_dropout=cfg.activation_dropout,
            activation_fn=str(cfg.activation_fn),
            key_dim=cfg.attention_key_dim,
            value_dim=cfg.attention_value_dim,
            scale_embedding=not cfg.no_scale_embedding,
            cfg=cfg,
        )

    def option(self, name: str) -> str:
        """The command-line option of this side's ``name``: ``--encoder-embed-dim``..."""
        return f"--{self.side}-{name.replace('_', '-')}"


def validate_config(cfg) -> None:
    """Refuse impossible options when the model is built, naming the option at fault."""

    def require(condition: bool, message: str) -> None:
        if not condition:
            raise ValueError(f"vaswani_transformer: {message}")

    for side in SIDES:
        stack = StackConfig.of(cfg, side)
        require(stack.layers >= 1,
                f"{stack.option('layers')} must be at least 1, got {stack.layers}")
        for name in ("embed_dim", "ffn_embed_dim", "attention_heads"):
            value = getattr(stack, name)
            require(value >= 1, f"{stack.option(name)} must be positive, got {value}")
        require(
            stack.embed_dim % stack.attention_heads == 0
            or (stack.key_dim is not None and stack.value_dim is not None),
            f"{stack.option('embed_dim')} {stack.embed_dim} is not divisible by "
            f"{stack.option('attention_heads')} {stack.attention_heads}; "
            "change one, or give --attention-key-dim and --attention-value-dim",
        )
    for name in ("dropout", "attention_dropout", "activation_dropout"):
        value = getattr(cfg, name)
        require(0.0 <= value < 1.0, f"--{name.replace('_', '-')} must be in [0, 1), got {value}")
    for name in ("attention_key_dim", "attention_value_dim"):
        value = getattr(cfg, name)
        require(
            value is None or value >= 1,
            f"--{name.replace('_', '-')} must be positive, got {value}",
        )
    for name in ("max_source_positions", "max_target_positions"):
        value = getattr(cfg, name)
        require(value >= 1, f"--{name.replace('_', '-')} must be positive, got {value}")
    layers, heads = cfg.decoder_layers, cfg.decoder_attention_heads
    alignment_layer = getattr(cfg, "alignment_layer", None)
    require(
        alignment_layer is None or 0 <= alignment_layer < layers,
        f"--alignment-layer must be in [0, {layers}) (--decoder-layers {layers}), "
        f"got {alignment_layer}",
    )
    alignment_heads = getattr(cfg, "alignment_heads", None)
    require(
        alignment_heads is None or 1 <= alignment_heads <= heads,
        f"--alignment-heads must be in [1, {heads}] (--decoder-attention-heads {heads}), "
        f"got {alignment_heads}",
    )
    if cfg.share_all_embeddings:
        require(
            cfg.encoder_embed_dim == cfg.decoder_embed_dim,
            "--share-all-embeddings needs --encoder-embed-dim == --decoder-embed-dim",
        )
