"""The decoder stack (paper §3.1, Figure 1 right) with incremental decoding.

``y = Dropout(sqrt(d_model) * Embed(prev_output_tokens) + PE)``, N decoder layers (a final
LayerNorm when pre-norm), as :class:`~.stack.TransformerStack`, then the pre-softmax linear,
whose weight may be the embedding's (§3.4).

Two output options of fairseq's transformer: ``--decoder-output-dim`` maps the last layer's
d_model to another width before the output layer (``project_out_dim``), and
``--adaptive-softmax-cutoff`` replaces the pre-softmax linear by fairseq's adaptive softmax
(Grave et al. 2017), whose log-probabilities ``get_normalized_probs`` returns.

With an ``incremental_state`` (beam search), only the newest target position is computed. The
decoder keeps one :class:`~user_plugin.modules.beam_state.BeamState` there, made on the first
step from the encoder output's beam layout, and hands it to every attention's cache; each beam
reorder is interpreted once, here, and passed on (:meth:`reorder_incremental_state_scripting`).

Alignments (``--print-alignment``, ``--replace-unk``) read one layer's encoder-decoder attention
averaged over heads, with the semantics of fairseq's decoder: ``--alignment-layer`` (0 = the
bottom layer, default the last) and ``--alignment-heads`` (the first N heads, default all).
Attention probabilities are computed only when asked: ``need_attn`` (every layer's, for plots),
or :attr:`VaswaniDecoder.return_alignment` (the alignment layer's only, step by step too),
which the model switches on when a generation configuration asks for alignments.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from fairseq import utils
from fairseq.models import FairseqIncrementalDecoder
from fairseq.modules import AdaptiveSoftmax
from torch import Tensor, nn

from ..files.errors import InvalidValue
from ..modules.attention import IncrementalState
from ..modules.beam_state import BeamLayout, BeamState
from ..modules.positional_encoding import check_length, token_positions
from ..modules.scaled_dot_product import causal_mask, key_padding_to_attn_mask
from .blocks import TransformerBlocks
from .stack import TransformerStack
from .transformer_config import StackConfig


class VaswaniDecoder(TransformerStack, FairseqIncrementalDecoder):
    """The decoder; ``blocks`` builds its layers (``build_decoder_layer``): the model's
    :class:`~.blocks.TransformerBlocks`, the paper's by default."""

    def __init__(self, cfg, dictionary, embed_tokens: nn.Embedding,
                 blocks: Optional[TransformerBlocks] = None) -> None:
        FairseqIncrementalDecoder.__init__(self, dictionary)
        self.cfg = cfg
        blocks = blocks or TransformerBlocks()
        stack = StackConfig.of(cfg, "decoder")
        self.build_stack(stack, embed_tokens, blocks, blocks.build_decoder_layer)
        width = stack.features_dim
        self.project_out_dim: Optional[nn.Linear] = None
        if width != stack.embed_dim:
            self.project_out_dim = nn.Linear(stack.embed_dim, width, bias=False)
            nn.init.xavier_uniform_(self.project_out_dim.weight)
        self.adaptive_softmax: Optional[AdaptiveSoftmax] = None
        self.output_projection: Optional[nn.Linear] = None
        if cfg.adaptive_softmax_cutoff is not None:
            self.adaptive_softmax = _adaptive_softmax(cfg, len(dictionary), width)
        else:
            self.output_projection = nn.Linear(width, len(dictionary), bias=False)
            if cfg.share_all_embeddings or cfg.share_decoder_input_output_embed:
                self.output_projection.weight = self.embed_tokens.weight
            else:
                nn.init.normal_(self.output_projection.weight, mean=0.0, std=width**-0.5)
        # None: the last layer
        self.alignment_layer: Optional[int] = getattr(cfg, "alignment_layer", None)
        self.alignment_heads: Optional[int] = getattr(cfg, "alignment_heads", None)
        # Return the alignment layer's attention from every call, also step by step (what
        # fairseq's generators record per hypothesis); off unless alignments are asked for.
        self.return_alignment = False

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[Dict[str, List]] = None,
        incremental_state: Optional[IncrementalState] = None,
        features_only: bool = False,
        **options: Any,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """Scores for the next token at every position of ``prev_output_tokens`` [B, T]:
        ``(logits [B, T, V], extra)``; ``options`` are :meth:`extract_features`'s."""
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state,
                                         **options)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[Dict[str, List]] = None,
        incremental_state: Optional[IncrementalState] = None,
        return_all_hiddens: bool = False,
        need_attn: bool = False,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        **unused: Any,
    ) -> Tuple[Tensor, Dict[str, Any]]:
        """The last layer's output [B, T, C] and ``extra``: ``inner_states`` (every layer's
        output with ``return_all_hiddens``), ``attn``: ``[alignment scores]``, the alignment
        layer's encoder-decoder attention averaged over its alignment heads ([B, T, S]) when
        ``need_attn`` or :attr:`return_alignment` is set, else ``[None]``, and with
        ``need_attn`` every layer's attention probabilities (``layer_attn``).

        ``alignment_layer`` / ``alignment_heads`` override the model's;
        ``full_context_alignment`` lifts the causal mask of self-attention (fairseq's option,
        for alignments over a whole output).
        """
        check_length(prev_output_tokens.size(1), self.stack.max_positions,
                     "--max-target-positions")
        positions = token_positions(prev_output_tokens, self.padding_idx)
        tokens = prev_output_tokens
        self_attn_mask, beam, causal = None, None, True
        if incremental_state is None and full_context_alignment:
            causal = False
            self_attn_mask = key_padding_to_attn_mask(tokens.eq(self.padding_idx))
        elif incremental_state is None:
            self_attn_mask = self._self_attention_mask(tokens)
        else:
            tokens, positions = tokens[:, -1:], positions[:, -1:]
            beam = self._beam_state(incremental_state, encoder_out, tokens)
            beam.advance(tokens.size(0))
        x = self.embed(tokens, positions)

        enc, enc_mask = None, None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
            padding = encoder_out["encoder_padding_mask"]
            if len(padding) > 0:
                enc_mask = key_padding_to_attn_mask(padding[0])

        if alignment_layer is None:
            alignment_layer = self.alignment_layer
        aligned = len(self.layers) - 1 if alignment_layer is None else alignment_layer
        align = need_attn or self.return_alignment
        states: List[Tensor] = [x]
        attentions: List[Dict[str, Optional[Tensor]]] = []
        for index, layer in enumerate(self.layers):
            need_weights = need_attn or (align and index == aligned)
            if incremental_state is None and not need_weights:
                x, weights = self.run_layer(index, layer, x, enc, enc_mask,
                                            self_attn_mask=self_attn_mask, causal=causal)
            else:
                x, weights = layer(
                    x,
                    enc,
                    enc_mask,
                    self_attn_mask=self_attn_mask,
                    causal=causal,
                    incremental_state=incremental_state,
                    need_weights=need_weights,
                    beam=beam,
                )
            states.append(x)
            attentions.append(weights)
        x = self.final_norm(x)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)

        attn: Optional[Tensor] = None
        if align and attentions[aligned]["encoder_attn"] is not None:
            heads = self.alignment_heads if alignment_heads is None else alignment_heads
            attn = average_heads(attentions[aligned]["encoder_attn"], heads)
        extra: Dict[str, Any] = {
            "attn": [attn],
            "inner_states": states if return_all_hiddens else [x],
        }
        if need_attn:
            extra["layer_attn"] = attentions
        return x, extra

    # -- beam search ----------------------------------------------------------------------

    def _beam_state(
        self, incremental_state: IncrementalState, encoder_out: Optional[Dict[str, List]],
        tokens: Tensor,
    ) -> BeamState:
        """The beam record of this decoding, made on its first step from the encoder output's
        layout (one row per sentence when the batch was not expanded into beams)."""
        saved = self.get_incremental_state(incremental_state, "beam")
        if saved is not None:
            return saved["state"]
        recorded = encoder_out.get("beam_layout") if encoder_out is not None else None
        layout = recorded[0] if recorded else BeamLayout(tokens.size(0))
        beam = BeamState(layout, tokens.device)
        self.set_incremental_state(incremental_state, "beam",
                                   {"state": beam, "followers": self._beam_followers()})
        return beam

    def reorder_incremental_state_scripting(
        self, incremental_state: IncrementalState, new_order: Tensor
    ) -> None:
        """Follow a beam reorder: interpret ``new_order`` once (:meth:`BeamState.follow`) and
        hand the result to every cache; modules with a cache of their own (an extension's
        attention) get fairseq's ``reorder_incremental_state`` call as usual."""
        saved = self.get_incremental_state(incremental_state, "beam")
        if saved is None:
            reorder, followers = None, self._beam_followers()
        else:
            reorder, followers = saved["state"].follow(new_order), saved["followers"]
        for module in followers:
            if hasattr(module, "reorder_beam"):
                if reorder is not None:
                    module.reorder_beam(incremental_state, reorder)
            else:
                result = module.reorder_incremental_state(incremental_state, new_order)
                if result is not None:
                    incremental_state = result

    def _beam_followers(self) -> List[nn.Module]:
        """The submodules that follow beam reorders (``reorder_beam``, or fairseq's
        ``reorder_incremental_state``), listed once per decoding: walking every module on every
        step costs more than some reorders."""
        return [module for module in self.modules() if module is not self
                and (hasattr(module, "reorder_beam")
                     or hasattr(module, "reorder_incremental_state"))]

    def _self_attention_mask(self, tokens: Tensor) -> Tensor:
        """The masked self-attention's mask (§3.2.3) for a whole target batch ``[B, T]``:
        ``[B, 1, T, T]``, True where position i may see position j: ``j <= i`` and j is not a
        pad, and every position sees itself (so that no row of the softmax is empty).

        Built for every batch, whatever its padding: deciding whether a plain causal mask would
        do (right padding) would read the batch on the host, a synchronisation of the device
        inside the forward pass. Real positions get the same attention either way.
        """
        length = tokens.size(1)
        allowed = causal_mask(length, length, tokens.device)
        allowed = (allowed & tokens.ne(self.padding_idx)[:, None, :]) \
            | torch.eye(length, dtype=torch.bool, device=tokens.device)
        return allowed[:, None, :, :]

    def output_layer(self, features: Tensor) -> Tensor:
        """The pre-softmax linear transformation (§3.4); with an adaptive softmax, the features
        themselves (its log-probabilities come from ``get_normalized_probs``)."""
        if self.output_projection is None:
            return features
        return self.output_projection(features)


def _adaptive_softmax(cfg, vocab_size: int, width: int) -> AdaptiveSoftmax:
    """fairseq's adaptive softmax over ``vocab_size`` types from ``width``-wide features."""
    cutoff = list(utils.eval_str_list(cfg.adaptive_softmax_cutoff, type=int))
    if cutoff[-1] > vocab_size:
        raise InvalidValue(
            f"vaswani_transformer: --adaptive-softmax-cutoff {cfg.adaptive_softmax_cutoff} "
            f"exceeds the target vocabulary of {vocab_size} types"
        )
    return AdaptiveSoftmax(vocab_size, width, cutoff, dropout=cfg.adaptive_softmax_dropout,
                           factor=cfg.adaptive_softmax_factor)


def average_heads(weights: Tensor, heads: Optional[int] = None) -> Tensor:
    """Attention probabilities ``[B, h, T, S]`` averaged over the first ``heads`` heads (all
    by default): ``[B, T, S]``, fairseq's alignment scores."""
    if heads is not None:
        weights = weights[:, :heads]
    return weights.mean(dim=1)
