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

:func:`to_builtin_transformer` turns a model of ours into the built-in (what the exports
start from): :data:`OPTION_MAPPING` says how each option of ours reaches it, :func:`refusal`
what it cannot express.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, Optional

import torch
from torch import nn

from ..models.transformer_config import UNSUPPORTED_OPTIONS
from ..modules.positional_encoding import token_positions
from .errors import ArtifactError

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


# -- our model as the built-in -------------------------------------------------------------

#: The model name and architecture of fairseq's built-in Transformer.
BUILTIN_MODEL = "transformer"
#: Our model's registered name; extensions register others.
OUR_MODEL = "vaswani_transformer"

#: Options of fairseq's ``transformer`` that act only while training (LayerDrop, activation
#: checkpointing, FSDP wrapping, Quant-Noise); the export carries them as they are.
TRAINING_OPTIONS = (
    "encoder_layerdrop", "decoder_layerdrop", "checkpoint_activations", "offload_activations",
    "min_params_to_wrap", "export", "quant_noise_pq", "quant_noise_pq_block_size",
    "quant_noise_scalar",
)

#: How each option of our model configuration reaches fairseq's ``transformer``: ``same`` (same
#: name, same meaning), ``learned table`` (the positions become a learned table holding ours),
#: ``d_model / heads only`` (the built-in has no such option; only its fixed value exports),
#: ``applied`` (the export holds the kept layers only), ``dropped`` (initialization only: the
#: weights are in the checkpoint), ``default`` (our model refuses any other value) or ``not
#: exported`` (how alignments are read at decoding time: the built-in always aligns with its
#: last layer's heads, fairseq's defaults).
OPTION_MAPPING: dict[str, str] = {
    **{name: "same" for name in (*SHARED_OPTIONS, *EXTRA_SHARED_OPTIONS, *TRAINING_OPTIONS,
                                 "activation_fn")},
    **{name: "default" for name in UNSUPPORTED_OPTIONS},
    "encoder_learned_pos": "learned table",
    "decoder_learned_pos": "learned table",
    "attention_key_dim": "d_model / heads only",
    "attention_value_dim": "d_model / heads only",
    "encoder_layers_to_keep": "applied",
    "decoder_layers_to_keep": "applied",
    "encoder_embed_path": "dropped",
    "decoder_embed_path": "dropped",
    "alignment_layer": "not exported",
    "alignment_heads": "not exported",
    "full_context_alignment": "not exported",
    "compile_layers": "not exported",
}


def refusal(model: nn.Module) -> str | None:
    """Why fairseq's ``transformer`` cannot hold ``model`` exactly, or None when it can."""
    from ..models.transformer_config import SIDES, StackConfig
    from ..models.vaswani_transformer import VaswaniTransformerModel

    if type(model) is not VaswaniTransformerModel:
        return (f"model class {type(model).__name__} is an extension of {OUR_MODEL}: "
                "fairseq's built-in transformer cannot express its blocks")
    for side in SIDES:
        stack = StackConfig.of(model.cfg, side)
        per_head = stack.embed_dim // stack.attention_heads
        for what, value, option in (("d_k", stack.key_dim, "--attention-key-dim"),
                                    ("d_v", stack.value_dim, "--attention-value-dim")):
            if value is not None and (value != per_head
                                      or stack.embed_dim % stack.attention_heads):
                return (f"{what} = {value} per head in the {side} ({option}; Table 3 row B), "
                        f"but fairseq's built-in transformer has {what} = d_model / heads = "
                        f"{stack.embed_dim}/{stack.attention_heads}")
    return None


def builtin_options(cfg: Any) -> argparse.Namespace:
    """The complete option namespace of fairseq's ``transformer`` for our configuration
    ``cfg`` (see :data:`OPTION_MAPPING`): learned positions on both sides (they hold our
    table), the layer counts after ``--*-layers-to-keep`` with nothing left to prune, no
    pre-trained embedding files, every other option at the built-in's default
    (``base_architecture``)."""
    from fairseq.models.transformer import base_architecture

    options = argparse.Namespace(**{name: getattr(cfg, name) for name in SHARED_OPTIONS})
    for name in (*EXTRA_SHARED_OPTIONS, *TRAINING_OPTIONS):
        value = getattr(cfg, name, None)
        if value is not None:
            setattr(options, name, value)
    options.activation_fn = str(cfg.activation_fn)
    options.encoder_learned_pos = options.decoder_learned_pos = True
    options.encoder_layers_to_keep = options.decoder_layers_to_keep = None
    options.encoder_embed_path = options.decoder_embed_path = None
    base_architecture(options)
    return options


def copy_positions(ours: nn.Module, theirs: nn.Module) -> None:
    """Write our positional table (sinusoids or learned) into the built-in's learned table at
    rows ``padding_idx + 1`` on; the rows before are zero (the padding row must be)."""
    from ..modules.positional_encoding import SinusoidalPositionalEncoding

    for side in ("encoder", "decoder"):
        our_positions = getattr(ours, side).embed_positions
        if our_positions is None:  # --no-token-positional-embeddings: neither has a table
            continue
        target = getattr(theirs, side).embed_positions.weight
        offset = getattr(theirs, side).padding_idx + 1
        if isinstance(our_positions, SinusoidalPositionalEncoding):
            table = our_positions.table
        else:
            table = our_positions.weight
        with torch.no_grad():
            target.zero_()
            target[offset: offset + table.size(0)] = table


def check_parameters_covered(ours: nn.Module, theirs: nn.Module) -> None:
    """Every parameter of ours has a counterpart of the same shape in the built-in and every
    parameter of the built-in is one of ours (or a positional table): otherwise the model has
    blocks the built-in cannot express."""
    their_state = theirs.state_dict()
    mapped = set()
    for name, tensor in ours.state_dict().items():
        target = fairseq_name(name)
        if target not in their_state or (
            not name.endswith("embed_positions.weight")
            and their_state[target].shape != tensor.shape
        ):
            raise ArtifactError(f"parameter {name} {tuple(tensor.shape)} has no counterpart in "
                              "fairseq's built-in transformer")
        mapped.add(target)
    for name, _ in theirs.named_parameters(remove_duplicate=False):
        if name not in mapped and not name.endswith("embed_positions.weight"):
            raise ArtifactError(f"fairseq's built-in transformer has parameter {name}, which "
                              "the model does not: it is not the paper's architecture")


def to_builtin_transformer(ours: nn.Module, task: Any) -> nn.Module:
    """fairseq's ``transformer`` computing the same function as ``ours`` (eval mode); an
    :class:`ArtifactError` when it cannot (:func:`refusal`)."""
    reason = refusal(ours)
    if reason is not None:
        raise ArtifactError(reason)
    theirs = build_fairseq_transformer(ours, task, builtin_options(ours.cfg))
    check_parameters_covered(ours, theirs)
    copy_our_weights_into_fairseq(ours, theirs)
    copy_positions(ours, theirs)
    return theirs.eval()
