"""fairseq's built-in ``transformer`` with our model's hyperparameters, and the parameter-name
mapping between the two models, in both directions.

The two implementations compute the same function from the same weights (tested to 1e-5), so a
built-in model serves as the reference of the equivalence tests and of the benchmark, and our
weights can be moved into the built-in architecture. Only two things differ:

* names inside a layer: our ``Add & Norm`` wrappers and feed-forward module hold the layer norms
  and linear layers that fairseq keeps at the layer's top level (:data:`LAYER_NAMES`);
* learned positions: fairseq's table starts at row ``padding_idx + 1``, ours at row 0.

fairseq's sinusoidal encoding concatenates the sines and cosines (the paper interleaves them,
§3.5); :class:`OurPositionsForFairseq` gives a built-in model ours.
"""

from __future__ import annotations

import argparse
from typing import Dict, Optional

import torch
from torch import nn

from .modules.positional_encoding import token_positions

#: Our name -> fairseq's name, of the modules inside one encoder or decoder layer.
LAYER_NAMES = {
    "self_attn_residual.layer_norm": "self_attn_layer_norm",
    "encoder_attn_residual.layer_norm": "encoder_attn_layer_norm",
    "ffn_residual.layer_norm": "final_layer_norm",
    "ffn.fc1": "fc1",
    "ffn.fc2": "fc2",
}

#: Configuration fields that fairseq's ``transformer`` reads under the same name as ours.
SHARED_OPTIONS = (
    "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_layers", "encoder_attention_heads",
    "encoder_normalize_before", "encoder_learned_pos", "decoder_embed_dim",
    "decoder_ffn_embed_dim", "decoder_layers", "decoder_attention_heads",
    "decoder_normalize_before", "decoder_learned_pos", "share_all_embeddings",
    "share_decoder_input_output_embed", "dropout", "attention_dropout", "activation_dropout",
    "max_source_positions", "max_target_positions", "no_scale_embedding",
)
#: Options of fairseq's ``transformer`` beyond the paper that both models implement alike,
#: passed on when the configuration has them.
EXTRA_SHARED_OPTIONS = (
    "layernorm_embedding", "no_token_positional_embeddings", "no_decoder_final_norm",
    "decoder_output_dim", "no_cross_attention", "cross_self_attention",
    "adaptive_softmax_cutoff", "adaptive_softmax_dropout", "adaptive_softmax_factor",
    "encoder_layers_to_keep", "decoder_layers_to_keep", "relu_dropout",
)


def build_fairseq_transformer(ours: Optional[nn.Module], task, cfg=None) -> nn.Module:
    """fairseq's ``transformer`` (a ``TransformerModel``) for ``task``'s dictionaries, with the
    hyperparameters of ``cfg`` (by default those of our model ``ours``); fresh weights."""
    from fairseq.models.transformer import TransformerModel
    from fairseq.models.transformer import base_architecture as fairseq_base_architecture

    if cfg is None:
        if ours is None:
            raise ValueError("give our model or its configuration")
        cfg = ours.cfg
    args = argparse.Namespace(
        **{name: getattr(cfg, name) for name in SHARED_OPTIONS},
        activation_fn=str(cfg.activation_fn),
    )
    for name in EXTRA_SHARED_OPTIONS:
        value = getattr(cfg, name, None)
        if value is not None:
            setattr(args, name, value)
    fairseq_base_architecture(args)
    return TransformerModel.build_model(args, task)


def fairseq_name(our_name: str) -> str:
    """The name in fairseq's ``transformer`` of our parameter or buffer ``our_name``."""
    name = our_name
    for ours, theirs in LAYER_NAMES.items():
        name = name.replace(f".{ours}.", f".{theirs}.")
    return name


def _learned_positions_offset(ours: nn.Module, name: str) -> Optional[int]:
    """For our learned position table ``name``, the row of fairseq's table that holds our row
    0 (``padding_idx + 1`` of that side); None for any other tensor."""
    if not name.endswith("embed_positions.weight"):
        return None
    side = getattr(ours, name.split(".", 1)[0])
    return side.padding_idx + 1


def copy_fairseq_weights_into_ours(fairseq_model: nn.Module, ours: nn.Module) -> None:
    """Load the weights of a built-in ``transformer`` into our model of the same
    hyperparameters, mapping names and the learned-position offset."""
    theirs: Dict[str, torch.Tensor] = fairseq_model.state_dict()
    new_state = {}
    for name, tensor in ours.state_dict().items():
        source = theirs[fairseq_name(name)]
        offset = _learned_positions_offset(ours, name)
        new_state[name] = source if offset is None else source[offset: offset + tensor.size(0)]
    ours.load_state_dict(new_state)


def copy_our_weights_into_fairseq(ours: nn.Module, fairseq_model: nn.Module) -> None:
    """Load our model's weights into a built-in ``transformer`` of the same hyperparameters
    (the inverse of :func:`copy_fairseq_weights_into_ours`). fairseq's entries that have no
    counterpart in ours (its ``version`` buffers, the learned-position rows before
    ``padding_idx + 1``) keep their values."""
    new_state: Dict[str, torch.Tensor] = dict(fairseq_model.state_dict())
    for name, tensor in ours.state_dict().items():
        target = fairseq_name(name)
        offset = _learned_positions_offset(ours, name)
        if offset is None:
            new_state[target] = tensor
        else:
            table = new_state[target].clone()
            table[offset: offset + tensor.size(0)] = tensor
            new_state[target] = table
    fairseq_model.load_state_dict(new_state)


class OurPositionsForFairseq(nn.Module):
    """Our positional module (the §3.5 encoding, or learned positions) behind the calling
    convention of fairseq's positional modules, to replace a built-in model's.

    Positions count real tokens only (:func:`token_positions`); when decoding incrementally
    only the newest position is computed.
    """

    def __init__(self, our_positions: nn.Module, padding_idx: int) -> None:
        super().__init__()
        self.ours = our_positions
        self.padding_idx = padding_idx
        self.max_positions = our_positions.max_positions

    def forward(self, tokens, incremental_state=None, timestep=None, positions=None):
        real = tokens.ne(self.padding_idx)
        if incremental_state is not None:
            last = (real.sum(dim=1, keepdim=True) - 1).clamp_(min=0)
            return self.ours(last) * real[:, -1:].unsqueeze(-1)
        return self.ours(token_positions(tokens, self.padding_idx)) * real.unsqueeze(-1)
