"""No host-device synchronisation inside a training forward or backward pass of our model and
criterion, shown on a CPU by counting dispatched operators (``user_plugin/measurement/
operator_count.py``): every operator that would make the host wait for a GPU (``.item()``,
``bool(tensor)``, ``nonzero``, boolean indexing...) raises in the counter.

* the counter itself catches each kind of synchronisation (so that "no error" below means
  something), and tells compute operators from views;
* a training step's forward and backward pass of ``vaswani_base`` with our criterion, fused and
  unfused, with and without accuracy, in float32 and bfloat16, raises nothing;
* what replaced the synchronising code computes the same: the decoder's self-attention mask
  (left-padded targets give each sentence's own outputs) and the criterion's kept rows.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, build_vaswani, fake_task, make_dictionary, random_batch

from user_plugin.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropy,
    non_pad_rows,
)
from user_plugin.measurement.operator_count import HostSyncError, OperatorCounter


@pytest.mark.parametrize("action, kind", [
    (lambda x, m: x.sum().item(), "aten::_local_scalar_dense"),
    (lambda x, m: bool(m.any()), "aten::_local_scalar_dense"),
    (lambda x, m: float(x[0]), "aten::_local_scalar_dense"),
    (lambda x, m: m.nonzero(), "aten::nonzero"),
    (lambda x, m: x[m], "aten::index with a boolean index"),
    (lambda x, m: x.masked_select(m), "aten::masked_select"),
    (lambda x, m: x.__setitem__(m, 0.0), "aten::index_put_ with a boolean index"),
    (lambda x, m: torch.equal(x, x), "aten::equal"),
    (lambda x, m: torch.unique(x), "aten::_unique2"),
])
def test_the_counter_catches_every_kind_of_synchronisation(action, kind):
    x, mask = torch.randn(6), torch.tensor([True, False, True, False, True, True])
    with pytest.raises(HostSyncError, match=kind) as caught:
        with OperatorCounter(fail_on_sync=True):
            action(x, mask)
    assert "test_host_syncs.py:" in str(caught.value)  # names the calling line
    # without fail_on_sync it counts
    with OperatorCounter() as counter:
        action(x, mask)
    assert counter.syncs[kind] == 1 and counter.totals()["syncs"] == 1


def test_the_counter_tells_views_from_compute_and_marks_the_forward_backward():
    x = torch.randn(4, 3)
    with OperatorCounter(fail_on_sync="forward_backward") as counter:
        x.t().reshape(-1)[1:5].mul(2).add_(1)
        x.sum().item()  # outside the forward-backward: counted, not fatal
        counter.enter_forward_backward()
        with pytest.raises(HostSyncError):
            x.max().item()
        counter.leave_forward_backward()
    assert counter.compute["aten::mul"] == 1 and counter.compute["aten::add_"] == 1
    assert counter.views["aten::t"] == 1 and counter.views["aten::slice"] == 1
    assert counter.totals()["syncs"] == 2 and counter.totals()["syncs_in_forward_backward"] == 1


def translation_sample(dictionary, batch: int = 4, seed: int = 0) -> dict:
    """A batch as fairseq's translation task makes it: left-padded sources, right-padded
    targets and their shifted inputs, ``ntokens`` the count of non-pad targets."""
    src, src_lengths, prev = random_batch(dictionary, batch=batch, src_len=9, tgt_len=7,
                                          seed=seed)
    pad = dictionary.pad()
    target = torch.full_like(prev, pad)
    target[:, :-1] = prev[:, 1:]
    lengths = prev.ne(pad).sum(dim=1)
    target[torch.arange(batch), lengths - 1] = dictionary.eos()
    return {"id": torch.arange(batch), "nsentences": batch,
            "ntokens": int(target.ne(pad).sum()), "target": target,
            "net_input": {"src_tokens": src, "src_lengths": src_lengths,
                          "prev_output_tokens": prev}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ["fused", "fused_accuracy", "adaptive_softmax",
                                     "pre_norm", "cross_self_attention"])
def test_training_forward_and_backward_never_wait_for_the_device(variant, dtype):
    dictionary = make_dictionary(60)
    options = dict(TINY, dropout=0.1)
    if variant == "adaptive_softmax":  # the unfused path of the criterion, through logits
        options.update(adaptive_softmax_cutoff=[20, 40], share_all_embeddings=False)
    if variant == "pre_norm":
        options.update(encoder_normalize_before=True, decoder_normalize_before=True)
    if variant == "cross_self_attention":
        options.update(cross_self_attention=True)
    torch.manual_seed(0)
    model = build_vaswani(dictionary, "vaswani_base", **options).to(dtype).train()
    criterion = LabelSmoothedCrossEntropy(fake_task(dictionary), False, 0.1,
                                          report_accuracy=variant != "fused")
    sample = translation_sample(dictionary)
    with OperatorCounter(fail_on_sync=True) as counter:
        loss, sample_size, logging_output = criterion(model, sample)
        loss.backward()
    assert counter.totals()["syncs"] == 0
    assert counter.totals()["compute"] > 100  # the counter saw the whole step
    assert torch.isfinite(loss) and sample_size == sample["ntokens"]
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    if variant == "fused_accuracy":  # the accuracy is read later, by reduce_metrics
        assert int(logging_output["total"]) == sample["ntokens"]
        assert 0 <= int(logging_output["n_correct"]) <= sample["ntokens"]


def test_left_padded_targets_give_each_sentence_its_own_outputs():
    """The decoder's self-attention mask hides pads wherever they are: a batch of left-padded
    target prefixes gives, at every real position, what each sentence gives alone."""
    dictionary = make_dictionary(50)
    torch.manual_seed(1)
    model = build_vaswani(dictionary, "vaswani_base", **TINY).eval()
    src, src_lengths, prev = random_batch(dictionary, batch=3, src_len=8, tgt_len=6, seed=3)
    pad = dictionary.pad()
    left = torch.full_like(prev, pad)
    lengths = prev.ne(pad).sum(dim=1)
    for i, n in enumerate(lengths.tolist()):
        left[i, prev.size(1) - n:] = prev[i, :n]
    with torch.no_grad():
        batch_out, _ = model(src, src_lengths, left)
        for i, n in enumerate(lengths.tolist()):
            real_src = src[i:i + 1, src[i].ne(pad)]
            alone, _ = model(real_src, src_lengths[i:i + 1], prev[i:i + 1, :n])
            torch.testing.assert_close(batch_out[i, prev.size(1) - n:], alone[0],
                                       atol=1e-5, rtol=1e-5)


def test_kept_rows_are_the_non_pad_rows_in_order_and_a_wrong_count_is_refused():
    generator = torch.Generator().manual_seed(0)
    keep = torch.rand(300, generator=generator) > 0.3
    count = int(keep.sum())
    assert torch.equal(non_pad_rows(keep, count), keep.nonzero().squeeze(1))
    assert torch.equal(non_pad_rows(keep, None), keep.nonzero().squeeze(1))
    with pytest.raises(RuntimeError, match="ntokens differs"):
        non_pad_rows(keep, count - 1)
