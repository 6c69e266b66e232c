"""The ``vaswani_transformer`` model: the Transformer of *Attention Is All You Need* (Figure 1).

An encoder (:mod:`.encoder`) and an incremental decoder (:mod:`.decoder`) on fairseq's base
classes, so fairseq's trainer, checkpointing, distributed training, reduced-precision optimizers
and ``SequenceGenerator`` drive it unchanged.

The model builds its two stacks (``build_encoder``, ``build_decoder``); every part inside
them is made by one method of the model's ``blocks``, a :class:`~.blocks.TransformerBlocks`
handed down to the stacks and layers. To swap a block,
override that one method in a subclass of the blocks, and name it as the ``blocks`` of a model
registered with an architecture (docs/extending.md, ``examples/custom_ffn``).

Decoding options that concern the model itself (docs/decoding.md) are applied by
:meth:`VaswaniTransformerModel.prepare_for_inference_`, which ``fairseq-generate``,
``fairseq-interactive`` and the hub call with the generation configuration before decoding:
alignments (``--print-alignment``, ``--replace-unk``) switch on the decoder's attention output,
and ``--retain-dropout`` keeps dropout active.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from fairseq import utils
from fairseq.models import FairseqEncoderDecoderModel, register_model
from torch import Tensor, nn

from ..files.errors import InvalidValue, UserError
from ..generation.alignment import alignment_requested, check_replace_unk
from ..generation.decoding_options import DecodingOptionError
from .blocks import TransformerBlocks
from .decoder import VaswaniDecoder
from .encoder import VaswaniEncoder
from .layer_pruning import keep_whole_or_pruned_sides, prune_to_kept_layers
from .transformer_config import VaswaniTransformerConfig, complete_config, validate_config


@register_model("vaswani_transformer", dataclass=VaswaniTransformerConfig)
class VaswaniTransformerModel(FairseqEncoderDecoderModel):
    #: what builds every part of the model (§3); an extension names its own
    blocks: TransformerBlocks = TransformerBlocks()

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
                raise InvalidValue(
                    "--share-all-embeddings needs a joined dictionary "
                    "(fairseq-preprocess --joined-dictionary)"
                )
        blocks = cls.blocks
        encoder_embed = blocks.build_embedding(src_dict, cfg.encoder_embed_dim)
        load_pretrained_embedding(encoder_embed, src_dict, cfg.encoder_embed_path,
                                  "--encoder-embed-path")
        if cfg.share_all_embeddings:
            decoder_embed = encoder_embed
        else:
            decoder_embed = blocks.build_embedding(tgt_dict, cfg.decoder_embed_dim)
            load_pretrained_embedding(decoder_embed, tgt_dict, cfg.decoder_embed_path,
                                      "--decoder-embed-path")
        encoder = cls.build_encoder(cfg, src_dict, encoder_embed)
        decoder = cls.build_decoder(cfg, tgt_dict, decoder_embed)
        return cls(cfg, encoder, decoder)

    @classmethod
    def build_encoder(cls, cfg, dictionary, embed_tokens: nn.Embedding) -> VaswaniEncoder:
        """The encoder stack (§3.1), whose layers come from the model's ``blocks``."""
        return VaswaniEncoder(cfg, dictionary, embed_tokens, blocks=cls.blocks)

    @classmethod
    def build_decoder(cls, cfg, dictionary, embed_tokens: nn.Embedding) -> VaswaniDecoder:
        """The decoder stack (§3.1), whose layers come from the model's ``blocks``."""
        return VaswaniDecoder(cfg, dictionary, embed_tokens, blocks=cls.blocks)

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
        generation = cfg.generation
        alignment = alignment_requested(generation)
        if alignment and getattr(self.cfg, "no_cross_attention", False):
            raise DecodingOptionError(
                "--print-alignment / --replace-unk: the model has no encoder-decoder attention "
                "to align with (--no-cross-attention)"
            )
        super().prepare_for_inference_(cfg)
        self.decoder.return_alignment = alignment
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


class MissingEmbeddingFile(UserError, FileNotFoundError):
    """A ``--*-embed-path`` that names no file: one line (a :class:`UserError`)."""


def load_pretrained_embedding(
    embedding: nn.Embedding, dictionary, path: Optional[str], option: str
) -> None:
    """Copy the vectors of a word2vec-style text file (a header line, then ``word v1 v2 ...``)
    into the rows of the words ``dictionary`` knows (fairseq's ``--*-embed-path``); other rows
    keep their initialisation."""
    if not path:
        return
    if not os.path.isfile(path):
        raise MissingEmbeddingFile(f"vaswani_transformer: {option}: no such file {path}")
    vectors = utils.parse_embedding(path)
    width = embedding.weight.size(1)
    for word, vector in vectors.items():
        if vector.numel() != width:
            raise InvalidValue(
                f"vaswani_transformer: {option} {path} holds {vector.numel()}-dimensional "
                f"vectors (word {word!r}), the embeddings are {width}-dimensional"
            )
    utils.load_embedding(vectors, dictionary, embedding)
