"""The ``vaswani_transformer`` model: the Transformer of *Attention Is All You Need* (Figure 1).

An encoder (:mod:`.encoder`) and an incremental decoder (:mod:`.decoder`) on fairseq's base
classes, so fairseq's trainer, checkpointing, distributed training, reduced-precision optimizers
and ``SequenceGenerator`` drive it unchanged.

Every part is made by one ``build_*`` class method of the model, in one place below. To swap a
block, subclass the model, override that one factory and register the subclass with an
architecture (docs/extending.md, ``examples/custom_ffn``)::

    @register_model("my_transformer", dataclass=VaswaniTransformerConfig)
    class MyTransformer(VaswaniTransformerModel):
        @classmethod
        def build_feed_forward(cls, stack):
            return MyFeedForward(stack.embed_dim, stack.ffn_embed_dim)

Decoding options that concern the model itself (docs/decoding.md) are applied by
:meth:`VaswaniTransformerModel.prepare_for_inference_`, which ``fairseq-generate``,
``fairseq-interactive`` and the hub call with the generation configuration before decoding:
alignments (``--print-alignment``, ``--replace-unk``) switch on the decoder's attention output,
and ``--retain-dropout`` keeps dropout active.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from fairseq.models import FairseqEncoderDecoderModel, register_model
from torch import Tensor, nn

from ..generation.alignment import alignment_requested, check_replace_unk
from ..modules.attention import MultiHeadAttention
from ..modules.decoder_layer import DecoderLayer
from ..modules.encoder_layer import EncoderLayer
from ..modules.feed_forward import PositionWiseFeedForward
from ..modules.positional_encoding import build_positional_encoding
from .decoder import VaswaniDecoder
from .encoder import VaswaniEncoder
from .transformer_config import StackConfig, VaswaniTransformerConfig, validate_config


@register_model("vaswani_transformer", dataclass=VaswaniTransformerConfig)
class VaswaniTransformerModel(FairseqEncoderDecoderModel):
    def __init__(self, cfg, encoder: VaswaniEncoder, decoder: VaswaniDecoder) -> None:
        super().__init__(encoder, decoder)
        self.cfg = cfg

    @classmethod
    def build_model(cls, cfg, task) -> "VaswaniTransformerModel":
        validate_config(cfg)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        if cfg.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError(
                    "--share-all-embeddings needs a joined dictionary "
                    "(fairseq-preprocess --joined-dictionary)"
                )
            encoder_embed = cls.build_embedding(src_dict, cfg.encoder_embed_dim)
            decoder_embed = encoder_embed
        else:
            encoder_embed = cls.build_embedding(src_dict, cfg.encoder_embed_dim)
            decoder_embed = cls.build_embedding(tgt_dict, cfg.decoder_embed_dim)
        encoder = cls.build_encoder(cfg, src_dict, encoder_embed)
        decoder = cls.build_decoder(cfg, tgt_dict, decoder_embed)
        return cls(cfg, encoder, decoder)

    # -- the stacks (§3.1) ----------------------------------------------------------------

    @classmethod
    def build_encoder(cls, cfg, dictionary, embed_tokens: nn.Embedding) -> VaswaniEncoder:
        return VaswaniEncoder(cfg, dictionary, embed_tokens, blocks=cls)

    @classmethod
    def build_decoder(cls, cfg, dictionary, embed_tokens: nn.Embedding) -> VaswaniDecoder:
        return VaswaniDecoder(cfg, dictionary, embed_tokens, blocks=cls)

    @classmethod
    def build_encoder_layer(cls, stack: StackConfig) -> nn.Module:
        """One encoder layer (§3.1): self-attention and feed-forward."""
        return EncoderLayer(stack, blocks=cls)

    @classmethod
    def build_decoder_layer(cls, stack: StackConfig) -> nn.Module:
        """One decoder layer (§3.1): masked self-attention, encoder-decoder attention and
        feed-forward."""
        return DecoderLayer(stack, blocks=cls)

    # -- the blocks (§3.2-§3.5); ``stack.side`` says which stack asks -------------------------

    @classmethod
    def build_embedding(cls, dictionary, embed_dim: int) -> nn.Embedding:
        """Learned token embeddings (§3.4), N(0, d^-1/2) with a zero padding row."""
        embedding = nn.Embedding(len(dictionary), embed_dim, padding_idx=dictionary.pad())
        nn.init.normal_(embedding.weight, mean=0.0, std=embed_dim**-0.5)
        nn.init.zeros_(embedding.weight[dictionary.pad()])
        return embedding

    @classmethod
    def build_positional_encoding(cls, stack: StackConfig) -> nn.Module:
        """Sinusoids (§3.5) or learned positions (Table 3 row E)."""
        return build_positional_encoding(stack.embed_dim, stack.max_positions, stack.learned_pos)

    @classmethod
    def build_self_attention(cls, stack: StackConfig) -> nn.Module:
        """Multi-head self-attention (§3.2.2); masked in the decoder (§3.2.3)."""
        return MultiHeadAttention(
            stack.embed_dim,
            stack.attention_heads,
            key_dim=stack.key_dim,
            value_dim=stack.value_dim,
            dropout=stack.attention_dropout,
        )

    @classmethod
    def build_encoder_attention(cls, stack: StackConfig) -> nn.Module:
        """The decoder's encoder-decoder attention (§3.2.3)."""
        return MultiHeadAttention(
            stack.embed_dim,
            stack.attention_heads,
            key_dim=stack.key_dim,
            value_dim=stack.value_dim,
            dropout=stack.attention_dropout,
            encoder_decoder=True,
            kv_dim=stack.cfg.encoder_embed_dim,
        )

    @classmethod
    def build_feed_forward(cls, stack: StackConfig) -> nn.Module:
        """The position-wise feed-forward network (§3.3)."""
        return PositionWiseFeedForward(
            stack.embed_dim,
            stack.ffn_embed_dim,
            activation_fn=stack.activation_fn,
            activation_dropout=stack.activation_dropout,
        )

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Tensor,
        prev_output_tokens: Tensor,
        return_all_hiddens: bool = False,
        features_only: bool = False,
        need_attn: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        **unused: Any,
    ):
        """Teacher-forced forward pass: logits [B, T, V] and extra outputs.

        ``extra["attn"][0]`` holds the alignment scores when attention is asked for
        (``need_attn``, or alignments switched on by :meth:`prepare_for_inference_`); with
        ``--full-context-alignment`` they come from a second pass without the causal mask, as
        in fairseq's ``transformer_align``.
        """
        encoder_out = self.encoder(
            src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens
        )
        aligned = dict(alignment_layer=alignment_layer, alignment_heads=alignment_heads)
        decoder_out = self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
            need_attn=need_attn,
            **aligned,
        )
        if self.full_context_alignment and decoder_out[1]["attn"][0] is not None:
            _, full_context = self.decoder(
                prev_output_tokens, encoder_out=encoder_out, features_only=True,
                need_attn=need_attn, full_context_alignment=True, **aligned,
            )
            decoder_out[1]["attn"] = full_context["attn"]
        return decoder_out

    @property
    def full_context_alignment(self) -> bool:
        """Alignments of finished outputs come from a full forward without the causal mask
        (fairseq's ``SequenceGeneratorWithAlignment`` then calls :meth:`forward`)."""
        return bool(getattr(self.cfg, "full_context_alignment", False))

    # -- decoding options -----------------------------------------------------------------

    def prepare_for_inference_(self, cfg) -> None:
        """fairseq's preparation (eval mode, no further training), then the decoding options
        that concern the model: alignments switch on the decoder's attention output, and
        ``--retain-dropout`` puts the modules that hold dropout back in training mode.
        ``--replace-unk`` that cannot be served (no alignments under fairseq's own task) is
        refused here, before any decoding."""
        check_replace_unk(cfg)
        super().prepare_for_inference_(cfg)
        generation = cfg.generation
        self.decoder.return_alignment = alignment_requested(generation)
        if getattr(generation, "retain_dropout", False):
            self.retain_dropout(getattr(generation, "retain_dropout_modules", None))

    def retain_dropout(self, module_names: Optional[Sequence[str]] = None) -> None:
        """Keep dropout active while decoding (fairseq's ``--retain-dropout``, for Monte-Carlo
        dropout): the modules of the model, or those whose class name is in
        ``module_names`` (``--retain-dropout-modules``: ``VaswaniEncoder``, ``VaswaniDecoder``
        for embedding dropout, ``AddAndNorm`` for residual dropout, ``MultiHeadAttention``,
        ``PositionWiseFeedForward``), are put in training mode. Dropout is the only thing
        that mode changes in these modules."""
        if isinstance(module_names, str):
            module_names = module_names.replace(",", " ").split()
        for module in self.modules():
            if module_names is None or type(module).__name__ in module_names:
                module.training = True
