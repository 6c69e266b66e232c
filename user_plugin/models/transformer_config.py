"""Configuration of the ``vaswani_transformer`` model.

Option names are those of fairseq's built-in ``transformer`` (``--encoder-embed-dim``,
``--share-all-embeddings``...), so a command line moves between ``--arch transformer`` and
``--arch vaswani_base`` unchanged. Defaults are the paper's base model (§3, Table 3 "base").

Every model option of fairseq's ``transformer`` is accepted under its name. Most keep fairseq's
meaning (LayerDrop, activation checkpointing, cross+self-attention, ...); the few this model does
not implement are listed in :data:`UNSUPPORTED_OPTIONS` with the reason, and refused when the
model is built if set to anything but their default.

Registering the model with this dataclass (rather than argparse) means checkpoints store the
configuration as plain containers, which load under torch's ``weights_only`` safe loading.
"""

import contextlib
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Dict, List, Optional

from fairseq import utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import OmegaConf, open_dict

from ..files.errors import InvalidValue
from ..paper import DROPOUT

ActivationChoice = ChoiceEnum(utils.get_available_activation_fns())

# fairseq's default: layers smaller than this are not wrapped on their own by FSDP
DEFAULT_MIN_PARAMS_TO_WRAP = int(1e8)


# option (field name) -> why this model refuses it when it is not at its default
UNSUPPORTED_OPTIONS: Dict[str, str] = {
    "adaptive_input": (
        "adaptive input embeddings need cutoffs that only fairseq's transformer_lm defines "
        "(--adaptive-input-cutoff); fairseq's transformer ignores the flag"
    ),
    "tie_adaptive_weights": (
        "it ties the adaptive softmax to adaptive input embeddings, which this model does not "
        "build (fairseq's transformer fails on it with --adaptive-softmax-cutoff)"
    ),
    "tie_adaptive_proj": "it only applies together with --tie-adaptive-weights",
    "merge_src_tgt_embed": (
        "merging the dictionaries at model build renumbers target words that fairseq-preprocess "
        "already binarized with the target dictionary; binarize with --joined-dictionary and use "
        "--share-all-embeddings"
    ),
    "char_inputs": "character inputs are a deprecated field that fairseq's transformer ignores",
    "encoder_xformers_att_config": "xFormers attention needs the xformers package, not shipped",
    "decoder_xformers_att_config": "xFormers attention needs the xformers package, not shipped",
    "base_layers": (
        "BASE layers (Lewis et al. 2021) route tokens between workers with torch.distributed "
        "all-to-all, so they neither train nor decode in a single process"
    ),
    "base_sublayers": "it only applies together with --base-layers",
    "base_shuffle": "it only applies together with --base-layers",
}


def _refused(name: str) -> Dict[str, str]:
    """Help of an option accepted by name and refused unless at its default."""
    return {"help": f"not supported: {UNSUPPORTED_OPTIONS[name]}"}


@dataclass
class VaswaniTransformerConfig(FairseqDataclass):
    activation_fn: ActivationChoice = field(  # type: ignore[valid-type]
        default="relu", metadata={"help": "activation of the feed-forward network (§3.3: relu)"}
    )
    dropout: float = field(
        default=DROPOUT, metadata={"help": "residual and embedding dropout P_drop (§5.4)"}
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
    # -- options of fairseq's transformer beyond the paper, with fairseq's meaning -------------
    relu_dropout: float = field(
        default=0.0,
        metadata={"help": "fairseq's older name of --activation-dropout, used when that is 0"},
    )
    encoder_embed_path: Optional[str] = field(
        default=None, metadata={"help": "pre-trained encoder embeddings (word2vec text format)"}
    )
    decoder_embed_path: Optional[str] = field(
        default=None, metadata={"help": "pre-trained decoder embeddings (word2vec text format)"}
    )
    no_token_positional_embeddings: bool = field(
        default=False, metadata={"help": "add no positional encoding to the embeddings"}
    )
    layernorm_embedding: bool = field(
        default=False, metadata={"help": "LayerNorm on the embeddings (after positions, "
                                         "before dropout)"}
    )
    no_decoder_final_norm: bool = field(
        default=False, metadata={"help": "no LayerNorm after the last pre-norm decoder layer"}
    )
    decoder_output_dim: Optional[int] = field(
        default=None,
        metadata={"help": "width of the decoder output (a linear map from d_model when it "
                          "differs; default d_model)"},
    )
    encoder_layerdrop: float = field(
        default=0.0, metadata={"help": "LayerDrop probability of encoder layers (training only)"}
    )
    decoder_layerdrop: float = field(
        default=0.0, metadata={"help": "LayerDrop probability of decoder layers (training only)"}
    )
    encoder_layers_to_keep: Optional[str] = field(
        default=None,
        metadata={"help": "encoder layers to keep, e.g. '0,2,4': prunes a checkpoint when "
                          "loaded (LayerDrop)"},
    )
    decoder_layers_to_keep: Optional[str] = field(
        default=None,
        metadata={"help": "decoder layers to keep, e.g. '0,2,4': prunes a checkpoint when "
                          "loaded (LayerDrop)"},
    )
    no_cross_attention: bool = field(
        default=False, metadata={"help": "decoder layers without encoder-decoder attention"}
    )
    cross_self_attention: bool = field(
        default=False,
        metadata={"help": "decoder self-attention over the encoder output and the target "
                          "prefix together (Peitz et al. 2019)"},
    )
    checkpoint_activations: bool = field(
        default=False,
        metadata={"help": "recompute each layer's activations in the backward pass (less "
                          "memory, more compute)"},
    )
    offload_activations: bool = field(
        default=False,
        metadata={"help": "as --checkpoint-activations, keeping the layer inputs on the CPU; "
                          "sets --checkpoint-activations"},
    )
    compile_layers: bool = field(
        default=False,
        metadata={"help": "while training, run each layer through torch.compile (fused "
                          "kernels, fewer launches on a GPU; dropout draws other masks); "
                          "pair with --required-seq-len-multiple 8 to keep shapes few"},
    )
    min_params_to_wrap: int = field(
        default=DEFAULT_MIN_PARAMS_TO_WRAP,
        metadata={"help": "with --ddp-backend fully_sharded, wrap layers of at least this many "
                          "parameters in FSDP (0 with activation checkpointing)"},
    )
    export: bool = field(
        default=False,
        metadata={"help": "TorchScript-exportable LayerNorms (ours always are: torch's own)"},
    )
    quant_noise_pq: float = field(
        default=0.0,
        metadata={"help": "quantization noise (iterative PQ) on the layers' linear weights "
                          "while training"},
    )
    quant_noise_pq_block_size: int = field(
        default=8, metadata={"help": "block size of --quant-noise-pq"}
    )
    quant_noise_scalar: float = field(
        default=0.0,
        metadata={"help": "scalar quantization noise (fairseq's task quantizes the model)"},
    )
    adaptive_softmax_cutoff: Optional[List[int]] = field(
        default=None,
        metadata={"help": "adaptive softmax output layer with these cutoffs, e.g. '10000,20000'"},
    )
    adaptive_softmax_dropout: float = field(
        default=0.0, metadata={"help": "dropout of the adaptive softmax tail projections"}
    )
    adaptive_softmax_factor: float = field(
        default=4, metadata={"help": "width divisor of each adaptive softmax tail cluster"}
    )
    # -- alignments (--print-alignment, --replace-unk), as fairseq's transformer_align --------
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
    # -- accepted by name, refused unless at their default (UNSUPPORTED_OPTIONS) ---------------
    adaptive_input: bool = field(default=False, metadata=_refused("adaptive_input"))
    tie_adaptive_weights: bool = field(default=False, metadata=_refused("tie_adaptive_weights"))
    tie_adaptive_proj: bool = field(default=False, metadata=_refused("tie_adaptive_proj"))
    merge_src_tgt_embed: bool = field(default=False, metadata=_refused("merge_src_tgt_embed"))
    char_inputs: bool = field(default=False, metadata=_refused("char_inputs"))
    encoder_xformers_att_config: Optional[str] = field(
        default=None, metadata=_refused("encoder_xformers_att_config")
    )
    decoder_xformers_att_config: Optional[str] = field(
        default=None, metadata=_refused("decoder_xformers_att_config")
    )
    base_layers: Optional[int] = field(default=0, metadata=_refused("base_layers"))
    base_sublayers: Optional[int] = field(default=1, metadata=_refused("base_sublayers"))
    base_shuffle: Optional[int] = field(default=1, metadata=_refused("base_shuffle"))


SIDES = ("encoder", "decoder")


@dataclass(frozen=True)
class StackConfig:
    """The options of one stack, encoder or decoder, without the side in their names.

    fairseq's option names carry the side (``--encoder-layers``, ``--decoder-layers``); the
    stacks and their layers are written once for both sides and read this view instead
    (:meth:`of`). ``cfg`` is the whole model configuration, for options of extensions.
    The fields after ``cfg`` are fairseq's options beyond the paper; their defaults are "off".
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
    token_positions: bool = True  # add the positional encoding (§3.5)
    layernorm_embedding: bool = False  # LayerNorm on the embeddings
    final_norm: bool = True  # a pre-norm stack ends with a LayerNorm
    output_dim: Optional[int] = None  # decoder: width of its output features (None: d_model)
    layerdrop: float = 0.0  # LayerDrop probability of each layer while training
    checkpoint_activations: bool = False  # recompute each layer in the backward pass
    offload_activations: bool = False  # ... keeping the layer inputs on the CPU
    min_params_to_wrap: int = DEFAULT_MIN_PARAMS_TO_WRAP  # FSDP wrapping threshold
    quant_noise_pq: float = 0.0  # Quant-Noise rate on the layers' linear weights
    quant_noise_pq_block_size: int = 8
    compile_layers: bool = False  # training runs each layer through torch.compile
    cross_attention: bool = True  # decoder layers have encoder-decoder attention (§3.2.3)
    cross_self_attention: bool = False  # decoder self-attention sees the encoder output too

    @classmethod
    def of(cls, cfg, side: str) -> "StackConfig":
        """The ``side`` ("encoder" or "decoder") stack's options of the model config ``cfg``."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")

        def sided(name: str):
            return getattr(cfg, f"{side}_{name}")

        decoder = side == "decoder"
        offload = bool(cfg.offload_activations)
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
            # fairseq reads --relu-dropout when --activation-dropout is 0
            activation_dropout=cfg.activation_dropout or cfg.relu_dropout or 0.0,
            activation_fn=str(cfg.activation_fn),
            key_dim=cfg.attention_key_dim,
            value_dim=cfg.attention_value_dim,
            scale_embedding=not cfg.no_scale_embedding,
            cfg=cfg,
            token_positions=not cfg.no_token_positional_embeddings,
            layernorm_embedding=bool(cfg.layernorm_embedding),
            final_norm=not (decoder and cfg.no_decoder_final_norm),
            output_dim=(cfg.decoder_output_dim or None) if decoder else None,
            layerdrop=float(sided("layerdrop") or 0.0),
            checkpoint_activations=bool(cfg.checkpoint_activations) or offload,  # as fairseq
            offload_activations=offload,
            min_params_to_wrap=cfg.min_params_to_wrap,
            quant_noise_pq=float(cfg.quant_noise_pq or 0.0),
            quant_noise_pq_block_size=cfg.quant_noise_pq_block_size,
            compile_layers=bool(getattr(cfg, "compile_layers", False)),
            cross_attention=not cfg.no_cross_attention,
            cross_self_attention=decoder and bool(cfg.cross_self_attention),
        )

    def option(self, name: str) -> str:
        """The command-line option of this side's ``name``: ``--encoder-embed-dim``..."""
        return f"--{self.side}-{name.replace('_', '-')}"

    @property
    def features_dim(self) -> int:
        """Width of the stack's output: ``output_dim`` (``--decoder-output-dim``) or d_model."""
        return self.output_dim or self.embed_dim


def complete_config(cfg) -> None:
    """Give every option missing from ``cfg`` its default (in place).

    A checkpoint stores the options the model had when it was trained; one written before an
    option existed lacks it, and must load as the model it was.
    """
    missing = [f for f in fields(VaswaniTransformerConfig)
               if not f.name.startswith("_") and not _has(cfg, f.name)]
    if not missing:
        return
    context = open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.nullcontext()
    with context:
        for f in missing:
            default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
            setattr(cfg, f.name, default)


def _has(cfg, name: str) -> bool:
    """Whether ``cfg`` (a dataclass, namespace or omegaconf container) holds ``name``."""
    if OmegaConf.is_config(cfg):
        return name in cfg
    return hasattr(cfg, name)


def validate_config(cfg) -> None:
    """Refuse impossible options when the model is built, naming the option at fault."""

    def require(condition: bool, message: str) -> None:
        if not condition:
            raise InvalidValue(f"vaswani_transformer: {message}")

    defaults = {f.name: f.default for f in fields(VaswaniTransformerConfig)}
    for name, reason in UNSUPPORTED_OPTIONS.items():
        value = getattr(cfg, name)
        require(value == defaults[name] or (value in (None, "") and not defaults[name]),
                f"--{name.replace('_', '-')} is not supported: {reason}")

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
        require(0.0 <= stack.layerdrop < 1.0,
                f"{stack.option('layerdrop')} must be in [0, 1), got {stack.layerdrop}")
        if stack.quant_noise_pq > 0:
            block = stack.quant_noise_pq_block_size
            value_width = stack.attention_heads * (stack.value_dim
                                                   or stack.embed_dim // stack.attention_heads)
            for width, what in ((stack.embed_dim, stack.option("embed_dim")),
                                (stack.ffn_embed_dim, stack.option("ffn_embed_dim")),
                                (value_width, "heads x d_v")):
                require(block >= 1 and width % block == 0,
                        f"--quant-noise-pq-block-size {block} must divide {what} ({width})")
    for name in ("dropout", "attention_dropout", "activation_dropout", "relu_dropout",
                 "quant_noise_pq", "quant_noise_scalar", "adaptive_softmax_dropout"):
        value = getattr(cfg, name)
        require(0.0 <= value < 1.0, f"--{name.replace('_', '-')} must be in [0, 1), got {value}")
    for name in ("attention_key_dim", "attention_value_dim", "decoder_output_dim"):
        value = getattr(cfg, name)
        require(
            value is None or value >= 1,
            f"--{name.replace('_', '-')} must be positive, got {value}",
        )
    for name in ("max_source_positions", "max_target_positions"):
        value = getattr(cfg, name)
        require(value >= 1, f"--{name.replace('_', '-')} must be positive, got {value}")
    require(cfg.min_params_to_wrap >= 0,
            f"--min-params-to-wrap must not be negative, got {cfg.min_params_to_wrap}")
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
        require(
            not cfg.decoder_embed_path or cfg.decoder_embed_path == cfg.encoder_embed_path,
            "--share-all-embeddings takes its embeddings from --encoder-embed-path; "
            "--decoder-embed-path must be the same file or unset",
        )
    if cfg.cross_self_attention:
        require(
            cfg.encoder_embed_dim == cfg.decoder_embed_dim,
            "--cross-self-attention projects encoder outputs and decoder states alike: it "
            "needs --encoder-embed-dim == --decoder-embed-dim",
        )
    adaptive = cfg.adaptive_softmax_cutoff
    if adaptive is not None:
        cutoff = list(utils.eval_str_list(adaptive, type=int))
        require(len(cutoff) >= 1 and cutoff[0] >= 1
                and all(a < b for a, b in zip(cutoff, cutoff[1:])),
                f"--adaptive-softmax-cutoff must be increasing positive sizes, got {adaptive}")
        require(cfg.adaptive_softmax_factor > 0,
                f"--adaptive-softmax-factor must be positive, got {cfg.adaptive_softmax_factor}")
    output_dim = cfg.decoder_output_dim or cfg.decoder_embed_dim
    if output_dim != cfg.decoder_embed_dim and adaptive is None:
        require(
            not (cfg.share_all_embeddings or cfg.share_decoder_input_output_embed),
            f"--decoder-output-dim {output_dim} differs from --decoder-embed-dim "
            f"{cfg.decoder_embed_dim}, so the output layer cannot share the embedding matrix "
            "(--share-all-embeddings / --share-decoder-input-output-embed)",
        )
