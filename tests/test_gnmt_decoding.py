"""Paper-faithful decoding (§6.1): GNMT length penalty, per-sentence maximum length, no sentence
dropped by batching. Unit tests on scripted models (exact, fast), then the real CLI."""

import math

import numpy as np
import pytest
import torch
from cli import USER_DIR, run_fairseq
from conftest import make_dictionary
from fairseq.models import FairseqDecoder, FairseqEncoder, FairseqEncoderDecoderModel
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from user_plugin.generation import GNMTSequenceGenerator, gnmt_length_penalty
from user_plugin.tasks.vaswani_translation import (
    VaswaniTranslationConfig,
    VaswaniTranslationTask,
    restore_dropped_indices,
)

ALPHA = 0.6
TINY_PROB = 1e-12


class EchoEncoder(FairseqEncoder):
    """Keeps the source tokens as its 'output' (the scripted decoder ignores them)."""

    def forward(self, src_tokens, src_lengths=None, **unused):
        return {"encoder_out": [src_tokens.float()], "src_lengths": [src_lengths]}

    def reorder_encoder_out(self, encoder_out, new_order):
        return {k: [t.index_select(0, new_order) for t in v] for k, v in encoder_out.items()}


class ScriptedDecoder(FairseqDecoder):
    """Next-token probabilities given by ``table(last_token, position) -> {token: prob}``;
    tokens the table leaves out get TINY_PROB."""

    def __init__(self, dictionary, table):
        super().__init__(dictionary)
        self.table = table

    def forward(self, prev_output_tokens, encoder_out=None, **unused):
        batch, length = prev_output_tokens.shape
        logits = torch.full((batch, length, len(self.dictionary)), math.log(TINY_PROB))
        for b in range(batch):
            for t in range(length):
                for token, prob in self.table(int(prev_output_tokens[b, t]), t).items():
                    logits[b, t, token] = math.log(prob)
        return logits, None


def scripted_model(dictionary, table) -> FairseqEncoderDecoderModel:
    return FairseqEncoderDecoderModel(EchoEncoder(dictionary), ScriptedDecoder(dictionary, table))


def source_batch(dictionary, lengths):
    """Left-padded sources with ``lengths`` real tokens each, plus EOS (as fairseq batches)."""
    width = max(lengths) + 1
    src = torch.full((len(lengths), width), dictionary.pad(), dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, width - n - 1:-1] = dictionary.nspecial
        src[i, -1] = dictionary.eos()
    return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor(lengths) + 1}}


# tokens of the ranking scenario
X, Y, Z = 4, 5, 6
FILLERS = list(range(7, 107))


def two_finished_hypotheses_table(eos: int):
    """With beam 2, exactly two hypotheses finish: A = [x EOS] (|Y| = 2, log P = -2.0) at step 1
    and B = [y y y EOS] (|Y| = 4, log P = -2.603) at step 3; the path x z z ... never ends.

    |Y|^0.6 ranks B first (-1.133 > -1.320); GNMT ranks A first (-1.824 > -2.041).
    """
    p_eos_after_x = math.exp(-2.0 - math.log(0.5))
    keep_going = 0.8607

    def spread(mass):
        return {f: mass / len(FILLERS) for f in FILLERS}

    def table(last, t):
        if t == 0:
            return {X: 0.5, Y: 0.5}
        if last == X:
            return {eos: p_eos_after_x, Z: 1.0 - p_eos_after_x}
        if last == Z:
            return {Z: 1.0}
        if last == Y and t == 1:
            return {Y: 0.2, **spread(0.8)}
        if last == Y and t == 2:
            return {Y: keep_going, **spread(1.0 - keep_going)}
        if last == Y and t == 3:
            return {eos: keep_going, **spread(1.0 - keep_going)}
        return spread(1.0)

    return table


def decode(generator_cls, model, dictionary, sample, **kwargs):
    generator = generator_cls([model], dictionary, **kwargs)
    return generator.forward(sample)


def test_gnmt_and_fairseq_penalties_pick_different_winners():
    dictionary = make_dictionary(107)
    model = scripted_model(dictionary, two_finished_hypotheses_table(dictionary.eos()))
    sample = source_batch(dictionary, [3])
    eos = dictionary.eos()
    shared = {"beam_size": 2, "len_penalty": ALPHA, "max_len_b": 20}

    ours = decode(GNMTSequenceGenerator, model, dictionary, sample, **shared)[0]
    fairseq_form = decode(GNMTSequenceGenerator, model, dictionary, sample,
                          length_penalty_form="fairseq", **shared)[0]
    stock = decode(SequenceGenerator, model, dictionary, sample, **shared)[0]

    short, long_ = [X, eos], [Y, Y, Y, eos]
    assert [h["tokens"].tolist() for h in ours] == [short, long_]
    assert [h["tokens"].tolist() for h in fairseq_form] == [long_, short]
    assert [h["tokens"].tolist() for h in stock] == [long_, short]
    for hypo in ours:
        log_p = float(hypo["positional_scores"].sum())
        length = len(hypo["tokens"])
        assert float(hypo["score"]) == pytest.approx(log_p / ((5 + length) / 6) ** ALPHA, abs=1e-5)
    assert float(ours[0]["positional_scores"].sum()) == pytest.approx(-2.0, abs=1e-4)
    for mine, theirs in zip(fairseq_form, stock):
        assert float(mine["score"]) == pytest.approx(float(theirs["score"]), abs=1e-6)
        assert torch.allclose(mine["positional_scores"], theirs["positional_scores"])


def test_unnormalized_scores_stay_raw_log_probabilities():
    dictionary = make_dictionary(107)
    model = scripted_model(dictionary, two_finished_hypotheses_table(dictionary.eos()))
    hypos = decode(GNMTSequenceGenerator, model, dictionary, source_batch(dictionary, [3]),
                   beam_size=2, len_penalty=ALPHA, normalize_scores=False)[0]
    for hypo in hypos:
        assert float(hypo["score"]) == pytest.approx(float(hypo["positional_scores"].sum()),
                                                     abs=1e-5)


W = 7  # the good path's token (FILLERS also hold it; they only matter as junk mass)


def junk_endings_fill_the_beam_table(eos: int):
    """With beam 2, fairseq's rule ends the sentence at step 2 on two short junk hypotheses,
    [x EOS] (log P = log 0.24, GNMT score -1.301) and [x w EOS] (log 0.108, -1.873), while
    [x w w w EOS] (log 0.2514, -1.016) is still alive and scores better than both."""

    def table(last, t):
        if t == 0:
            return {X: 0.6, Y: 0.4}
        if last == X:
            return {eos: 0.4, W: 0.6}
        if last == Y:
            return {eos: 0.45, **{f: 0.55 / 99 for f in FILLERS[1:]}}
        if last == W and t == 2:
            return {eos: 0.3, W: 0.7}
        if last == W and t == 3:
            return {W: 0.999}
        if last == W and t == 4:
            return {eos: 0.999}
        return {f: 1.0 / 99 for f in FILLERS[1:]}

    return table


def test_no_better_rule_waits_for_the_better_live_hypothesis():
    dictionary = make_dictionary(107)
    eos = dictionary.eos()
    model = scripted_model(dictionary, junk_endings_fill_the_beam_table(eos))
    sample = source_batch(dictionary, [3])
    shared = {"beam_size": 2, "len_penalty": ALPHA, "max_len_over_source": 10}
    fairseq_rule = decode(GNMTSequenceGenerator, model, dictionary, sample, **shared)[0]
    paper_rule = decode(GNMTSequenceGenerator, model, dictionary, sample,
                        stop_rule="no-better", **shared)[0]
    assert [h["tokens"].tolist() for h in fairseq_rule] == [[X, eos], [X, W, eos]]
    assert [h["tokens"].tolist() for h in paper_rule] == [[X, W, W, W, eos], [X, eos]]
    for hypo in fairseq_rule + paper_rule:
        log_p = float(hypo["positional_scores"].sum())
        length = len(hypo["tokens"])
        assert float(hypo["score"]) == pytest.approx(log_p / ((5 + length) / 6) ** ALPHA, abs=1e-5)
    # the rule returns the better hypothesis: -1.01 against fairseq's rule's -1.30
    assert float(paper_rule[0]["score"]) > float(fairseq_rule[0]["score"]) + 0.25


def test_no_better_rule_changes_nothing_when_no_live_hypothesis_can_win():
    """On the penalty scenario the finished hypotheses already beat every live one."""
    dictionary = make_dictionary(107)
    model = scripted_model(dictionary, two_finished_hypotheses_table(dictionary.eos()))
    sample = source_batch(dictionary, [3])
    shared = {"beam_size": 2, "len_penalty": ALPHA, "max_len_over_source": 10}
    fairseq_rule = decode(GNMTSequenceGenerator, model, dictionary, sample, **shared)[0]
    paper_rule = decode(GNMTSequenceGenerator, model, dictionary, sample,
                        stop_rule="no-better", **shared)[0]
    assert ([h["tokens"].tolist() for h in paper_rule]
            == [h["tokens"].tolist() for h in fairseq_rule])


def never_ending_table(last, t):
    return {X: 0.6, Y: 0.4}


@pytest.mark.parametrize("over", [0, 3, 50])
def test_each_sentence_stops_at_its_own_source_length_plus_n(over):
    dictionary = make_dictionary(12)
    model = scripted_model(dictionary, never_ending_table)
    lengths = [8, 2, 5, 1]
    sample = source_batch(dictionary, lengths)
    out = decode(GNMTSequenceGenerator, model, dictionary, sample, beam_size=3,
                 len_penalty=ALPHA, max_len_over_source=over)
    for source_length, hypos in zip(lengths, out):
        assert len(hypos) == 3
        for hypo in hypos:
            tokens = hypo["tokens"].tolist()
            assert tokens[-1] == dictionary.eos()
            assert len(tokens) - 1 == source_length + over  # EOS not counted
            # the forced EOS keeps its true (tiny) model probability
            assert float(hypo["positional_scores"][-1]) < math.log(1e-6)


def test_fairseq_batch_wide_limit_is_what_we_replace():
    dictionary = make_dictionary(12)
    model = scripted_model(dictionary, never_ending_table)
    lengths = [8, 2]
    out = decode(SequenceGenerator, model, dictionary, source_batch(dictionary, lengths),
                 beam_size=2, max_len_a=1, max_len_b=3)
    # fairseq: padded width (8 + EOS) + 3 for every sentence, the short one included
    assert [len(h[0]["tokens"]) - 1 for h in out] == [12, 12]
    out = decode(GNMTSequenceGenerator, model, dictionary, source_batch(dictionary, lengths),
                 beam_size=2, max_len_a=1, max_len_b=3, max_len_over_source=-1)
    assert [len(h[0]["tokens"]) - 1 for h in out] == [12, 12]


def test_bad_length_penalty_form_is_refused():
    dictionary = make_dictionary(12)
    with pytest.raises(ValueError, match="length_penalty_form"):
        GNMTSequenceGenerator([scripted_model(dictionary, never_ending_table)], dictionary,
                              length_penalty_form="wu")


def test_gnmt_penalty_values():
    assert gnmt_length_penalty(1, ALPHA) == 1.0
    assert gnmt_length_penalty(7, ALPHA) == pytest.approx(2.0**ALPHA)
    assert gnmt_length_penalty(10, 0.0) == 1.0


def make_task(task_cls, config_cls, dictionary, **options):
    cfg = config_cls(**options)
    return task_cls(cfg, dictionary, dictionary)


def inference_dataset(task, dictionary, count=100, seed=0):
    rng = np.random.default_rng(seed)
    tokens = [torch.tensor([*rng.integers(4, len(dictionary), int(n)), dictionary.eos()])
              for n in rng.integers(1, 30, count)]
    lengths = torch.tensor([len(t) for t in tokens])
    return task.build_dataset_for_inference(tokens, lengths)


@pytest.mark.parametrize("max_sentences, max_tokens", [(64, None), (7, None), (None, 150)])
def test_batching_keeps_every_sentence(max_sentences, max_tokens):
    dictionary = make_dictionary(50)
    task = make_task(VaswaniTranslationTask, VaswaniTranslationConfig, dictionary)
    dataset = inference_dataset(task, dictionary)
    batches = task.get_batch_iterator(
        dataset, max_tokens=max_tokens, max_sentences=max_sentences,
        required_batch_size_multiple=8, disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=False)
    ids = sorted(int(i) for batch in batches for i in batch["id"])
    assert ids == list(range(100))


def test_fairseq_translation_task_drops_the_last_batch():
    """The cause: fairseq's batch_by_size deletes a final batch whose size is not a multiple
    of --required-batch-size-multiple (here 100 = 64 + 32 + 4: the 4 are lost)."""
    dictionary = make_dictionary(50)
    task = make_task(TranslationTask, TranslationConfig, dictionary)
    batches = task.get_batch_iterator(
        inference_dataset(task, dictionary), max_sentences=64, required_batch_size_multiple=8,
        disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=False)
    assert sum(len(batch["id"]) for batch in batches) < 100


def test_restore_dropped_indices_appends_missing_in_order():
    indices = np.array([5, 3, 9, 1, 7])
    restored = restore_dropped_indices(indices, [np.array([5, 3]), np.array([9, 1])])
    assert [list(b) for b in restored] == [[5, 3], [9, 1], [7]]
    complete = [np.array([5, 3, 9, 1, 7])]
    assert restore_dropped_indices(indices, complete) is complete


def test_task_builds_our_generator_with_its_options():
    dictionary = make_dictionary(12)
    task = make_task(VaswaniTranslationTask, VaswaniTranslationConfig, dictionary,
                     length_penalty_form="fairseq", max_len_over_source=7)
    from argparse import Namespace

    generator = task.build_generator([scripted_model(dictionary, never_ending_table)],
                                     Namespace(beam=4, lenpen=ALPHA))
    assert isinstance(generator, GNMTSequenceGenerator)
    assert generator.length_penalty_form == "fairseq"
    assert generator.max_len_over_source == 7
    assert (generator.max_len_a, generator.max_len_b) == (1, 7)
    assert generator.beam_size == 4


# ---------------------------------------------------------------- the real CLI


def parse_generate_output(text: str) -> dict:
    """fairseq-generate's S/H/P lines: id -> {"source": tokens, "hypos": [{"score", "tokens",
    "positional"}, ...]} (n-best in printed order)."""
    out: dict = {}
    for line in text.splitlines():
        kind, _, rest = line.partition("-")
        if kind not in ("S", "H", "P") or "\t" not in rest:
            continue
        head, *fields = rest.split("\t")
        entry = out.setdefault(int(head), {"hypos": []})
        if kind == "S":
            entry["source"] = fields[0].split()
        elif kind == "H":
            entry["hypos"].append({"score": float(fields[0]), "tokens": fields[1].split()})
        else:
            entry["hypos"][-1]["positional"] = [float(v) for v in fields[0].split()]
    return out


def generate(trained, *extra, subset="test"):
    proc = run_fairseq("generate", [
        trained.data_bin, "--user-dir", USER_DIR, "--task", "vaswani_translation",
        "--path", trained.checkpoint_dir / "checkpoint_last.pt", "--gen-subset", subset,
        "--cpu", "--beam", "4", "--lenpen", str(ALPHA), "--num-workers", "0", *extra,
    ])
    return parse_generate_output(proc.stdout), proc.stderr


def test_cli_scores_are_gnmt_normalized(trained_multi30k):
    hyps, _ = generate(trained_multi30k, "--batch-size", "64")
    assert len(hyps) == 100
    for entry in hyps.values():
        (hypo,) = entry["hypos"]
        positional = hypo["positional"]
        length = len(positional)
        assert length == len(hypo["tokens"]) + 1  # the P line also scores the EOS
        expected = sum(positional) / ((5 + length) / 6) ** ALPHA
        # P values are printed with 4 decimals
        assert hypo["score"] == pytest.approx(expected, abs=5e-5 * length + 1e-6)


@pytest.mark.parametrize("over", ["3", None])
def test_cli_outputs_respect_their_own_source_length(trained_multi30k, over):
    # sampling from a flattened distribution (EOS has about 1/V chance per step) makes long
    # outputs: the limit has to do the stopping
    extra = ["--batch-size", "64", "--sampling", "--nbest", "4", "--temperature", "10",
             "--seed", "1"]
    extra += ["--max-len-over-source", over] if over else []
    hyps, log = generate(trained_multi30k, *extra)
    limit = int(over) if over else 50
    assert f"source length (tokens, without EOS) + {limit}" in log
    assert len(hyps) == 100
    at_limit = 0
    for entry in hyps.values():
        assert len(entry["hypos"]) == 4
        for hypo in entry["hypos"]:
            output_tokens = len(hypo["positional"]) - 1
            assert output_tokens <= len(entry["source"]) + limit
            at_limit += output_tokens == len(entry["source"]) + limit
    # the limit binds, per sentence (a batch-wide limit would let short sources run longer)
    assert at_limit >= 10, at_limit


def test_cli_every_sentence_identically_at_any_batching(trained_multi30k):
    runs = {
        "batch 1": ["--batch-size", "1"],
        "batch 7": ["--batch-size", "7"],
        "batch 64": ["--batch-size", "64"],
        "max tokens 300": ["--max-tokens", "300"],
    }
    outputs = {}
    for name, extra in runs.items():
        hyps, _ = generate(trained_multi30k, *extra)  # default --required-batch-size-multiple 8
        assert sorted(hyps) == list(range(100)), name
        outputs[name] = {i: entry["hypos"][0]["tokens"] for i, entry in hyps.items()}
    reference = outputs.pop("batch 1")
    for name, out in outputs.items():
        assert out == reference, name
