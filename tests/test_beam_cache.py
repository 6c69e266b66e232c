"""Beam-search caches (§3.2.3, §6.1): same outputs as a full forward, no copies on reorders."""

import pytest
import torch
from conftest import TINY, beam_search_start, build_vaswani, make_dictionary, random_batch

from user_plugin.modules import beam_state
from user_plugin.modules.beam_cache import SelfAttentionCache
from user_plugin.modules.beam_state import BeamLayout, BeamState


def tiny_model(seed=0):
    torch.manual_seed(seed)
    dictionary = make_dictionary(40)
    return dictionary, build_vaswani(dictionary, "vaswani_base", **TINY).eval()


def self_attention_caches(model, state):
    caches = []
    for layer in model.decoder.layers:
        cache = layer.self_attn.get_incremental_state(state, "attn_cache")
        caches.append(cache["cache"])
    return caches


def decoder_beam(model, state) -> BeamState:
    return model.decoder.get_incremental_state(state, "beam")["state"]


def test_beam_search_reorders_follow_the_full_forward(monkeypatch):
    """Three sentences x beam 3, expanded the way fairseq's SequenceGenerator does. Reorders
    inside sentences, a sentence leaving the batch, then a reorder across sentences (the
    fallback); a small initial capacity makes the buffers grow. Every step's logits equal the
    full forward of each hypothesis' own prefix."""
    monkeypatch.setattr(beam_state, "INITIAL_CAPACITY", 2)
    dictionary, model = tiny_model()
    beam, steps = 3, 9
    src, src_lengths, _ = random_batch(dictionary, batch=3, src_len=6, tgt_len=2)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths)
        expand = torch.arange(3).repeat_interleave(beam)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, expand)
        assert encoder_out["beam_layout"][0].group == beam
        sentence_of_row = expand.clone()
        prefixes = torch.full((9, 1), dictionary.eos())
        state = {}
        for step in range(steps):
            logits, _ = model.decoder(prefixes, encoder_out, incremental_state=state)
            full, _ = model(src[sentence_of_row], src_lengths[sentence_of_row], prefixes)
            torch.testing.assert_close(logits[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)
            rows = prefixes.size(0)
            if step == 4:  # sentence 1 finishes: rows of sentences 0 and 2 remain, reordered
                groups = torch.tensor([0, 2])
            else:
                groups = torch.arange(rows // beam)
            within = torch.randint(0, beam, (groups.numel(), beam), generator=gen)
            new_order = (groups[:, None] * beam + within).reshape(-1)
            if step == 6:  # hypotheses move across sentences: every cache falls back
                new_order = new_order.roll(1)
            before = encoder_out
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            if step in (0, 1, 2, 3):  # inside sentences: nothing copied
                assert encoder_out is before
            sentence_of_row = sentence_of_row[new_order]
            next_tokens = torch.randint(4, len(dictionary), (new_order.numel(), 1), generator=gen)
            prefixes = torch.cat([prefixes[new_order], next_tokens], dim=1)
        caches = self_attention_caches(model, state)
        assert decoder_beam(model, state).layout.group == 1  # fell back at step 6
        assert all(cache.keys.size(2) == 1 for cache in caches)
        assert all(cache.keys.size(1) >= steps for cache in caches)


def test_reorders_inside_sentences_copy_no_keys():
    dictionary, model = tiny_model(seed=1)
    src, src_lengths, _ = random_batch(dictionary, batch=2, src_len=5, tgt_len=2)
    with torch.no_grad():
        encoder_out = model.encoder.reorder_encoder_out(
            model.encoder(src, src_lengths), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        )
        state = {}
        prefixes = torch.full((8, 1), dictionary.eos())
        model.decoder(prefixes, encoder_out, incremental_state=state)
        caches = self_attention_caches(model, state)
        beam = decoder_beam(model, state)
        assert [cache.keys.size(2) for cache in caches] == [4] * len(caches)
        assert beam.layout.group == 4
        pointers = [cache.keys.data_ptr() for cache in caches]
        model.decoder.reorder_incremental_state_scripting(
            state, torch.tensor([3, 3, 1, 0, 6, 4, 4, 5])
        )
        assert [cache.keys.data_ptr() for cache in caches] == pointers
        assert beam.ancestry[:, 0].tolist() == [3, 3, 1, 0, 2, 0, 0, 1]
        model.decoder(prefixes, encoder_out, incremental_state=state)
        assert beam.ancestry[:, :2].tolist() == [
            [3, 0], [3, 1], [1, 2], [0, 3], [2, 0], [0, 1], [0, 2], [1, 3]
        ]


def test_attention_weights_are_each_hypothesis_own_prefix():
    torch.manual_seed(2)
    heads, dim, sentences, group, steps = 2, 8, 2, 3, 5
    beam = BeamState(BeamLayout(sentences, group), torch.device("cpu"))
    cache = SelfAttentionCache(beam, heads, dim // heads, dim // heads)
    rows = sentences * group
    own_keys, own_values = [], []  # per-row prefixes, copied the classic way
    for step in range(steps):
        key, value = torch.randn(rows, 1, dim), torch.randn(rows, 1, dim)
        beam.advance(rows)
        cache.append(key, value)
        own_keys.append(key)
        own_values.append(value)
        if step < steps - 1:
            order = (torch.arange(sentences)[:, None] * group
                     + torch.randint(0, group, (sentences, group))).reshape(-1)
            cache.reorder(beam.follow(order))
            own_keys = [k[order] for k in own_keys]
            own_values = [v[order] for v in own_values]
    query = torch.randn(rows, 1, dim)
    context, weights = cache.attend(query, need_weights=True)
    fast, none = cache.attend(query)
    assert none is None
    keys = torch.cat(own_keys, 1).view(rows, steps, heads, -1).transpose(1, 2)
    values = torch.cat(own_values, 1).view(rows, steps, heads, -1).transpose(1, 2)
    q = query.view(rows, 1, heads, -1).transpose(1, 2)
    probs = torch.softmax(q @ keys.transpose(-1, -2) / (dim // heads) ** 0.5, dim=-1)
    expected = (probs @ values).transpose(1, 2).reshape(rows, 1, dim)
    torch.testing.assert_close(weights, probs)
    torch.testing.assert_close(context, expected)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=1e-5)


def test_one_step_at_a_time_and_batch_changes_must_be_reordered():
    beam = BeamState(BeamLayout(2, 2), torch.device("cpu"))
    cache = SelfAttentionCache(beam, 2, 4, 4)
    beam.advance(4)
    with pytest.raises(ValueError, match="one step at a time"):
        cache.append(torch.randn(4, 2, 8), torch.randn(4, 2, 8))
    cache.append(torch.randn(4, 1, 8), torch.randn(4, 1, 8))
    with pytest.raises(ValueError, match="reorder_incremental_state"):
        cache.append(torch.randn(2, 1, 8), torch.randn(2, 1, 8))
    with pytest.raises(ValueError, match="reorder_incremental_state"):
        beam.advance(2)
    with pytest.raises(ValueError, match="group"):
        BeamLayout(2, 0)


def test_layout_reads_each_reorder_once_for_every_cache():
    layout = BeamLayout.of_expansion(torch.tensor([0, 0, 0, 1, 1, 1]), rows=2)
    assert layout == BeamLayout(2, 3)
    assert BeamLayout.of_expansion(torch.tensor([0, 1]), rows=2) is None
    assert BeamLayout.of_expansion(torch.tensor([1, 1, 0, 0]), rows=2) is None
    inside = layout.follow(torch.tensor([2, 0, 0, 4, 3, 3]))
    assert inside.sentences is None and inside.after == layout
    leaving = layout.follow(torch.tensor([5, 3, 4]))
    assert leaving.sentences.tolist() == [1] and leaving.after == BeamLayout(1, 3)
    across = layout.follow(torch.tensor([0, 1, 3, 4, 2, 5]))
    assert across.ungroups and across.after == BeamLayout(6, 1)
    assert across.sentences.tolist() == [0, 0, 1, 1, 0, 1]


def test_step_by_step_attention_weights_equal_the_full_forward():
    """Both attentions' probabilities per hypothesis, from the per-sentence caches, equal those
    of the full forward of each hypothesis' prefix (what alignments and plots read)."""
    dictionary, model = tiny_model(seed=3)
    beam = 2
    src, src_lengths, _ = random_batch(dictionary, batch=2, src_len=6, tgt_len=2)
    src[1, :2] = dictionary.pad()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        expand = torch.arange(2).repeat_interleave(beam)
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths), expand)
        rows, state = expand.clone(), {}
        prefixes = torch.full((4, 1), dictionary.eos())
        for _ in range(4):
            _, extra = model.decoder(prefixes, encoder_out, incremental_state=state,
                                     need_attn=True)
            _, full = model(src[rows], src_lengths[rows], prefixes, need_attn=True)
            for ours, theirs in zip(extra["layer_attn"], full["layer_attn"]):
                for name in ("self_attn", "encoder_attn"):
                    torch.testing.assert_close(ours[name][:, :, 0], theirs[name][:, :, -1],
                                               atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(extra["attn"][0][:, 0], full["attn"][0][:, -1],
                                       atol=1e-5, rtol=1e-5)
            within = torch.randint(0, beam, (2, beam), generator=gen)
            new_order = (torch.arange(2)[:, None] * beam + within).reshape(-1)
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            rows = rows[new_order]
            tokens = torch.randint(4, len(dictionary), (4, 1), generator=gen)
            prefixes = torch.cat([prefixes[new_order], tokens], dim=1)


@pytest.mark.parametrize("overrides", [{}, {"cross_self_attention": True}],
                         ids=["self_attention", "cross_self_attention"])
def test_leaving_sentences_move_into_freed_rows_and_decoding_follows_the_full_forward(
        overrides, monkeypatch):
    """Five sentences x beam 3. Sentences leave from the front and the middle (the caches
    then hold sentences in another order than the batch), one is continued twice (the caches
    gather anew), then hypotheses move across sentences (the fall-back). Every step's logits
    and both attentions' probabilities equal the full forward of each hypothesis' prefix."""
    monkeypatch.setattr(beam_state, "INITIAL_CAPACITY", 4)
    torch.manual_seed(4)
    dictionary = make_dictionary(40)
    model = build_vaswani(dictionary, "vaswani_base", **TINY, **overrides).eval()
    beam, steps = 3, 9
    src, src_lengths, _ = random_batch(dictionary, batch=5, src_len=6, tgt_len=2, seed=3)
    gen = torch.Generator().manual_seed(11)
    leaving = {1: [1, 2, 3, 4], 3: [0, 3], 5: [1, 1], 7: None}
    with torch.no_grad():
        encoder_out, sentence_of_row, prefixes = beam_search_start(model, dictionary, src,
                                                                   src_lengths, beam)
        state = {}
        for step in range(steps):
            logits, extra = model.decoder(prefixes, encoder_out, incremental_state=state,
                                          need_attn=True)
            full, full_extra = model(src[sentence_of_row], src_lengths[sentence_of_row],
                                     prefixes, need_attn=True)
            torch.testing.assert_close(logits[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)
            for ours, theirs in zip(extra["layer_attn"], full_extra["layer_attn"]):
                for name, weights in ours.items():
                    if weights is not None:
                        torch.testing.assert_close(weights[:, :, 0], theirs[name][:, :, -1],
                                                   atol=1e-5, rtol=1e-5)
            rows = prefixes.size(0)
            groups = torch.tensor(leaving.get(step) or list(range(rows // beam)))
            within = torch.randint(0, beam, (groups.numel(), beam), generator=gen)
            new_order = (groups[:, None] * beam + within).reshape(-1)
            if step == 7:
                new_order = new_order.roll(1)
            caches = self_attention_caches(model, state)
            pointers = [cache.keys.data_ptr() for cache in caches] if not overrides else None
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            state_now = decoder_beam(model, state)
            if step == 1:  # sentence 0 left: sentence 4 moved into its row, in place
                assert state_now.buffer_rows.tolist() == [1, 2, 3, 0]
                if pointers is not None:
                    assert [cache.keys.data_ptr() for cache in caches] == pointers
                    # each layer's encoder cache owns the mask whose rows it moves in place
                    masks = [layer.encoder_attn.get_incremental_state(state, "attn_cache")
                             ["cache"].mask for layer in model.decoder.layers]
                    assert masks[0].data_ptr() != masks[1].data_ptr()
            if step == 3:  # rows 1 and 0 hold the two sentences left: nothing moved
                assert state_now.buffer_rows.tolist() == [1, 0]
            if step == 5:  # one sentence continued twice: gathered anew, in the batch's order
                assert state_now.buffer_rows is None
            sentence_of_row = sentence_of_row[new_order]
            next_tokens = torch.randint(4, len(dictionary), (new_order.numel(), 1), generator=gen)
            prefixes = torch.cat([prefixes[new_order], next_tokens], dim=1)
        assert decoder_beam(model, state).layout.group == 1


def test_compaction_copies_only_as_many_sentences_as_left():
    beam = BeamState(BeamLayout(5, 2), torch.device("cpu"))
    beam.advance(10)
    first = beam.follow(torch.tensor([2, 3, 4, 5, 6, 7, 8, 9]))  # sentence 0 leaves
    assert [t.tolist() for t in first.moves] == [[0], [4]]
    assert beam.buffer_rows.tolist() == [1, 2, 3, 0]
    order = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33], [40, 41, 42, 43]])
    buffer = torch.zeros(5, 4, dtype=torch.long)
    buffer[:4] = order[[3, 0, 1, 2]]  # buffer row r holds the batch's sentence argsort(rows)[r]
    torch.testing.assert_close(beam.from_buffer(buffer[:4]), order)
    torch.testing.assert_close(beam.to_buffer(order), buffer[:4])
    second = beam.follow(torch.tensor([0, 1, 6, 7]))  # keeps the batch's sentences 0 and 3
    assert second.moves is None and beam.buffer_rows.tolist() == [1, 0]
    third = beam.follow(torch.tensor([2, 3, 0, 1]))  # the two swap: rows follow, nothing moves
    assert third.moves is None and beam.buffer_rows is None
