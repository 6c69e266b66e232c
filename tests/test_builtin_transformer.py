"""The parameter-name mapping between our model and fairseq's built-in ``transformer``, in both
directions (user_plugin/artifacts/builtin_transformer.py)."""

import pytest
import torch
from conftest import TINY, build_vaswani, fake_task, make_dictionary, random_batch

from user_plugin.artifacts.builtin_transformer import (
    OurPositionsForFairseq,
    build_fairseq_transformer,
    copy_fairseq_weights_into_ours,
    copy_our_weights_into_fairseq,
)


def our_model(dictionary, learned_pos: bool, seed: int):
    torch.manual_seed(seed)
    return build_vaswani(dictionary, "vaswani_base", **dict(
        TINY, encoder_learned_pos=learned_pos, decoder_learned_pos=learned_pos)).eval()


@pytest.mark.parametrize("learned_pos", [False, True])
def test_ours_to_fairseq_and_back_is_the_identity_and_computes_the_same(learned_pos):
    dictionary = make_dictionary(50)
    ours = our_model(dictionary, learned_pos, seed=1)
    torch.manual_seed(2)
    theirs = build_fairseq_transformer(ours, fake_task(dictionary)).eval()
    copy_our_weights_into_fairseq(ours, theirs)

    again = our_model(dictionary, learned_pos, seed=3)
    before = {name: tensor.clone() for name, tensor in again.state_dict().items()}
    copy_fairseq_weights_into_ours(theirs, again)
    original = ours.state_dict()
    assert again.state_dict().keys() == original.keys()
    assert any(not torch.equal(before[name], original[name]) for name in original)
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, original[name]), name

    if not learned_pos:
        pad = dictionary.pad()
        theirs.encoder.embed_positions = OurPositionsForFairseq(ours.encoder.embed_positions, pad)
        theirs.decoder.embed_positions = OurPositionsForFairseq(ours.decoder.embed_positions, pad)
    src, src_lengths, prev = random_batch(dictionary, batch=4, src_len=9, tgt_len=7, seed=4)
    with torch.no_grad():
        our_logits, _ = ours(src, src_lengths, prev)
        their_logits, _ = theirs(src, src_lengths, prev)
    real = prev.ne(dictionary.pad())
    torch.testing.assert_close(our_logits[real], their_logits[real], atol=1e-5, rtol=1e-5)


def test_fairseq_to_ours_and_back_keeps_every_fairseq_tensor():
    dictionary = make_dictionary(50)
    ours = our_model(dictionary, learned_pos=True, seed=5)
    torch.manual_seed(6)
    theirs = build_fairseq_transformer(None, fake_task(dictionary), ours.cfg)
    original = {name: tensor.clone() for name, tensor in theirs.state_dict().items()}
    copy_fairseq_weights_into_ours(theirs, ours)
    torch.manual_seed(7)
    other = build_fairseq_transformer(ours, fake_task(dictionary))
    offset = dictionary.pad() + 1
    for name, tensor in other.state_dict().items():  # rows ours has no counterpart for
        if name.endswith("embed_positions.weight"):
            tensor[:offset] = original[name][:offset]
    copy_our_weights_into_fairseq(ours, other)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, original[name]), name
