"""Property-based tests (hypothesis) of attention (§3.2) and of the label-smoothed loss (§5.4).

Attention: :class:`~user_plugin.modules.attention.MultiHeadAttention` against a naive
reference written from equation 1 (softmax(Q K^T / sqrt(d_k)) V per head, heads concatenated and
projected, §3.2.2), over random shapes, key/value widths, padding and causal masks; attention
rows are distributions, masked keys get zero weight and changing what they hold changes nothing.

Criterion: ``label_smoothed_loss_from_logits`` against fairseq's ``label_smoothed_nll_loss`` over
random shapes, smoothing values and padding.
"""

import math

import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from hypothesis import given, settings
from hypothesis import strategies as st

from user_plugin.criterions.label_smoothed_cross_entropy import label_smoothed_loss_from_logits
from user_plugin.modules.attention import MultiHeadAttention

SETTINGS = settings(max_examples=25, deadline=None)


@st.composite
def attention_cases(draw):
    """A module and inputs; a key padding mask leaving at least one key visible (attention to
    another sequence), or the causal mask of a self-attention (§3.2.3)."""
    heads = draw(st.sampled_from([1, 2, 4]))
    embed_dim = heads * draw(st.integers(1, 4))
    separate_dims = draw(st.booleans())
    key_dim = draw(st.integers(1, 5)) if separate_dims else None
    value_dim = draw(st.integers(1, 5)) if separate_dims else None
    batch = draw(st.integers(1, 3))
    causal = draw(st.booleans())
    query_len = draw(st.integers(1, 6))
    key_len = query_len if causal else draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    # padded keys for attention to another sequence; causal self-attention masks the future
    padded = torch.zeros(batch, key_len, dtype=torch.bool)
    if not causal:
        padded = torch.tensor([[draw(st.booleans()) for _ in range(key_len)]
                               for _ in range(batch)])
        for row in range(batch):  # keep at least one key visible
            padded[row, draw(st.integers(0, key_len - 1))] = False
    return dict(heads=heads, embed_dim=embed_dim, key_dim=key_dim, value_dim=value_dim,
                batch=batch, causal=causal, query_len=query_len, key_len=key_len, seed=seed,
                padded=padded)


def build(case):
    torch.manual_seed(case["seed"])
    module = MultiHeadAttention(case["embed_dim"], case["heads"], key_dim=case["key_dim"],
                                value_dim=case["value_dim"])
    for proj in (module.q_proj, module.k_proj, module.v_proj, module.out_proj):
        torch.nn.init.normal_(proj.bias)  # non-zero biases, so that they are checked too
    module.eval()
    query = torch.randn(case["batch"], case["query_len"], case["embed_dim"])
    key_value = query if case["causal"] else torch.randn(case["batch"], case["key_len"],
                                                         case["embed_dim"])
    return module, query, key_value


def allowed_mask(case) -> torch.Tensor:
    """[B, 1, T, S] True where query t may attend to key s."""
    allowed = (~case["padded"])[:, None, None, :].expand(-1, 1, case["query_len"], -1)
    if case["causal"]:
        allowed = allowed & torch.ones(case["query_len"], case["key_len"], dtype=torch.bool).tril()
    return allowed


def naive_attention(module, query, key_value, allowed):
    """Equation 1 per head, written out with loops over heads."""
    heads, dk, dv = module.num_heads, module.key_dim, module.value_dim
    q, k, v = module.q_proj(query), module.k_proj(key_value), module.v_proj(key_value)
    contexts, weights = [], []
    for head in range(heads):
        qh, kh = q[..., head * dk:(head + 1) * dk], k[..., head * dk:(head + 1) * dk]
        vh = v[..., head * dv:(head + 1) * dv]
        scores = qh @ kh.transpose(1, 2) / math.sqrt(dk)
        scores = scores.masked_fill(~allowed[:, 0], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        weights.append(probs)
        contexts.append(probs @ vh)
    return module.out_proj(torch.cat(contexts, dim=-1)), torch.stack(weights, dim=1)


def run(module, query, key_value, case, need_weights):
    mask = None if case["causal"] else (~case["padded"])[:, None, None, :]
    with torch.no_grad():
        return module(query, key_value, attn_mask=mask, is_causal=case["causal"],
                      need_weights=need_weights)


@SETTINGS
@given(attention_cases())
def test_attention_matches_the_naive_reference(case):
    module, query, key_value = build(case)
    with torch.no_grad():
        expected, expected_weights = naive_attention(module, query, key_value, allowed_mask(case))
    for need_weights in (True, False):
        output, weights = run(module, query, key_value, case, need_weights)
        torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-5)
        if need_weights:
            torch.testing.assert_close(weights, expected_weights, rtol=1e-4, atol=1e-6)


@SETTINGS
@given(attention_cases())
def test_attention_rows_are_distributions_that_ignore_masked_keys(case):
    module, query, key_value = build(case)
    _, weights = run(module, query, key_value, case, need_weights=True)
    allowed = allowed_mask(case).expand_as(weights)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert bool((weights >= 0).all())
    assert bool(weights.masked_select(~allowed).eq(0).all())


@SETTINGS
@given(attention_cases())
def test_changing_a_masked_key_or_value_changes_nothing(case):
    if case["causal"]:  # the future of a self-attention: inputs from position p on
        module, query, _ = build(case)
        output, _ = run(module, query, query, case, need_weights=False)
        cut = case["query_len"] // 2
        changed = query.clone()
        changed[:, cut:] = torch.randn_like(changed[:, cut:]) * 10
        new_output, _ = run(module, changed, changed, case, need_weights=False)
        torch.testing.assert_close(new_output[:, :cut], output[:, :cut], rtol=1e-4, atol=1e-5)
        return
    module, query, key_value = build(case)
    output, _ = run(module, query, key_value, case, need_weights=False)
    changed = key_value.clone()
    changed[case["padded"]] = torch.randn(int(case["padded"].sum()), key_value.size(-1)) * 10
    new_output, _ = run(module, query, changed, case, need_weights=False)
    torch.testing.assert_close(new_output, output, rtol=1e-4, atol=1e-5)


@st.composite
def criterion_cases(draw):
    rows = draw(st.integers(1, 12))
    vocab = draw(st.integers(5, 30))
    epsilon = draw(st.floats(0.0, 0.5))
    pad = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * draw(st.sampled_from([0.1, 1.0, 5.0]))
    target = torch.randint(0, vocab, (rows,), generator=gen)
    target[torch.rand(rows, generator=gen) < draw(st.floats(0.0, 0.6))] = pad
    return logits, target, epsilon, pad


@SETTINGS
@given(criterion_cases())
def test_label_smoothed_loss_matches_fairseq(case):
    logits, target, epsilon, pad = case
    loss, nll = label_smoothed_loss_from_logits(logits, target, epsilon, pad)
    lprobs = torch.log_softmax(logits.double(), dim=-1)
    ref_loss, ref_nll = label_smoothed_nll_loss(lprobs, target.unsqueeze(-1), epsilon,
                                                ignore_index=pad, reduce=True)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-5, atol=1e-4)
    if bool(target.eq(pad).all()):
        assert float(loss) == 0.0 and float(nll) == 0.0
