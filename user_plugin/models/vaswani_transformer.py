"""The ``vaswani_transformer`` model: the Transformer of *Attention Is All You Need* (Figure 1).

An encoder (:mod:`.encoder`) and an incremental decoder (:mod:`.decoder`) on fairseq's base
classes, so fairseq's trainer, checkpointing, distributed training, reduced-precision optimizers
and ``SequenceGenerator`` drive it unchanged.

Extending: subclass the model and override :meth:`build_encoder`, :meth:`build_decoder` or
:meth:`build_embedding`, or subclass the layers and override their ``build_*`` factories.
"""

from __future__ import annotations

from typing import Any

from fairseq.models import FairseqEncoderDecoderModel, register_model
from torch import Tensor, nn

from .decoder import VaswaniDecoder
from .encoder import VaswaniEncoder
from .transformer_config import VaswaniTransformerConfig, validate_config


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

    @classmethod
    def build_embedding(cls, dictionary, embed_dim: int) -> nn.Embedding:
        """Learned token embeddings (§3.4), N(0, d^-1/2) with a zero padding row."""
        embedding = nn.Embedding(len(dictionary), embed_dim, padding_idx=dictionary.pad())
        nn.init.normal_(embedding.weight, mean=0.0, std=embed_dim**-0.5)
        nn.init.zeros_(embedding.weight[dictionary.pad()])
        return embedding

    @classmethod
    def build_encoder(cls, cfg, dictionary, embed_tokens: nn.Embedding) -> VaswaniEncoder:
        return VaswaniEncoder(cfg, dictionary, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, dictionary, embed_tokens: nn.Embedding) -> VaswaniDecoder:
        return VaswaniDecoder(cfg, dictionary, embed_tokens)

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
