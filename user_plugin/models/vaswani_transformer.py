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
"""

from __future__ import annotations

from typing import Any

from fairseq.models import FairseqEncoderDecoderModel, register_model
from torch import Tensor, nn

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
        **unused: Any,
    ):
        """Teacher-forced forward pass: logits [B, T, V] and extra outputs."""
        encoder_out = self.encoder(
            src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens
        )
        return self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
            need_attn=need_attn,
        )
