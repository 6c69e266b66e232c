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

import os
from typing import Any, Dict, Optional

from fairseq import utils
from fairseq.models import FairseqEncoderDecoderModel, register_model
from torch import Tensor, nn

from ..modules.attention import MultiHeadAttention
from ..modules.cross_self_attention import CrossSelfAttention
from ..modules.decoder_layer import DecoderLayer
from ..modules.encoder_layer import EncoderLayer
from ..modules.feed_forward import PositionWiseFeedForward
from ..modules.positional_encoding import build_positional_encoding
from .decoder import VaswaniDecoder
from .encoder import VaswaniEncoder
from .layer_pruning import keep_whole_or_pruned_sides, prune_to_kept_layers
from .transformer_config import (
    StackConfig,
    VaswaniTransformerConfig,
    complete_config,
    validate_config,
)


@register_model("vaswani_transformer", dataclass=VaswaniTransformerConfig)
class VaswaniTransformerModel(FairseqEncoderDecoderModel):
    def __init__(self, cfg, encoder: VaswaniEncoder, decoder: VaswaniDecoder) -> None:
        super().__init__(encoder, decoder)
        self.cfg = cfg

    @classmethod
    def build_model(cls, cfg, task) -> "VaswaniTransformerModel":
        """Build the model of ``cfg`` for ``task``'s dictionaries.

        Options missing from ``cfg`` (a checkpoint older than them) take their defaults;
        ``--{encoder,decoder}-layers-to-keep`` sets the number of layers, and fairseq's loader
        then prunes the checkpoint's layers to those kept (``prune_state_dict``).
        """
        complete_config(cfg)
        prune_to_kept_layers(cfg)
        validate_config(cfg)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        if cfg.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError(
                    "--share-all-embeddings needs a joined dictionary "
                    "(fairseq-preprocess --joined-dictionary)"
                )
            encoder_embed = cls.build_embedding(src_dict, cfg.encoder_embed_dim)
            load_pretrained_embedding(encoder_embed, src_dict, cfg.encoder_embed_path,
                                      "--encoder-embed-path")
            decoder_embed = encoder_embed
        else:
            encoder_embed = cls.build_embedding(src_dict, cfg.encoder_embed_dim)
            load_pretrained_embedding(encoder_embed, src_dict, cfg.encoder_embed_path,
                                      "--encoder-embed-path")
            decoder_embed = cls.build_embedding(tgt_dict, cfg.decoder_embed_dim)
            load_pretrained_embedding(decoder_embed, tgt_dict, cfg.decoder_embed_path,
                                      "--decoder-embed-path")
        encoder = cls.build_encoder(cfg, src_dict, encoder_embed)
        decoder = cls.build_decoder(cfg, tgt_dict, decoder_embed)
        return cls(cfg, encoder, decoder)

    def load_state_dict(self, state_dict, strict: bool = True, model_cfg=None, args=None):
        """Load ``state_dict``, pruning it to ``--{encoder,decoder}-layers-to-keep`` first
        (fairseq's ``prune_state_dict``, which reads ``model_cfg``).

        Two cases fairseq's pruning alone gets wrong are settled before it runs: a side whose
        checkpoint already holds only the kept layers (a pruned model resumed by the same
        command) is not pruned again, and a side without the option keeps all its layers
        (the pruning would otherwise drop them when only the other side names layers).
        """
        if model_cfg is not None:
            keep_whole_or_pruned_sides(state_dict, model_cfg)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg,
                                        args=args)

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
        return MultiHeadAttention(**attention_sizes(stack))

    @classmethod
    def build_encoder_attention(cls, stack: StackConfig) -> nn.Module:
        """The decoder's encoder-decoder attention (§3.2.3)."""
        return MultiHeadAttention(
            **attention_sizes(stack), encoder_decoder=True, kv_dim=stack.cfg.encoder_embed_dim
        )

    @classmethod
    def build_cross_self_attention(cls, stack: StackConfig) -> nn.Module:
        """The decoder's self-attention over the encoder output and its own prefix together,
        replacing masked self-attention under ``--cross-self-attention`` (Peitz et al. 2019)."""
        return CrossSelfAttention(**attention_sizes(stack))

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


def load_pretrained_embedding(
    embedding: nn.Embedding, dictionary, path: Optional[str], option: str
) -> None:
    """Copy the vectors of a word2vec-style text file (a header line, then ``word v1 v2 ...``)
    into the rows of the words ``dictionary`` knows (fairseq's ``--*-embed-path``); other rows
    keep their initialisation."""
    if not path:
        return
    if not os.path.isfile(path):
        raise FileNotFoundError(f"vaswani_transformer: {option}: no such file {path}")
    vectors = utils.parse_embedding(path)
    width = embedding.weight.size(1)
    for word, vector in vectors.items():
        if vector.numel() != width:
            raise ValueError(
                f"vaswani_transformer: {option} {path} holds {vector.numel()}-dimensional "
                f"vectors (word {word!r}), the embeddings are {width}-dimensional"
            )
    utils.load_embedding(vectors, dictionary, embedding)


def attention_sizes(stack: StackConfig) -> Dict[str, Any]:
    """The arguments every attention of ``stack`` is built with: d_model, h, d_k, d_v (§3.2.2)
    and the dropout on attention probabilities."""
    return dict(
        embed_dim=stack.embed_dim,
        num_heads=stack.attention_heads,
        key_dim=stack.key_dim,
        value_dim=stack.value_dim,
        dropout=stack.attention_dropout,
    )
