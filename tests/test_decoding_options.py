"""Every decoding option of fairseq-generate / fairseq-interactive with our model, through the
real command lines, on a small model trained here (docs/decoding.md).

For each option (the parametrized ``test_option_*`` tests):

* under ``--task translation``, our model and fairseq's own ``transformer`` holding the same
  weights (``python -m user_plugin.export --to fairseq``) print the same hypotheses, scores and
  alignments;
* under ``--task vaswani_translation``, a property of the option holds on our model's output
  (constraint tokens appear, alignments point inside the source, groups differ...), and the
  paper's decoding composes with it: every sentence is decoded, every output holds at most its
  own source length + 50 tokens, and every score is ``log P / ((5 + |Y|) / 6) ** 0.6``.

Then the parts, in-process: alignment layer, heads and full context against fairseq's decoder;
the diverse beam search and constrained search fixes against fairseq's originals; the option
checks; ``--replace-unk``'s alignment formats; the hub's decoding options.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import forked_cli
import pytest
import torch
from cli import REPO, USER_DIR, fairseq_env, run_fairseq
from conftest import TINY, build_vaswani, fake_task, make_dictionary, random_batch

ALPHA = 0.6
SENTENCES = 30  # test sentences decoded per run


# ---------------------------------------------------------------- the model and the runs


def export_to_fairseq(checkpoint: Path, data_bin: Path, output: Path) -> Path:
    """Our checkpoint as one of fairseq's own ``transformer`` (``python -m user_plugin.export
    --to fairseq``: the same function, our §3.5 sinusoids held as its learned table)."""
    proc = forked_cli.run(
        [sys.executable, "-m", "user_plugin.export", str(checkpoint), "--data-dir",
         str(data_bin), "--to", "fairseq", "--output", str(output)],
        cwd=REPO, env=fairseq_env(), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return output


@pytest.fixture(scope="module")
def setup(trained_multi30k, tmp_path_factory) -> SimpleNamespace:
    """The tiny ``vaswani_base`` of the shared fixture (checkpoints after 20 and 60 updates),
    the same weights as fairseq's ``transformer``, and the first test sentences as a raw-text
    dataset (``--dataset-impl raw``, which ``--replace-unk`` needs)."""
    root = tmp_path_factory.mktemp("decoding_options")
    data_bin = trained_multi30k.data_bin
    raw = root / "raw"
    raw.mkdir()
    for lang in ("en", "de"):
        (raw / f"dict.{lang}.txt").write_bytes((data_bin / f"dict.{lang}.txt").read_bytes())
        lines = (trained_multi30k.text_dir / f"test.{lang}").read_text(encoding="utf-8")
        (raw / f"test.en-de.{lang}").write_text(
            "\n".join(lines.splitlines()[:SENTENCES]) + "\n", encoding="utf-8")
    last = trained_multi30k.checkpoint_dir / "checkpoint_last.pt"
    early = next(trained_multi30k.checkpoint_dir.glob("checkpoint_*_20.pt"))
    return SimpleNamespace(
        root=root, raw=raw, ours=last, ours_early=early,
        builtin=export_to_fairseq(last, data_bin, root / "builtin_last.pt"),
        builtin_early=export_to_fairseq(early, data_bin, root / "builtin_early.pt"),
    )


def parse_output(text: str) -> dict:
    """fairseq-generate / -interactive lines: id -> {"source", "target", "constraints",
    "hypos": [{"score", "tokens", "positional", "alignment"}]} (hypotheses in printed order)."""
    out: dict = {}
    for line in text.splitlines():
        kind, _, rest = line.partition("-")
        if kind not in ("S", "T", "H", "P", "A", "C") or "\t" not in rest:
            continue
        head, *fields = rest.split("\t")
        if not head.isdigit():
            continue
        entry = out.setdefault(int(head), {"hypos": [], "constraints": []})
        if kind == "S":
            entry["source"] = fields[0].split()
        elif kind == "T":
            entry["target"] = [t.replace("<<unk>>", "<unk>") for t in fields[0].split()]
        elif kind == "C":
            entry["constraints"].append(fields[0].split())
        elif kind == "H":
            entry["hypos"].append({"score": float(fields[0]), "tokens": fields[1].split()})
        elif kind == "P":
            entry["hypos"][-1]["positional"] = [float(v) for v in fields[0].split()]
        else:
            entry["hypos"][-1]["alignment"] = fields[0].split() if fields else []
    return out


def decode(setup, task: str, paths: str, extra: list, tool: str = "generate",
           reseed: bool = False, data: Path | None = None) -> dict:
    """Run ``tool`` on the raw test sentences of ``data`` (default: the setup's), with
    ``paths`` (checkpoints joined by ':')."""
    data = data or setup.raw
    args = ["--user-dir", USER_DIR, "--task", task, "--path", paths, "--cpu",
            "--source-lang", "en", "--target-lang", "de", "--beam", "4", "--lenpen", str(ALPHA),
            "--num-workers", "0"]
    if tool == "generate":
        args = [data, "--dataset-impl", "raw", "--gen-subset", "test", "--batch-size", "8",
                "--required-batch-size-multiple", "1", *args]
    else:
        args = [data, *args]
    args = [str(a) for a in [*args, *extra]]
    if reseed:
        cmd = [sys.executable, str(REPO / "tests" / "reseeded_generate.py"), *args]
        proc = forked_cli.run(cmd, env=fairseq_env(), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        proc = run_fairseq(tool, args)
    return parse_output(proc.stdout)


def interactive_input(setup, name: str, constraints: bool, reverse: bool = False) -> Path:
    """The raw test sentences as fairseq-interactive input; with ``constraints``, each line
    carries two words of its reference (known to the dictionary) as constraints."""
    vocabulary = {line.split()[0] for line in (setup.raw / "dict.de.txt").read_text(
        encoding="utf-8").splitlines()}
    sources = (setup.raw / "test.en-de.en").read_text(encoding="utf-8").splitlines()
    targets = (setup.raw / "test.en-de.de").read_text(encoding="utf-8").splitlines()
    lines = []
    for source, target in zip(sources, targets):
        fields = [source]
        if constraints:
            words = [w for w in target.split() if w in vocabulary and len(w) > 3][:2]
            fields += words[::-1] if reverse else words
        lines.append("\t".join(fields))
    path = setup.root / f"{name}.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- checks of outputs


def assert_same_output(ours: dict, theirs: dict, soft: bool = False, may_differ: int = 0) -> None:
    """Same sentences, same hypotheses in the same order, scores and alignments alike; with
    ``may_differ``, that many sentences may have other hypotheses."""
    assert sorted(ours) == sorted(theirs)
    differ = [i for i in ours if [h["tokens"] for h in ours[i]["hypos"]]
              != [h["tokens"] for h in theirs[i]["hypos"]]]
    assert len(differ) <= may_differ, differ
    for i in ours:
        if i in differ:
            continue
        mine, other = ours[i]["hypos"], theirs[i]["hypos"]
        for a, b in zip(mine, other):
            # a score is a sum over the hypothesis's tokens (unnormalized, up to several hundred
            # nats for a long one): float32's rounding grows with it, hence the relative term
            assert a["score"] == pytest.approx(b["score"], abs=1e-4, rel=1e-6), i
            assert a["positional"] == pytest.approx(b["positional"], abs=2e-4), i
            if soft:
                for row_a, row_b in zip(a["alignment"], b["alignment"]):
                    assert [float(v) for v in row_a.split(",")] == pytest.approx(
                        [float(v) for v in row_b.split(",")], abs=1e-4)
            else:
                assert a.get("alignment") == b.get("alignment"), i


def assert_paper_decoding(out: dict, normalized: bool = True, sentences: int = SENTENCES,
                          per_sentence: int = 1) -> None:
    """Every sentence decoded, each output within its source + 50 tokens, and each score the
    GNMT-normalized log-probability (raw with ``normalized=False``)."""
    assert sorted(out) == list(range(sentences))
    for entry in out.values():
        assert len(entry["hypos"]) == per_sentence
        for hypo in entry["hypos"]:
            positional = hypo["positional"]
            assert len(hypo["tokens"]) <= len(entry["source"]) + 50
            divisor = ((5 + len(positional)) / 6) ** ALPHA if normalized else 1.0
            # P values are printed with 4 decimals
            assert hypo["score"] == pytest.approx(sum(positional) / divisor,
                                                  abs=5e-5 * len(positional) + 1e-6)


def hard_pairs(hypo: dict) -> list:
    return [tuple(int(v) for v in pair.split("-")) for pair in hypo["alignment"]]


def check_alignment_inside_source(out: dict, base: dict) -> None:
    """Each output token (EOS excluded) is aligned to exactly one source token, inside the
    source."""
    for entry in out.values():
        for hypo in entry["hypos"]:
            pairs = hard_pairs(hypo)
            assert sorted(t for _, t in pairs) == list(range(len(hypo["tokens"])))
            assert all(0 <= s < len(entry["source"]) for s, _ in pairs)


def check_hard_alignment(out: dict, base: dict) -> None:
    """Alignments inside the source, of the very hypotheses of plain decoding."""
    check_alignment_inside_source(out, base)
    for i, entry in out.items():
        assert entry["hypos"][0]["tokens"] == base[i]["hypos"][0]["tokens"]


def check_soft_alignment(out: dict, base: dict) -> None:
    """One row of scores per output token and EOS, over the source tokens and EOS, each row a
    distribution."""
    for entry in out.values():
        hypo = entry["hypos"][0]
        assert len(hypo["alignment"]) == len(hypo["tokens"]) + 1
        for row in hypo["alignment"]:
            values = [float(v) for v in row.split(",")]
            assert len(values) == len(entry["source"]) + 1
            assert sum(values) == pytest.approx(1.0, abs=1e-4)


def check_replace_unk(out: dict, base: dict) -> None:
    """Where plain decoding output <unk>, the output holds the source word it is aligned to."""
    replaced = 0
    for i, entry in out.items():
        hypo, plain = entry["hypos"][0], base[i]["hypos"][0]["tokens"]
        assert len(hypo["tokens"]) == len(plain)
        source_of = {t: s for s, t in reversed(hard_pairs(hypo))}
        for position, (token, before) in enumerate(zip(hypo["tokens"], plain)):
            if before == "<unk>":
                assert token == entry["source"][source_of[position]]
                replaced += 1
            else:
                assert token == before
    assert replaced > 0


def check_samples(out: dict, base: dict) -> None:
    """Samples vary: not all sentences get their beam search output three times."""
    assert any(len({" ".join(h["tokens"]) for h in entry["hypos"]}) > 1
               for entry in out.values())


def check_groups_differ(out: dict, base: dict) -> None:
    """Diverse groups start differently: more distinct first tokens than beam search's n-best."""
    assert len({h["tokens"][0] for e in out.values() for h in e["hypos"]}) > len(
        {h["tokens"][0] for e in base.values() for h in e["hypos"]})


def check_nbest(out: dict, base: dict) -> None:
    for i, entry in out.items():
        tokens = [" ".join(h["tokens"]) for h in entry["hypos"]]
        assert len(set(tokens)) == len(tokens) == 3
        scores = [h["score"] for h in entry["hypos"]]
        assert scores == sorted(scores, reverse=True)
        assert entry["hypos"][0]["tokens"] == base[i]["hypos"][0]["tokens"]


def check_prefix(out: dict, base: dict) -> None:
    for entry in out.values():
        assert entry["hypos"][0]["tokens"][:2] == entry["target"][:2]


def check_reference(out: dict, base: dict) -> None:
    for entry in out.values():
        assert entry["hypos"][0]["tokens"] == entry["target"]


def check_source_length(out: dict, base: dict) -> None:
    """fairseq's --match-source-len: as many output tokens as source tokens with their EOS."""
    for entry in out.values():
        assert len(entry["hypos"][0]["tokens"]) == len(entry["source"]) + 1


def check_no_repeated_bigram(out: dict, base: dict) -> None:
    for entry in out.values():
        tokens = entry["hypos"][0]["tokens"]
        bigrams = list(zip(tokens, tokens[1:]))
        assert len(bigrams) == len(set(bigrams))
    assert out != base


def count_unk(out: dict) -> int:
    return sum(e["hypos"][0]["tokens"].count("<unk>") for e in out.values())


def check_fewer_unk(out: dict, base: dict) -> None:
    assert count_unk(out) < count_unk(base)


def check_differs(out: dict, base: dict) -> None:
    assert any(out[i]["hypos"][0]["tokens"] != base[i]["hypos"][0]["tokens"] for i in out)


def check_nothing(out: dict, base: dict) -> None:
    """No property beyond the paper's decoding (checked for every option)."""


@dataclass
class Option:
    """A decoding option: its arguments, and the property its output must have."""

    name: str
    args: list
    check: Callable[[dict, dict], None]
    per_sentence: int = 1
    normalized: bool = True
    soft: bool = False
    # sampling: compare with the built-in sample for sample, one sentence per batch and the
    # random state reset before each; the two models' probabilities differ by float rounding
    # (1e-7), which can send a draw across the boundary between two nearly tied tokens, so one
    # sentence in ten may differ
    reseed: bool = False
    # compared with the built-in's output (not with dropout: fairseq's transformer is
    # time-major, so the same random draws mask other units)
    builtin: bool = True
    paths: Callable = field(default=lambda s: (f"{s.ours}", f"{s.builtin}"))


SAMPLING = ["--sampling", "--beam", "3", "--nbest", "3", "--seed", "7", "--batch-size", "1"]
OPTIONS = [
    Option("print-alignment", ["--print-alignment"], check_hard_alignment),
    Option("print-alignment-soft", ["--print-alignment", "soft"], check_soft_alignment,
           soft=True),
    Option("replace-unk", ["--replace-unk", "--print-alignment"], check_replace_unk),
    Option("sampling-topk", [*SAMPLING, "--sampling-topk", "5"], check_samples,
           per_sentence=3, reseed=True),
    Option("sampling-topp", [*SAMPLING, "--sampling-topp", "0.7"], check_samples,
           per_sentence=3, reseed=True),
    Option("temperature", [*SAMPLING, "--temperature", "0.7"], check_samples,
           per_sentence=3, reseed=True),
    # under --task translation fairseq's own diverse search fails on every batch but the first,
    # with fairseq's model and ours alike: only our task's generator has the fixed search
    Option("diverse-beam-groups", ["--diverse-beam-groups", "2", "--diverse-beam-strength",
                                   "5", "--nbest", "4"], check_groups_differ, per_sentence=4,
           builtin=False),
    Option("diversity-rate", ["--diversity-rate", "0.5", "--nbest", "4"], check_nothing,
           per_sentence=4),
    Option("prefix-size", ["--prefix-size", "2"], check_prefix),
    Option("nbest", ["--nbest", "3"], check_nbest, per_sentence=3),
    Option("score-reference", ["--score-reference"], check_reference),
    Option("match-source-len", ["--match-source-len"], check_source_length),
    Option("no-repeat-ngram-size", ["--no-repeat-ngram-size", "2"], check_no_repeated_bigram),
    Option("unkpen", ["--unkpen", "5"], check_fewer_unk),
    Option("unnormalized", ["--unnormalized"], check_nothing, normalized=False),
    Option("retain-dropout", ["--retain-dropout", "--seed", "3"], check_differs, builtin=False),
    Option("ensemble-ours", [], check_nothing,
           paths=lambda s: (f"{s.ours}:{s.ours_early}", f"{s.builtin}:{s.builtin_early}")),
    Option("ensemble-with-builtin", ["--print-alignment"], check_alignment_inside_source,
           paths=lambda s: (f"{s.ours}:{s.builtin_early}", f"{s.builtin}:{s.builtin_early}")),
]


@pytest.fixture(scope="module")
def baselines(setup) -> dict:
    """Our model's plain output under --task vaswani_translation: beam 4, and its 4-best."""
    return {
        "beam": decode(setup, "vaswani_translation", setup.ours, []),
        "nbest4": decode(setup, "vaswani_translation", setup.ours, ["--nbest", "4"]),
    }


COMPARED = [o for o in OPTIONS if o.builtin]
#: Options whose fairseq 0.12 search fails on a CPU, fixed for our model under every task.
FIXED_UNDER_EVERY_TASK = {"no-repeat-ngram-size"}


@pytest.mark.parametrize("option", COMPARED, ids=[o.name for o in COMPARED])
def test_option_matches_fairseq_transformer_under_translation(setup, option):
    ours_paths, builtin_paths = option.paths(setup)
    ours = decode(setup, "translation", ours_paths, option.args, reseed=option.reseed)
    theirs = decode(setup, "translation", builtin_paths, option.args, reseed=option.reseed)
    assert len(ours) == SENTENCES
    if option.name in FIXED_UNDER_EVERY_TASK:
        # fairseq 0.12 blocks no n-gram on a CPU; our model gets the fixed search whichever
        # task decodes it (row our_model_searches), so it blocks where the built-in does not
        option.check(ours, theirs)
        return
    assert_same_output(ours, theirs, soft=option.soft,
                       may_differ=SENTENCES // 10 if option.reseed else 0)


@pytest.mark.parametrize("option", OPTIONS, ids=[o.name for o in OPTIONS])
def test_option_composes_with_the_papers_decoding(setup, baselines, option):
    ours_paths, _ = option.paths(setup)
    out = decode(setup, "vaswani_translation", ours_paths, option.args, reseed=option.reseed)
    assert_paper_decoding(out, normalized=option.normalized, per_sentence=option.per_sentence)
    base = baselines["nbest4"] if option.per_sentence == 4 else baselines["beam"]
    option.check(out, base)


# ---------------------------------------------------------------- fairseq-interactive


def contains_in_order(tokens: list, phrases: list) -> bool:
    position = 0
    for phrase in phrases:
        while position + len(phrase) <= len(tokens) and (
                tokens[position:position + len(phrase)] != phrase):
            position += 1
        if position + len(phrase) > len(tokens):
            return False
        position += len(phrase)
    return True


@pytest.mark.parametrize("order", ["ordered", "unordered"])
def test_constraints_match_fairseq_transformer_and_appear_within_the_limit(setup, order):
    reverse = order == "unordered"
    path = interactive_input(setup, f"constraints_{order}", constraints=True, reverse=reverse)
    stock = ["--constraints", order, "--input", path, "--buffer-size", "8", "--batch-size", "8"]
    # fairseq's own task keeps fairseq's search (the fixes of constrained search and of the
    # alignments of short beams are our task's generator's): compared without alignments,
    # which fairseq's SequenceGeneratorWithAlignment cannot give for a short beam
    ours = decode(setup, "translation", setup.ours, stock, tool="interactive")
    theirs = decode(setup, "translation", setup.builtin, stock, tool="interactive")
    assert_same_output(ours, theirs)

    extra = [*stock, "--print-alignment"]
    paper = decode(setup, "vaswani_translation", setup.ours, extra, tool="interactive")
    assert_paper_decoding(paper)
    met = 0
    for entry in paper.values():
        tokens = entry["hypos"][0]["tokens"]
        assert all(" ".join(c) in " ".join(tokens) for c in entry["constraints"])
        if order == "ordered":
            assert contains_in_order(tokens, entry["constraints"])
        met += bool(entry["constraints"])
        check_hard_alignment({0: entry}, {0: entry})
    assert met >= SENTENCES // 2


def test_interactive_buffer_size_changes_nothing(setup):
    path = interactive_input(setup, "plain", constraints=False)
    one = decode(setup, "vaswani_translation", setup.ours, ["--input", path],
                 tool="interactive")
    buffered_args = ["--input", path, "--buffer-size", "8", "--batch-size", "8"]
    buffered = decode(setup, "vaswani_translation", setup.ours, buffered_args,
                      tool="interactive")
    assert_paper_decoding(buffered)
    assert_same_output(buffered, one)
    theirs = decode(setup, "translation", setup.builtin, buffered_args, tool="interactive")
    assert_same_output(decode(setup, "translation", setup.ours, buffered_args,
                              tool="interactive"), theirs)


# ---------------------------------------------------------------- refused in one line


def last_line_of_failure(setup, task: str, extra: list, tool: str = "generate") -> str:
    with pytest.raises(AssertionError) as info:
        decode(setup, task, setup.ours, extra, tool=tool)
    text = str(info.value)
    assert "\nH-" not in text  # nothing was decoded
    assert "Traceback" not in text
    return text.strip().splitlines()[-1]


@pytest.mark.parametrize("extra, message", [
    (["--beam", "0"], "--beam: must be an integer from 1 to 1000"),
    (["--nbest", "5"], "--nbest: must be between 1 and --beam 4"),
    (["--diverse-beam-groups", "3"], "--diverse-beam-groups: 3 must divide --beam 4"),
    (["--constraints"], "--constraints: binarized data carries no constraints"),
])
def test_options_that_cannot_apply_are_refused_before_decoding(setup, extra, message):
    last = last_line_of_failure(setup, "vaswani_translation", extra)
    assert last.startswith("generate.py: error: ") and message in last


def test_replace_unk_without_alignment_under_fairseqs_task_is_refused(setup):
    last = last_line_of_failure(setup, "translation", ["--replace-unk"])
    assert "--replace-unk needs --print-alignment under --task translation" in last


def test_bare_replace_unk_copies_source_words(setup, baselines):
    """fairseq reads the bare flag's constant '@@ ' as a dictionary file; it means none."""
    out = decode(setup, "vaswani_translation", setup.ours, ["--replace-unk"])
    aligned = decode(setup, "vaswani_translation", setup.ours,
                     ["--replace-unk", "--print-alignment"])
    assert {i: e["hypos"][0]["tokens"] for i, e in out.items()} == {
        i: e["hypos"][0]["tokens"] for i, e in aligned.items()}
    check_replace_unk(aligned, baselines["beam"])


# ---------------------------------------------------------------- the parts, in-process


def paired_decoders(seed: int = 0, **options):
    """Our tiny model and fairseq's transformer with the same weights (learned positions)."""
    from user_plugin.artifacts.builtin_transformer import (
        build_fairseq_transformer,
        copy_fairseq_weights_into_ours,
    )

    torch.manual_seed(seed)
    dictionary = make_dictionary(50)
    ours = build_vaswani(dictionary, "vaswani_base", **{
        **TINY, "encoder_learned_pos": True, "decoder_learned_pos": True, **options})
    theirs = build_fairseq_transformer(ours, fake_task(dictionary), ours.cfg)
    copy_fairseq_weights_into_ours(theirs, ours)
    return dictionary, ours.eval(), theirs.eval()


@pytest.mark.parametrize("layer, heads", [(None, None), (0, None), (0, 2), (1, 1)])
def test_alignment_layer_and_heads_as_fairseqs_decoder(layer, heads):
    dictionary, ours, theirs = paired_decoders(
        seed=1, alignment_layer=layer, alignment_heads=heads)
    ours.decoder.return_alignment = True
    src, src_lengths, prev = random_batch(dictionary, batch=3, src_len=8, tgt_len=6)
    aligned = dict(alignment_layer=layer, alignment_heads=heads)
    with torch.no_grad():
        mine = ours(src, src_lengths, prev)[1]["attn"][0]
        expected = theirs(src, src_lengths, prev, **aligned)[1]["attn"][0]
        real = prev.ne(dictionary.pad())
        torch.testing.assert_close(mine[real], expected[real], atol=1e-5, rtol=1e-5)
        # step by step, through the beam caches: each step's row of the full forward
        our_enc, their_enc = ours.encoder(src, src_lengths), theirs.encoder(src, src_lengths)
        our_state, their_state = {}, {}
        tokens = torch.randint(4, len(dictionary), (3, 5))
        tokens[:, 0] = dictionary.eos()
        for step in range(1, tokens.size(1) + 1):
            a = ours.decoder(tokens[:, :step], our_enc, incremental_state=our_state)[1]["attn"][0]
            b = theirs.decoder(tokens[:, :step], their_enc, incremental_state=their_state,
                               **aligned)[1]["attn"][0]
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_attention_is_computed_only_when_asked():
    dictionary, ours, _ = paired_decoders()
    src, src_lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        assert ours(src, src_lengths, prev)[1]["attn"] == [None]
        ours.decoder.return_alignment = True
        assert ours(src, src_lengths, prev)[1]["attn"][0].shape == (*prev.shape, src.size(1))


def test_full_context_alignment_as_fairseqs_transformer_align():
    dictionary, ours, theirs = paired_decoders(seed=2, full_context_alignment=True)
    assert ours.full_context_alignment
    ours.decoder.return_alignment = True
    src, src_lengths, prev = random_batch(dictionary, batch=3, src_len=8, tgt_len=6)
    with torch.no_grad():
        mine = ours(src, src_lengths, prev)[1]["attn"][0]
        encoder_out = theirs.encoder(src, src_lengths)
        expected = theirs.decoder(prev, encoder_out, features_only=True,
                                  full_context_alignment=True)[1]["attn"][0]
        real = prev.ne(dictionary.pad())
        torch.testing.assert_close(mine[real], expected[real], atol=1e-5, rtol=1e-5)
        # without the causal mask, a later token changes an earlier position's alignment
        changed = prev.clone()
        changed[0, -1] = (changed[0, -1] + 1 - 4) % (len(dictionary) - 4) + 4
        assert not torch.allclose(ours(src, src_lengths, changed)[1]["attn"][0][0, 1], mine[0, 1])


def test_diverse_beam_search_fix_keeps_fairseqs_results_for_any_sample_ids():
    """fairseq indexes its group overlaps by dataset id: any batch whose ids are not 0..B-1
    fails on the second step. The fix gives every batch the results of ids 0..B-1; our task's
    generator uses it, fairseq's own class stays as it is for fairseq's tasks."""
    from fairseq import search
    from fairseq.sequence_generator import SequenceGenerator

    from user_plugin.generation import GNMTSequenceGenerator
    from user_plugin.generation.diverse_search import DiverseBeamSearchByRow

    original = search.DiverseBeamSearch
    assert DiverseBeamSearchByRow.__bases__[0] is original  # fairseq's class, not replaced
    dictionary, ours, _ = paired_decoders(seed=3)
    chosen = GNMTSequenceGenerator([ours], dictionary, beam_size=4,
                                   search_strategy=original(dictionary, 2, 0.5)).search
    assert type(chosen) is DiverseBeamSearchByRow and chosen.num_groups == 2
    assert chosen.diversity_strength == -0.5
    src, src_lengths, _ = random_batch(dictionary, batch=3, src_len=7, seed=4)

    def run(search_cls, ids):
        generator = SequenceGenerator([ours], dictionary, beam_size=4, max_len_b=8,
                                      search_strategy=search_cls(dictionary, 2, 0.5))
        sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths},
                  "id": torch.tensor(ids)}
        return [[h["tokens"].tolist() for h in hypos] for hypos in generator.forward(sample)]

    expected = run(original, [0, 1, 2])
    with pytest.raises(IndexError):
        run(original, [40, 7, 12])
    assert run(DiverseBeamSearchByRow, [40, 7, 12]) == expected
    assert run(DiverseBeamSearchByRow, [0, 1, 2]) == expected


def test_constraints_are_met_by_the_per_sentence_limit():
    """A constraint the model never wants (probability 1e-12): fairseq's constrained search
    under the per-sentence limit stops with an AssertionError; ours places it before the limit,
    in every hypothesis, and a constraint longer than the limit widens it."""
    from fairseq.token_generation_constraints import pack_constraints
    from test_gnmt_decoding import never_ending_table, scripted_model, source_batch

    from user_plugin.generation import ConstrainedBeamSearch, GNMTSequenceGenerator

    dictionary = make_dictionary(12)
    model = scripted_model(dictionary, never_ending_table)
    sample = source_batch(dictionary, [2, 4])
    z, w = 6, 7  # tokens the scripted model gives 1e-12

    def run(search, constraints, fixed=True):
        generator = GNMTSequenceGenerator([model], dictionary, beam_size=3, len_penalty=ALPHA,
                                          max_len_over_source=3, search_strategy=search)
        if not fixed:  # the generator as it was: fairseq's search, EOS forced at the limit
            generator.search = ConstrainedBeamSearch.__bases__[0](dictionary, "ordered")
            generator.model.constraint_search = None
        return generator.generate([model], sample, constraints=constraints)

    constraints = pack_constraints([[torch.tensor([z])], [torch.tensor([z, w])]])
    with pytest.raises(AssertionError):
        run(ConstrainedBeamSearch(dictionary, "ordered"), constraints, fixed=False)
    for sentence, hypos in zip([[z], [z, w]], run(ConstrainedBeamSearch(dictionary, "ordered"),
                                                  constraints)):
        assert len(hypos) == 3
        for hypo in hypos:
            tokens = hypo["tokens"].tolist()
            assert tokens[-1] == dictionary.eos()
            assert contains_in_order(tokens, [sentence])
    limit = 2 + 3  # the first source's tokens + 3
    assert all(len(h["tokens"]) - 1 <= limit for h in run(ConstrainedBeamSearch(
        dictionary, "ordered"), constraints)[0])
    longer = [torch.tensor([z, w, z, w, z, w, z])]  # 7 tokens > 2 + 3
    hypos = run(ConstrainedBeamSearch(dictionary, "unordered"),
                pack_constraints([longer, []]))[0]
    assert all(len(h["tokens"]) - 1 == 7 for h in hypos)


@pytest.mark.parametrize("options, message", [
    (dict(beam=0), "--beam: must be an integer from 1 to 1000"),
    (dict(beam=4, nbest=5), "--nbest: must be between 1 and --beam 4"),
    (dict(beam=4, temperature=0.0), r"--temperature: must be a number from 0.01 to 100"),
    (dict(beam=4, diverse_beam_groups=3), "--diverse-beam-groups: 3 must divide --beam 4"),
    (dict(beam=4, sampling=False, sampling_topk=5),
     "--sampling-topk: only applies with --sampling"),
    (dict(beam=4, sampling=False, sampling_topp=0.5),
     "--sampling-topp: only applies with --sampling"),
])
def test_task_refuses_options_that_cannot_apply(options, message):
    from argparse import Namespace

    from user_plugin.generation import DecodingOptionError
    from user_plugin.tasks.vaswani_translation import (
        VaswaniTranslationConfig,
        VaswaniTranslationTask,
    )

    dictionary, ours, _ = paired_decoders()
    task = VaswaniTranslationTask(VaswaniTranslationConfig(), dictionary, dictionary)
    with pytest.raises(DecodingOptionError, match=message):
        task.build_generator([ours], Namespace(**options))


def generation_cfg(task: str = "vaswani_translation", **generation):
    """What fairseq-generate hands ``prepare_for_inference_``: the generation options."""
    from argparse import Namespace

    options = dict(beam=4, print_alignment=None, replace_unk=None, retain_dropout=False,
                   retain_dropout_modules=None, no_beamable_mm=False)
    return Namespace(generation=Namespace(**{**options, **generation}),
                     task=Namespace(_name=task))


def test_prepare_for_inference_switches_alignments_and_dropout():
    dictionary, ours, _ = paired_decoders()
    ours.prepare_for_inference_(generation_cfg(replace_unk=""))
    assert ours.decoder.return_alignment and not ours.training
    dictionary, ours, _ = paired_decoders()
    ours.prepare_for_inference_(generation_cfg(retain_dropout=True,
                                               retain_dropout_modules="AddAndNorm"))
    assert not ours.decoder.return_alignment
    trained = {type(m).__name__ for m in ours.modules() if m.training}
    assert trained == {"AddAndNorm"}


def test_alignments_of_a_model_without_cross_attention_are_refused():
    from user_plugin.generation import DecodingOptionError

    _, ours, _ = paired_decoders(no_cross_attention=True)
    with pytest.raises(DecodingOptionError, match="--no-cross-attention"):
        ours.prepare_for_inference_(generation_cfg(print_alignment="hard"))
    with pytest.raises(DecodingOptionError, match="--print-alignment under --task translation"):
        paired_decoders()[1].prepare_for_inference_(generation_cfg("translation", replace_unk=""))


def test_replace_unk_reads_every_alignment_format():
    from fairseq import utils

    from user_plugin.fairseq_patches.decoding import source_positions

    assert utils.load_align_dict("@@ ") == {}
    pairs = [(2, 0), (0, 1), (1, 1)]
    assert source_positions(pairs) == {0: 2, 1: 0}
    assert source_positions(torch.tensor([2, 0])) == {0: 2, 1: 0}
    assert source_positions([["0.1", "0.7", "0.2"], ["0.6", "0.3", "0.1"]]) == {0: 1, 1: 0}
    assert utils.replace_unk("a <unk> c", "x y z", [(0, 0), (2, 1), (1, 2)], {"z": "Z"},
                             "<unk>") == "a Z c"
    with pytest.raises(ValueError, match="--print-alignment"):
        utils.replace_unk("a <unk>", "x y", [], {}, "<unk>")


# ---------------------------------------------------------------- the hub


@pytest.fixture(scope="module")
def hub_translator(trained_multi30k):
    from user_plugin.hub import load_translator

    return load_translator(trained_multi30k.checkpoint_dir / "checkpoint_best.pt",
                           data_dir=trained_multi30k.data_bin, source_lang="en", target_lang="de")


def test_hub_constraints_as_fairseq_interactive(trained_multi30k, hub_translator, tmp_path):
    lines = (trained_multi30k.text_dir / "test.en").read_text(encoding="utf-8").splitlines()[:8]
    phrases = [["Mann"], ["Hund", "Wasser"], [], ["Frau"], ["auf einem"], ["Kinder"], ["Straße"],
               ["ein", "Hut"]]
    hub = hub_translator.translate_tokens(lines, constraints=phrases)
    path = tmp_path / "input.txt"
    path.write_text("\n".join("\t".join([line, *p]) for line, p in zip(lines, phrases)) + "\n",
                    encoding="utf-8")
    proc = run_fairseq("interactive", [
        trained_multi30k.data_bin, "--user-dir", USER_DIR, "--task", "vaswani_translation",
        "--path", trained_multi30k.checkpoint_dir / "checkpoint_last.pt", "--cpu", "--beam", "4",
        "--lenpen", str(ALPHA), "--constraints", "--input", path])
    cli = parse_output(proc.stdout)
    for i, (hypos, wanted) in enumerate(zip(hub, phrases)):
        assert hypos[0]["tokens"].split() == cli[i]["hypos"][0]["tokens"]
        assert contains_in_order(hypos[0]["tokens"].split(), [p.split() for p in wanted])
    raw = hub_translator.translate("A dog runs in the snow.", constraints=["Hund", "Schnee"])
    assert "Hund" in raw and raw.index("Hund") < raw.index("Schnee")


def test_hub_constraints_are_checked_by_type(hub_translator):
    """constraints="Hund" (a string where a list is expected) decoded with each letter as a
    constraint, silently."""
    for bad in ("Hund", [["Hund"]], [1]):
        with pytest.raises(ValueError, match="constraints= needs a list of phrases"):
            hub_translator.translate("A dog runs .", constraints=bad)
    with pytest.raises(ValueError, match=r"one list of phrases \(strings\) per sentence \(2\)"):
        hub_translator.translate(["A dog .", "A cat ."], constraints=["Hund", "Katze"])
    assert "Hund" in hub_translator.translate("A dog runs .", constraints=("Hund",))


@pytest.mark.parametrize("sentences, keywords, message", [
    (b"A dog runs .", {}, "sentences must be text \\(str\\), got bytes"),
    (["A dog .", 3], {}, "sentence 2 is of type int, not str"),
    ("A dog runs .", {"lenpen": "0.6"}, "lenpen= must be a number, or a list of one per "
                                        "sentence, got the str '0.6'"),
])
def test_hub_sentences_and_lenpen_are_checked_by_type(hub_translator, sentences, keywords,
                                                      message):
    """bytes reached the text pipeline's normalizer, and a lenpen string was taken as one alpha
    per character."""
    with pytest.raises(ValueError, match=message):
        hub_translator.translate(sentences, **keywords)


def test_hub_alignments_as_fairseq_generate(trained_multi30k, hub_translator):
    lines = (trained_multi30k.text_dir / "test.en").read_text(encoding="utf-8").splitlines()
    proc = run_fairseq("generate", [
        trained_multi30k.data_bin, "--user-dir", USER_DIR, "--task", "vaswani_translation",
        "--path", trained_multi30k.checkpoint_dir / "checkpoint_last.pt", "--gen-subset", "test",
        "--cpu", "--beam", "4", "--lenpen", str(ALPHA), "--batch-size", "16",
        "--print-alignment"])
    cli = parse_output(proc.stdout)
    hub = hub_translator.translate_tokens(lines[:10], alignment=True, nbest=2)
    for i, hypos in enumerate(hub):
        assert hypos[0]["tokens"].split() == cli[i]["hypos"][0]["tokens"]
        assert [f"{s}-{t}" for s, t in hypos[0]["alignment"]] == cli[i]["hypos"][0]["alignment"]
        assert len(hypos) == 2 and "alignment" in hypos[1]
    assert "alignment" not in hub_translator.translate_tokens(lines[:1])[0][0]


def test_hub_sampling_is_repeatable_with_a_seed(hub_translator):
    sentence = "A man is riding a bike ."
    drawn = hub_translator.translate_tokens([sentence], sampling=True, nbest=3, seed=5,
                                            sampling_topk=20)[0]
    again = hub_translator.translate_tokens([sentence], sampling=True, nbest=3, seed=5,
                                            sampling_topk=20)[0]
    assert len(drawn) == 3 and [h["tokens"] for h in drawn] == [h["tokens"] for h in again]
    other_seeds = [hub_translator.translate_tokens([sentence], sampling=True, seed=seed,
                                                   temperature=1.5)[0][0]["tokens"]
                   for seed in range(6)]
    assert len(set(other_seeds)) > 1
    # top-k 1 sampling is greedy search
    greedy = hub_translator.translate_tokens([sentence], beam=1)[0][0]["tokens"]
    assert hub_translator.translate_tokens([sentence], sampling=True, sampling_topk=1,
                                           seed=1)[0][0]["tokens"] == greedy
    assert all(isinstance(t, str) for t in hub_translator.translate(
        [sentence, "Two dogs ."], sampling=True, sampling_topp=0.9, seed=3))


def test_hub_command_line_constraints_and_sampling(trained_multi30k, capsys, monkeypatch):
    import io

    from user_plugin.commands.translate import main

    model = trained_multi30k.checkpoint_dir / "checkpoint_best.pt"
    base = [str(model), "--data-dir", str(trained_multi30k.data_bin),
            "--source-lang", "en", "--target-lang", "de"]
    monkeypatch.setattr("sys.stdin", io.StringIO("A dog runs .\tHund\tSchnee\nA man .\n"))
    assert main([*base, "--constraints"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert "Hund" in first and first.index("Hund") < first.index("Schnee") and second
    monkeypatch.setattr("sys.stdin", io.StringIO("A dog runs .\n"))
    assert main([*base, "--sampling", "--nbest", "2", "--seed", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_gnmt_score_of_a_reference_equals_its_hypothesis_score(setup):
    """--score-reference under our task scores a reference as beam search scores the same
    tokens: rescoring the beam search output as references gives back its H scores."""
    out = decode(setup, "vaswani_translation", setup.ours, [])
    data = setup.root / "rescoring"
    data.mkdir(exist_ok=True)
    for name in ("dict.en.txt", "dict.de.txt", "test.en-de.en"):
        (data / name).write_bytes((setup.raw / name).read_bytes())
    (data / "test.en-de.de").write_text("\n".join(
        " ".join(out[i]["hypos"][0]["tokens"]) for i in range(SENTENCES)) + "\n",
        encoding="utf-8")
    scored = decode(setup, "vaswani_translation", setup.ours, ["--score-reference"], data=data)
    assert_paper_decoding(scored)
    for i in range(SENTENCES):
        assert scored[i]["hypos"][0]["tokens"] == out[i]["hypos"][0]["tokens"]
        assert scored[i]["hypos"][0]["score"] == pytest.approx(out[i]["hypos"][0]["score"],
                                                               abs=1e-4)


def test_our_model_under_fairseqs_own_task_decodes_diverse_beams(trained_multi30k):
    """Our checkpoint under fairseq-generate --task translation --diverse-beam-groups 2 ended in
    IndexError once the search fixes were built by our task's generator only: they now apply to
    every run of our model, whichever task decodes it, with that task's own scoring."""
    common = [trained_multi30k.data_bin, "--user-dir", USER_DIR, "--path",
              trained_multi30k.checkpoint_dir / "checkpoint_last.pt", "--gen-subset", "test",
              "--cpu", "--batch-size", "16", "--max-len-a", "1", "--max-len-b", "50",
              "--required-batch-size-multiple", "1"]
    diverse = run_fairseq("generate", [*common, "--task", "translation", "--beam", "4",
                                       "--diverse-beam-groups", "2", "--nbest", "2"])
    hypos = parse_output(diverse.stdout)
    assert len(hypos) == 100 and all(len(entry["hypos"]) == 2 for entry in hypos.values())
    plain = parse_output(run_fairseq("generate", [*common, "--task", "translation", "--beam",
                                                  "4"]).stdout)
    ours = parse_output(run_fairseq("generate", [*common, "--task", "vaswani_translation",
                                                 "--beam", "4", "--length-penalty-form",
                                                 "fairseq", "--max-len-over-source", "-1"
                                                 ]).stdout)
    assert {i: e["hypos"][0]["tokens"] for i, e in plain.items()} == \
        {i: e["hypos"][0]["tokens"] for i, e in ours.items()}
