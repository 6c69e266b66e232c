"""Configuration of the ``vaswani_transformer`` model.

Option names are those of fairseq's built-in ``transformer`` (``--encoder-embed-dim``,
``--share-all-embeddings``...), so a command line moves between ``--arch transformer`` and
``--arch vaswani_base`` unchanged. Defaults are the paper's base model (§3, Table 3 "base").

Registering the model with this dataclass (rather than argparse) means checkpoints store the
configuration as plain containers, which load under torch's ``weights_only`` safe loading.
"""

from dataclasses import dataclass, field
from typing import Optional

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


def validate_config(cfg) -> None:
    """Refuse impossible options when the model is built, naming the option at fault."""

    def require(condition: bool, message: str) -> None:
        if not condition:
            raise ValueError(f"vaswani_transformer: {message}")

    for side in ("encoder", "decoder"):
        layers = getattr(cfg, f"{side}_layers")
        require(layers >= 1, f"--{side}-layers must be at least 1, got {layers}")
        for name in ("embed_dim", "ffn_embed_dim", "attention_heads"):
            value = getattr(cfg, f"{side}_{name}")
            require(value >= 1, f"--{side}-{name.replace('_', '-')} must be positive, got {value}")
        dim, heads = getattr(cfg, f"{side}_embed_dim"), getattr(cfg, f"{side}_attention_heads")
        require(
            dim % heads == 0
            or (cfg.attention_key_dim is not None and cfg.attention_value_dim is not None),
            f"--{side}-embed-dim {dim} is not divisible by --{side}-attention-heads {heads}; "
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
    if cfg.share_all_embeddings:
        require(
            cfg.encoder_embed_dim == cfg.decoder_embed_dim,
            "--share-all-embeddings needs --encoder-embed-dim == --decoder-embed-dim",
        )
