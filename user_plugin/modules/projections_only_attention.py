"""An attention reduced to its matrix products: the floor of the benchmark's decoding sweep.

``scripts/benchmark.py`` times our decoder with every attention replaced by
:class:`ProjectionsOnlyAttention` (§3.2.2's four projections on a decoding step, and nothing
else) at fixed output lengths; that time is a floor for any implementation of the same model in
the same generator. It lives in the package so that the benchmark and its test share it without
importing a script. Not used by training or decoding.
"""

from torch import nn


class ProjectionsOnlyAttention(nn.Module):
    """Stand-in for a decoder attention, for the attention-free bound of the decoding sweep.

    It does the attention's four matrix products on a decoding step (queries, keys and values of
    the new step, output projection; queries and output for the encoder-decoder attention) and
    nothing else: no cache, no scores, no softmax, no weighted sum, no reorders. A decoder whose
    attentions are all replaced keeps every matrix product of the real one and its place in
    fairseq's ``SequenceGenerator``, so its time at a fixed output length is a floor for any
    implementation of the same model, and built-in / floor is the largest speed-up attention and
    cache work can buy. Its outputs are meaningless (only the work counts).
    """

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, query, key_value, attn_mask=None, is_causal=False, incremental_state=None,
                need_weights=False, beam=None):
        attention = self.attention
        if incremental_state is None or query.size(1) != 1:
            raise ValueError("the attention-free bound only decodes step by step")
        q = attention.q_proj(query)
        if attention.encoder_decoder:
            return attention.out_proj(q), None
        source = query if key_value is None else key_value
        attention.k_proj(source)
        return attention.out_proj(attention.v_proj(source)), None


def attention_free(model: nn.Module) -> nn.Module:
    """Replace every decoder attention of our model by :class:`ProjectionsOnlyAttention`."""
    for layer in model.decoder.layers:
        layer.self_attn = ProjectionsOnlyAttention(layer.self_attn)
        layer.encoder_attn = ProjectionsOnlyAttention(layer.encoder_attn)
    return model
