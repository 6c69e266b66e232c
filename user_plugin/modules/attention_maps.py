"""A trained model's attention weights for one sentence pair, as the paper draws them
(Figures 3-5): teacher-forced, every layer and head, for our model and fairseq's built-in
``transformer`` alike (:func:`attention_maps`). ``vaswani-plot-attention`` draws them as PNG
files; ``vaswani-serve``'s page draws the encoder-decoder attention in the browser.

Importing this module needs only the standard library; torch is imported when a map is read.
"""

from __future__ import annotations

import inspect

from ..files.errors import UserError

#: The three kinds of attention of the Transformer (§3.2.3).
KINDS = ("encoder_self", "decoder_self", "encoder_decoder")
#: The longest sentence whose maps are drawn or served, in model tokens (with EOS): a heatmap
#: row per token stays readable, and one sentence's maps stay a few megabytes of JSON.
MAX_DRAWN_TOKENS = 200


def attention_maps(model, src_tokens, tgt_tokens, eos: int) -> dict:
    """Teacher-forced attention weights: {kind: [per layer, tensor [heads, rows, columns]]}.

    ``src_tokens`` and ``tgt_tokens`` are 1-D and end with EOS; the decoder input is
    ``EOS + tgt_tokens[:-1]`` (fairseq's convention). Our model returns its weights when asked
    (``need_attn``); fairseq's built-in ``transformer`` (which the hub decodes too) has them
    read from its attention modules (:func:`fairseq_attention_maps`).
    """
    import torch

    src = src_tokens.unsqueeze(0)
    prev = torch.cat([tgt_tokens.new_tensor([eos]), tgt_tokens[:-1]]).unsqueeze(0)
    if "need_attn" not in inspect.signature(model.encoder.forward).parameters:
        return fairseq_attention_maps(model, src, prev)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=torch.tensor([src.size(1)]), need_attn=True)
        _, extra = model.decoder(prev, encoder_out=encoder_out, need_attn=True)
    return {
        "encoder_self": [w[0] for w in encoder_out["self_attn"]],
        "decoder_self": [layer["self_attn"][0] for layer in extra["layer_attn"]],
        "encoder_decoder": [layer["encoder_attn"][0] for layer in extra["layer_attn"]],
    }


def fairseq_attention_maps(model, src, prev) -> dict:
    """:func:`attention_maps` of a model made of fairseq's ``TransformerEncoderLayer`` /
    ``TransformerDecoderLayer`` (the built-in ``transformer``), for one sentence pair
    (``src`` and ``prev`` are [1, length]).

    fairseq's layers ask their ``MultiheadAttention`` for no weights (or for the mean over
    heads); for one forward pass each attention module is asked for every head's weights
    (``need_head_weights``) and what it returns ([heads, batch, rows, columns]) is kept. Its
    fast path (PyTorch's fused attention, which can only average the heads) is bypassed for
    that pass by its ``skip_embed_dim_check`` flag, which does nothing else.
    """
    import torch

    modules = {}
    for kind, stack, name in (("encoder_self", model.encoder, "self_attn"),
                              ("decoder_self", model.decoder, "self_attn"),
                              ("encoder_decoder", model.decoder, "encoder_attn")):
        for layer in getattr(stack, "layers", None) or []:
            module = getattr(layer, name, None)
            if module is not None:
                modules[module] = kind
    kinds = set(modules.values())
    if kinds != set(KINDS):
        raise UserError(f"cannot read the attention of a {type(model).__name__}: found "
                        f"{', '.join(sorted(kinds)) or 'no attention layers'}, need "
                        f"{', '.join(KINDS)}")
    maps: dict = {kind: [] for kind in KINDS}

    def ask_for_head_weights(module, args, kwargs):
        return args, {**kwargs, "need_weights": True, "need_head_weights": True}

    def keep_weights(module, args, output):
        maps[modules[module]].append(output[1][:, 0].detach())

    hooks, flags = [], {}
    try:
        for module in modules:
            flags[module] = module.skip_embed_dim_check
            module.skip_embed_dim_check = True
            hooks.append(module.register_forward_pre_hook(ask_for_head_weights, with_kwargs=True))
            hooks.append(module.register_forward_hook(keep_weights))
        with torch.no_grad():
            model(src, torch.tensor([src.size(1)]), prev)
    finally:
        for hook in hooks:
            hook.remove()
        for module, flag in flags.items():
            module.skip_embed_dim_check = flag
    return maps

