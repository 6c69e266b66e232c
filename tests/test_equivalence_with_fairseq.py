"""Our model and fairseq's built-in ``transformer`` with the same hyperparameters and the same
weights compute the same function: training forward, incremental decoding, and beam search."""

import pytest
import torch
from conftest import TINY, build_vaswani, fake_task, make_dictionary, random_batch

from user_plugin.artifacts.builtin_transformer import (
    OurPositionsForFairseq,
    build_fairseq_transformer,
    copy_fairseq_weights_into_ours,
)

TOL = dict(atol=1e-5, rtol=1e-5)


def paired_models(learned_pos: bool, pre_norm: bool = False, seed: int = 0, **extra):
    """Ours and fairseq's with the same weights; ``extra``: more options, for both."""
    torch.manual_seed(seed)
    dictionary = make_dictionary(50)
    options = dict(TINY, encoder_learned_pos=learned_pos, decoder_learned_pos=learned_pos,
                   encoder_normalize_before=pre_norm, decoder_normalize_before=pre_norm)
    options.update(extra)
    ours = build_vaswani(dictionary, "vaswani_base", **options)
    theirs = build_fairseq_transformer(ours, fake_task(dictionary), ours.cfg)
    copy_fairseq_weights_into_ours(theirs, ours)
    if not learned_pos and not options.get("no_token_positional_embeddings"):
        pad = dictionary.pad()
        theirs.encoder.embed_positions = OurPositionsForFairseq(ours.encoder.embed_positions, pad)
        theirs.decoder.embed_positions = OurPositionsForFairseq(ours.decoder.embed_positions, pad)
    return dictionary, ours.eval(), theirs.eval()


@pytest.mark.parametrize("learned_pos", [True, False])
@pytest.mark.parametrize("pre_norm", [False, True])
def test_training_forward_matches_fairseq(learned_pos, pre_norm):
    dictionary, ours, theirs = paired_models(learned_pos, pre_norm)
    src, src_lengths, prev = random_batch(dictionary, batch=4, src_len=9, tgt_len=7)
    with torch.no_grad():
        our_logits, _ = ours(src, src_lengths, prev)
        their_logits, _ = theirs(src, src_lengths, prev)
    real = prev.ne(dictionary.pad())
    assert our_logits.shape == their_logits.shape
    torch.testing.assert_close(our_logits[real], their_logits[real], **TOL)


def test_incremental_decoding_matches_fairseq_step_by_step():
    dictionary, ours, theirs = paired_models(learned_pos=False)
    src, src_lengths, _ = random_batch(dictionary, batch=3, src_len=8)
    tokens = torch.randint(4, len(dictionary), (3, 6))
    tokens[:, 0] = dictionary.eos()
    with torch.no_grad():
        our_enc = ours.encoder(src, src_lengths)
        their_enc = theirs.encoder(src, src_lengths)
        our_state, their_state = {}, {}
        for step in range(1, tokens.size(1) + 1):
            ours_step, _ = ours.decoder(tokens[:, :step], our_enc, incremental_state=our_state)
            theirs_step, _ = theirs.decoder(
                tokens[:, :step], their_enc, incremental_state=their_state
            )
            torch.testing.assert_close(ours_step, theirs_step, **TOL)


def assert_same_beam_search(dictionary, ours, theirs, batch_seed: int) -> None:
    """Beam 4 over a random batch: the same hypotheses, in order, with the same scores."""
    from fairseq.sequence_generator import SequenceGenerator

    src, src_lengths, _ = random_batch(dictionary, batch=4, src_len=8, seed=batch_seed)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    results = []
    for model in (ours, theirs):
        generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_b=12)
        with torch.no_grad():
            results.append(generator.generate([model], sample))
    for ours_sent, theirs_sent in zip(*results):
        assert len(ours_sent) == len(theirs_sent) == 4
        for a, b in zip(ours_sent, theirs_sent):
            assert a["tokens"].tolist() == b["tokens"].tolist()
            torch.testing.assert_close(a["score"], b["score"], **TOL)


def test_beam_search_gives_fairseq_hypotheses_and_scores():
    dictionary, ours, theirs = paired_models(learned_pos=False, seed=3)
    assert_same_beam_search(dictionary, ours, theirs, batch_seed=5)


# options of fairseq's transformer beyond the paper: same options, same weights => same function
FAIRSEQ_OPTIONS = {
    "layernorm_embedding": dict(layernorm_embedding=True),
    "no_token_positional_embeddings": dict(no_token_positional_embeddings=True),
    "pre_norm_no_decoder_final_norm": dict(encoder_normalize_before=True,
                                           decoder_normalize_before=True,
                                           no_decoder_final_norm=True),
    "no_cross_attention": dict(no_cross_attention=True),
    "cross_self_attention": dict(cross_self_attention=True),
    "cross_self_attention_pre_norm": dict(cross_self_attention=True,
                                          encoder_normalize_before=True,
                                          decoder_normalize_before=True),
    "cross_self_attention_only": dict(cross_self_attention=True, no_cross_attention=True),
    "decoder_output_dim": dict(decoder_output_dim=24, share_all_embeddings=False),
    "adaptive_softmax": dict(adaptive_softmax_cutoff=[20, 35], adaptive_softmax_factor=2,
                             share_all_embeddings=False),
    "decoder_layers_to_keep": dict(decoder_layers=3, decoder_layers_to_keep="0,2"),
}


def log_probs(model, net_output):
    return model.get_normalized_probs(net_output, log_probs=True)


@pytest.mark.parametrize("option", sorted(FAIRSEQ_OPTIONS))
def test_training_forward_matches_fairseq_with_option(option):
    dictionary, ours, theirs = paired_models(False, seed=7, **FAIRSEQ_OPTIONS[option])
    src, src_lengths, prev = random_batch(dictionary, batch=4, src_len=9, tgt_len=7, seed=2)
    with torch.no_grad():
        our_out = log_probs(ours, ours(src, src_lengths, prev))
        their_out = log_probs(theirs, theirs(src, src_lengths, prev))
    real = prev.ne(dictionary.pad())
    assert our_out.shape == their_out.shape
    torch.testing.assert_close(our_out[real], their_out[real], **TOL)


@pytest.mark.parametrize("option", sorted(FAIRSEQ_OPTIONS))
def test_incremental_decoding_matches_fairseq_with_option(option):
    dictionary, ours, theirs = paired_models(False, seed=8, **FAIRSEQ_OPTIONS[option])
    src, src_lengths, _ = random_batch(dictionary, batch=3, src_len=8, seed=4)
    tokens = torch.randint(4, len(dictionary), (3, 6))
    tokens[:, 0] = dictionary.eos()
    with torch.no_grad():
        our_enc = ours.encoder(src, src_lengths)
        their_enc = theirs.encoder(src, src_lengths)
        our_state, their_state = {}, {}
        for step in range(1, tokens.size(1) + 1):
            ours_step = ours.decoder(tokens[:, :step], our_enc, incremental_state=our_state)
            theirs_step = theirs.decoder(tokens[:, :step], their_enc,
                                         incremental_state=their_state)
            torch.testing.assert_close(log_probs(ours, ours_step),
                                       log_probs(theirs, theirs_step), **TOL)


@pytest.mark.parametrize("option", sorted(FAIRSEQ_OPTIONS))
def test_beam_search_matches_fairseq_with_option(option):
    dictionary, ours, theirs = paired_models(False, seed=9, **FAIRSEQ_OPTIONS[option])
    assert_same_beam_search(dictionary, ours, theirs, batch_seed=6)
