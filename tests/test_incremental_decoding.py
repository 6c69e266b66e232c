"""Incremental decoding equals the full forward; masks hide exactly what they must (§3.2.3)."""

import torch
from conftest import TINY, build_vaswani, make_dictionary, random_batch


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    dictionary = make_dictionary(40)
    return dictionary, build_vaswani(dictionary, "vaswani_base", **dict(TINY, **overrides)).eval()


def test_step_by_step_equals_full_forward_with_beam_reordering():
    dictionary, model = tiny_model()
    src, src_lengths, prev = random_batch(dictionary, batch=3, src_len=8, tgt_len=6)
    prev = prev.masked_fill(prev.eq(dictionary.pad()), 7)  # full-length targets
    with torch.no_grad():
        full, _ = model(src, src_lengths, prev)
        encoder_out = model.encoder(src, src_lengths)
        state = {}
        order = torch.arange(3)
        for step in range(1, prev.size(1) + 1):
            logits, _ = model.decoder(prev[order, :step], encoder_out, incremental_state=state)
            torch.testing.assert_close(logits[:, 0], full[order, step - 1], atol=1e-5, rtol=1e-5)
            # shuffle the hypotheses as beam search does, and follow with the caches
            new_order = torch.tensor([2, 0, 1]) if step % 2 else torch.tensor([1, 1, 0])
            order = order[new_order]
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)


def test_future_target_tokens_do_not_change_earlier_outputs():
    dictionary, model = tiny_model(seed=1)
    src, src_lengths, prev = random_batch(dictionary, batch=2, src_len=6, tgt_len=7)
    prev = prev.masked_fill(prev.eq(dictionary.pad()), 9)
    changed = prev.clone()
    changed[:, 4:] = 5
    with torch.no_grad():
        a, _ = model(src, src_lengths, prev)
        b, _ = model(src, src_lengths, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_source_padding_changes_nothing():
    dictionary, model = tiny_model(seed=2)
    pad, eos = dictionary.pad(), dictionary.eos()
    sentence = torch.tensor([[8, 9, 10, eos]])
    prev = torch.tensor([[eos, 11, 12]])
    with torch.no_grad():
        alone, _ = model(sentence, torch.tensor([4]), prev)
        for padding in (1, 5):
            padded = torch.cat([torch.full((1, padding), pad), sentence], dim=1)
            out, _ = model(padded, torch.tensor([4]), prev)
            torch.testing.assert_close(out, alone, atol=1e-5, rtol=1e-5)
        # changing the pad symbols' positions' content must matter only if they are not pads
        other = torch.cat([torch.tensor([[13]]), sentence], dim=1)
        changed, _ = model(other, torch.tensor([5]), prev)
    assert not torch.allclose(changed, alone)


def test_target_padding_changes_nothing_for_real_positions():
    dictionary, model = tiny_model(seed=3)
    pad, eos = dictionary.pad(), dictionary.eos()
    src = torch.tensor([[8, 9, eos]] * 2)
    right = torch.tensor([[eos, 11, 12, pad, pad], [eos, 11, 12, 13, 14]])
    left = torch.tensor([[pad, pad, eos, 11, 12], [eos, 11, 12, 13, 14]])
    with torch.no_grad():
        out_right, _ = model(src, torch.tensor([3, 3]), right)
        out_left, _ = model(src, torch.tensor([3, 3]), left)
        alone, _ = model(src[:1], torch.tensor([3]), right[:1, :3])
    torch.testing.assert_close(out_right[0, :3], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_left[0, 2:], alone[0], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out_left).all()


def test_attention_weights_are_returned_only_when_asked():
    dictionary, model = tiny_model(seed=4)
    src, src_lengths, prev = random_batch(dictionary, batch=2, src_len=5, tgt_len=4)
    src[1, :2] = dictionary.pad()
    with torch.no_grad():
        _, fast = model(src, src_lengths, prev)
        _, slow = model(src, src_lengths, prev, need_attn=True)
    assert fast["attn"] == [None]
    attn = slow["attn"][0]
    assert attn.shape == (2, 4, 5)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4))
    pads = src.eq(dictionary.pad())
    assert pads.any() and attn.masked_select(pads[:, None, :].expand_as(attn)).abs().max() == 0
