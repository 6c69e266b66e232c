"""Build fairseq's built-in ``transformer`` with our hyperparameters and copy weights between the
two, for the equivalence tests and the benchmark."""

from __future__ import annotations

import argparse
from typing import Dict

import torch
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer import base_architecture as fairseq_base_architecture
from torch import nn

from user_plugin.modules.positional_encoding import token_positions

# our name -> fairseq's name, inside one layer
_LAYER_NAMES = {
    "self_attn_residual.layer_norm": "self_attn_layer_norm",
    "encoder_attn_residual.layer_norm": "encoder_attn_layer_norm",
    "ffn_residual.layer_norm": "final_layer_norm",
    "ffn.fc1": "fc1",
    "ffn.fc2": "fc2",
}


# options of fairseq's transformer beyond the paper that both models implement alike
FAIRSEQ_TRANSFORMER_EXTRA_OPTIONS = (
    "layernorm_embedding", "no_token_positional_embeddings", "no_decoder_final_norm",
    "decoder_output_dim", "no_cross_attention", "cross_self_attention",
    "adaptive_softmax_cutoff", "adaptive_softmax_dropout", "adaptive_softmax_factor",
    "encoder_layers_to_keep", "decoder_layers_to_keep", "relu_dropout",
)


def build_fairseq_transformer(ours, task, cfg) -> TransformerModel:
    """fairseq's ``transformer`` with the hyperparameters of our model's ``cfg``."""
    args = argparse.Namespace(
        **{k: getattr(cfg, k) for k in (
            "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_layers",
            "encoder_attention_heads", "encoder_normalize_before", "encoder_learned_pos",
            "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_layers",
            "decoder_attention_heads", "decoder_normalize_before", "decoder_learned_pos",
            "share_all_embeddings", "share_decoder_input_output_embed", "dropout",
            "attention_dropout", "activation_dropout", "max_source_positions",
            "max_target_positions", "no_scale_embedding",
        )},
        activation_fn=str(cfg.activation_fn),
    )
    for name in FAIRSEQ_TRANSFORMER_EXTRA_OPTIONS:  # options beyond the paper, when cfg has them
        value = getattr(cfg, name, None)
        if value is not None:
            setattr(args, name, value)
    fairseq_base_architecture(args)
    return TransformerModel.build_model(args, task)


def fairseq_name(our_name: str, padding_idx: int) -> str:
    name = our_name
    for ours, theirs in _LAYER_NAMES.items():
        name = name.replace(f".{ours}.", f".{theirs}.")
    return name


def copy_fairseq_weights_into_ours(fairseq_model: nn.Module, ours: nn.Module) -> None:
    """Load fairseq's weights into our model, mapping names and the learned-position offset
    (fairseq's learned positions start at ``padding_idx + 1``, ours at 0)."""
    theirs: Dict[str, torch.Tensor] = fairseq_model.state_dict()
    new_state = {}
    for name, tensor in ours.state_dict().items():
        source = fairseq_name(name, 1)
        if name.endswith("embed_positions.weight"):
            offset = ours.encoder.padding_idx + 1
            new_state[name] = theirs[source][offset: offset + tensor.size(0)]
        else:
            new_state[name] = theirs[source]
    ours.load_state_dict(new_state)


class OurPositionsForFairseq(nn.Module):
    """Replaces fairseq's sinusoidal module with our §3.5 encoding, same calling convention."""

    def __init__(self, our_positions: nn.Module, padding_idx: int) -> None:
        super().__init__()
        self.ours = our_positions
        self.padding_idx = padding_idx
        self.max_positions = 1024

    def forward(self, tokens, incremental_state=None, timestep=None, positions=None):
        pos = token_positions(tokens, self.padding_idx)
        out = self.ours(pos) * tokens.ne(self.padding_idx).unsqueeze(-1)
        return out[:, -1:] if incremental_state is not None else out
