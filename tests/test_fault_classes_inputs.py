"""Faults by class, at every entry point: numbers checked by one validator per option, text as
users type it, scores of what is not a translation, one output limit for both engines,
constraints without a source.

The matrix of cases, outcomes and tests is docs/faults.md. Each class is driven through the
real entry points: fairseq's command lines under ``--task vaswani_translation`` (and the
recipes' settings that reach them), the hub's Python API and command line with both backends,
``vaswani-score`` and ``vaswani-prepare-text``.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path

import forked_cli
import pytest
import torch
from cli import REPO, USER_DIR, command, fairseq_env
from conftest import our_checkpoint_with

from user_plugin.artifacts.text_pipeline import RECORD_NAME, TextPipeline
from user_plugin.generation.decoding_options import (
    FLOAT32_MAX,
    OPTIONS,
    DecodingOptionError,
    check_value,
    option_type,
    penalty_overflow_problem,
)
from user_plugin.generation.gnmt_sequence_generator import (
    LENGTH_PENALTY_FORMS,
    output_limit,
    penalty_function,
)
from user_plugin.paper import MAX_LEN_OVER_SOURCE

NOISE = ("Warning", "warnings.warn", "tensorboardX", "autocast", "WARNING", "deprecation")


def one_error_line(stderr: str) -> str:
    """The one line of ``stderr`` that is not a known warning; no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.strip().splitlines()
             if line.strip() and not any(n in line for n in NOISE)
             and " | INFO | " not in line and not line.startswith("  ")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def error_line(stderr: str) -> str:
    """The one ``PROG: error:`` line of a command that also logs (fairseq's): the last line,
    no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and stderr.strip().splitlines()[-1] == errors[0], stderr[-3000:]
    return errors[0]


def fairseq_tool(tool: str, args: list, stdin: str | None = None,
                 env: dict | None = None) -> subprocess.CompletedProcess:
    return forked_cli.run([sys.executable, "-m", f"fairseq_cli.{tool}", *map(str, args)],
                          cwd=REPO, env=env or fairseq_env(), input=stdin, capture_output=True,
                          text=True, timeout=600, check=False)


def hub_cli(args: list, stdin: str = "") -> subprocess.CompletedProcess:
    return forked_cli.run([sys.executable, "-m", "user_plugin.hub", *map(str, args)],
                          cwd=REPO, env=fairseq_env(), input=stdin, capture_output=True,
                          text=True, timeout=600, check=False)


def decoding_args(trained, *extra) -> list:
    return [trained.data_bin, "--user-dir", USER_DIR, "--task", "vaswani_translation",
            "--path", trained.checkpoint_dir / "checkpoint_last.pt", "--cpu",
            "--source-lang", "en", "--target-lang", "de", *extra]


@pytest.fixture(scope="module")
def translator(trained_multi30k):
    from user_plugin.hub import load_translator

    return load_translator(trained_multi30k.checkpoint_dir / "checkpoint_best.pt",
                           data_dir=trained_multi30k.data_bin, source_lang="en", target_lang="de")


# --------------------------------------------------------------------------------------------
# Numbers: one validator per option, at every door


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_refuses_what_is_not_finite_or_out_of_its_range(name):
    spec = OPTIONS[name]
    for bad in (math.nan, math.inf, -math.inf, "4", True, spec.high + 1):
        with pytest.raises(DecodingOptionError, match=f"^{spec.option}: must be "):
            check_value(name, bad)
    below = spec.low - (1 if spec.kind is int else 1e-9)
    if below not in spec.off:
        with pytest.raises(DecodingOptionError):
            check_value(name, below)
    for good in (spec.high, *spec.off) + (() if spec.low_open else (spec.low,)):
        assert check_value(name, good) == good
    if spec.kind is int:
        with pytest.raises(DecodingOptionError):
            check_value(name, spec.high - 0.5)
    parse = option_type(name)
    assert parse(str(spec.high)) == spec.high
    for text in ("nan", "inf", "x"):
        with pytest.raises(Exception, match="must be"):
            parse(text)


def test_the_lenpen_range_never_overflows_float32():
    """Every alpha of the range, every output length up to 7,131 tokens (far more than the
    1024 positions of fairseq's default), both penalty forms: the penalty and a score divided
    by it are finite float32 numbers. Beyond the range, Python raised OverflowError."""
    spec = OPTIONS["lenpen"]
    lengths = torch.arange(1, 7132, dtype=torch.float64)
    for alpha in torch.linspace(spec.low, spec.high, 41).tolist():
        for form in LENGTH_PENALTY_FORMS:
            penalty = penalty_function(form)
            values = torch.tensor([penalty(int(n), alpha) for n in lengths[::50].tolist()]
                                  + [penalty(7131, alpha)], dtype=torch.float32)
            assert torch.isfinite(values).all() and (values >= 1).all(), (alpha, form)
            assert torch.isfinite(torch.tensor(-1e4, dtype=torch.float32) / values).all()
            assert penalty_overflow_problem(alpha, 7131, (form,)) is None
    with pytest.raises(OverflowError):
        penalty_function("gnmt")(20, 1000.0)
    problem = penalty_overflow_problem(10.0, 8000, ("fairseq",))
    assert problem is not None and "overflows float32" in problem
    largest = float(problem.rsplit(" ", 1)[1])
    assert 9 < largest < 10 and penalty_function("fairseq")(8000, largest) <= FLOAT32_MAX


@pytest.mark.parametrize("tool, value", [("generate", "nan"), ("generate", "inf"),
                                         ("generate", "1000"), ("generate", "-1"),
                                         ("interactive", "nan")])
def test_fairseq_commands_with_our_task_refuse_a_bad_lenpen_in_one_line(trained_multi30k, tool,
                                                                         value):
    args = decoding_args(trained_multi30k, "--beam", "4", f"--lenpen={value}")
    if tool == "generate":
        args += ["--gen-subset", "test", "--max-tokens", "2000"]
    proc = fairseq_tool(tool, args, stdin="A dog runs .\n")
    line = error_line(proc.stderr)
    assert proc.returncode == 1 and "\nH-" not in proc.stdout
    assert line.endswith(f"error: --lenpen: must be a number from 0 to 10 (alpha of the length "
                         f"penalty: 0 none, 0.6 the paper; above 10 it overflows float32 for "
                         f"long outputs), got {float(value)}")


def test_the_recipes_lenpen_reaches_generate_and_is_refused(trained_multi30k):
    """The generate step's options come from recipes/common.sh (decoding_args) with the
    task vaswani_translation; LENPEN=nan reaches fairseq-generate and stops it in one line."""
    script = ('source "$COMMON"; activate_venv; load_pair wmt14_en_de; DEVICE=cpu; '
              'TASK=vaswani_translation; decoding_defaults; decoding_args; '
              'printf "%s\\n" "${DECODING_ARGS[@]}"')
    env = {**os.environ, "COMMON": str(REPO / "recipes" / "common.sh"), "LENPEN": "nan",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = forked_cli.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    recipe_args = proc.stdout.splitlines()
    assert recipe_args[recipe_args.index("--lenpen") + 1] == "nan"
    assert recipe_args[recipe_args.index("--task") + 1] == "vaswani_translation"
    generate = fairseq_tool("generate", [
        trained_multi30k.data_bin, *recipe_args, "--source-lang", "en", "--target-lang", "de",
        "--gen-subset", "test", "--path", trained_multi30k.checkpoint_dir / "checkpoint_last.pt",
        "--max-tokens", "2000"])
    assert generate.returncode == 1 and "\nH-" not in generate.stdout
    assert "error: --lenpen: must be a number from 0 to 10" in error_line(generate.stderr)


def test_validation_bleu_options_are_checked_before_training(trained_multi30k, tmp_path):
    save_dir = tmp_path / "run"
    proc = fairseq_tool("train", [
        trained_multi30k.data_bin, "--user-dir", USER_DIR, "--task", "vaswani_translation",
        "--cpu", "--arch", "vaswani_base", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000",
        "--max-update", "2", "--save-dir", save_dir, "--eval-bleu",
        "--eval-bleu-args", '{"beam": 4, "lenpen": 1000}'])
    assert proc.returncode == 1
    assert "error: --lenpen: must be a number from 0 to 10" in error_line(proc.stderr)
    assert not list(save_dir.glob("*.pt"))


def test_the_hub_refuses_a_bad_lenpen_at_every_door(trained_multi30k, translator, tmp_path):
    from user_plugin.hub import load_translator

    proc = hub_cli([trained_multi30k.checkpoint_dir, "--data-dir", trained_multi30k.data_bin,
                    "--lenpen", "1000"], "A dog runs .\n")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "argument --lenpen: must be a number from 0 to 10" in proc.stderr.splitlines()[-1]
    # the API refuses before reading any file (the directory does not exist)
    with pytest.raises(DecodingOptionError, match="^--lenpen: must be"):
        load_translator(tmp_path / "missing", lenpen=1000)
    for value in (math.nan, math.inf, 1000.0, -0.5):
        with pytest.raises(DecodingOptionError, match="^--lenpen: must be"):
            translator.translate("A dog runs .", lenpen=value)
    assert isinstance(translator.translate("A dog runs .", lenpen=10.0), str)


@pytest.mark.parametrize("keywords, option", [
    (dict(beam=0), "--beam"), (dict(nbest=5), "--nbest"),
    (dict(sampling=True, nbest=2, temperature=1e-9), "--temperature"),
    (dict(sampling=True, nbest=2, sampling_topk=-5), "--sampling-topk"),
    (dict(sampling=True, nbest=2, sampling_topp=2.0), "--sampling-topp"),
    (dict(sampling=True, nbest=2, seed=2**64), "--seed"),
])
def test_the_hub_checks_every_decoding_keyword(translator, keywords, option):
    with pytest.raises(DecodingOptionError, match=f"^{option}: must be"):
        translator.translate("A dog runs .", **keywords)


# --------------------------------------------------------------------------------------------
# Text as users type it: one Unicode normalization form at training and serving


def decomposed(text: str) -> str:
    nfd = unicodedata.normalize("NFD", text)
    assert nfd != text
    return nfd


SOURCE = "Zwei Männer in der Küche über einem Mädchen ."


def test_nfd_and_nfc_input_give_the_same_tokens_and_translation(trained_multi30k, translator):
    nfd = decomposed(SOURCE)
    tokens = translator.model_tokens([SOURCE, nfd])
    assert tokens[0] == tokens[1] and "<unk>" not in tokens[0]
    assert translator.codec.unicode_normalization == "NFC"
    assert translator.translate(nfd) == translator.translate(SOURCE)
    proc = hub_cli([trained_multi30k.checkpoint_dir / "checkpoint_best.pt", "--data-dir",
                    trained_multi30k.data_bin, "--print-tokens"], f"{SOURCE}\n{nfd}\n")
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == second == tokens[0]


def test_training_text_is_normalized_and_the_form_recorded(tmp_path):
    raw = tmp_path / "train.de"
    raw.write_text(decomposed(SOURCE) + "\n", encoding="utf-8")
    out = tmp_path / "train.tok.de"
    proc = forked_cli.run([*command("prepare_text"), "normalize", "--lang", "de", str(raw),
                           str(out)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == unicodedata.normalize("NFC", SOURCE) + "\n"
    codes = tmp_path / "bpe.codes"
    codes.write_text("#version: 0.2\nM ä\n", encoding="utf-8")
    proc = forked_cli.run([*command("prepare_text"), "write-pipeline", "--source-lang", "en",
                           "--target-lang", "de", "--subword", "bpe", "--model", str(codes),
                           "--output", str(tmp_path / RECORD_NAME)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / RECORD_NAME).read_text(encoding="utf-8"))
    assert record["unicode_normalization"] == "NFC"
    pipeline = TextPipeline.load(tmp_path)
    assert pipeline.encode(decomposed(SOURCE), target=True) == pipeline.encode(SOURCE,
                                                                               target=True)
    assert pipeline.decode(decomposed("Männer")) == "Männer"


def test_a_record_without_the_form_keeps_text_as_typed_with_one_note(trained_multi30k,
                                                                     tmp_path, caplog):
    from user_plugin.hub import load_translator

    record = TextPipeline.recipe("en", "de", "none").record()
    del record["unicode_normalization"]
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / RECORD_NAME).write_text(json.dumps(record), encoding="utf-8")
    checkpoint = trained_multi30k.checkpoint_dir / "checkpoint_last.pt"
    old = load_translator(model_dir, checkpoints=[checkpoint], data_dir=trained_multi30k.data_bin)
    assert old.codec.unicode_normalization is None
    nfd_tokens, nfc_tokens = old.model_tokens([decomposed(SOURCE), SOURCE])
    assert nfd_tokens != nfc_tokens and "<unk>" in nfd_tokens  # as before: text as typed
    notes = [r.getMessage() for r in caplog.records if "Unicode normalization" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith(f"{model_dir / RECORD_NAME} records no "
                                                   "Unicode normalization")
    proc = hub_cli([model_dir, "--checkpoints", checkpoint, "--data-dir",
                    trained_multi30k.data_bin], "A dog runs .\n")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 1
    assert sum("records no Unicode normalization" in line
               for line in proc.stderr.splitlines()) == 1
    with pytest.raises(Exception, match="unknown Unicode normalization"):
        TextPipeline.from_record({**record, "unicode_normalization": "NFX"})


def test_the_scorer_compares_text_in_one_normalization_form(tmp_path):
    """The same text, the reference saved with decomposed accents, scored 80.88 BLEU."""
    hyp, ref = tmp_path / "hyp.de", tmp_path / "ref.de"
    text = "\n".join([SOURCE, "Ein Mädchen läuft über die Straße .", "Schöne Grüße ."]) + "\n"
    hyp.write_text(text, encoding="utf-8")
    ref.write_text(decomposed(text), encoding="utf-8")
    proc = forked_cli.run([*command("score_translation"), "--hyp", str(hyp), "--ref", str(ref),
                           "--target-lang", "de"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "sacreBLEU: BLEU = 100.00" in proc.stdout
    assert "tokenized BLEU (Moses -l de, with compound splitting, multi-bleu): BLEU = 100.00" \
        in proc.stdout


# --------------------------------------------------------------------------------------------
# Scores of what is not a translation


REFERENCES = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.",
              "Eine Frau liest ein Buch im Park.", "Kinder spielen am Strand.",
              "Ein Mann fährt Fahrrad auf der Straße."]


def score(hyp: Path, ref: Path) -> subprocess.CompletedProcess:
    return forked_cli.run([*command("score_translation"), "--hyp", str(hyp), "--ref", str(ref),
                           "--target-lang", "de"], capture_output=True, text=True, check=False)


def run_suggested(line: str, cwd: Path) -> Path:
    """Run the vaswani-prepare-text command(s) quoted in an error line; the file to score."""
    quoted = line.split("'vaswani-prepare-text ", 1)[1].rsplit("', then score ", 1)
    for part in ("vaswani-prepare-text " + quoted[0]).split(" && "):
        argv = shlex.split(part)
        assert argv[0] == "vaswani-prepare-text"
        proc = forked_cli.run([*command("prepare_text"), *argv[1:]], cwd=cwd,
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
    return cwd / quoted[1]


def tokenized(lines: list[str]) -> list[str]:
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang="de")
    return [tokenizer.tokenize(line, return_str=True, escape=False) for line in lines]


@pytest.fixture()
def reference(tmp_path) -> Path:
    path = tmp_path / "ref.de"
    path.write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", ["H", "D"])
def test_generate_output_lines_are_refused_with_the_command_that_extracts_them(kind, tmp_path,
                                                                                reference):
    """``grep '^H-'`` of a fairseq-generate log (generation order, ids and scores) scored
    BLEU 0.49 with exit 0; it is refused, and the command the line gives makes a file that
    scores as the translations do."""
    order = [3, 0, 4, 1, 2]
    hyp = tmp_path / f"{kind}-lines.de"
    hyp.write_text("".join(f"{kind}-{i}\t-0.{i}5\t{tokenized(REFERENCES)[i]}\n" for i in order),
                   encoding="utf-8")
    proc = score(hyp, reference)
    line = one_error_line(proc.stderr)
    assert proc.returncode == 1 and "5 of 5 lines are fairseq-generate output lines" in line
    assert "vaswani-prepare-text extract-hypotheses --expected 5" in line
    fixed = run_suggested(line, tmp_path)
    proc = score(fixed, reference)
    assert proc.returncode == 0 and "sacreBLEU: BLEU = 100.00" in proc.stdout


def bpe_pieces(words: list[str]) -> str:
    return " ".join(w[:2] + "@@ " + w[2:] if len(w) > 4 else w for w in words)


def sentencepiece_pieces(words: list[str]) -> str:
    return " ".join("\u2581" + (w[:3] + " " + w[3:] if len(w) > 4 else w) for w in words)


@pytest.mark.parametrize("method, split", [("bpe", bpe_pieces),
                                           ("sentencepiece", sentencepiece_pieces)])
def test_subword_pieces_are_refused_with_the_command_that_joins_them(method, split, tmp_path,
                                                                     reference):
    lines = tokenized(REFERENCES) if method == "bpe" else REFERENCES
    hyp = tmp_path / "pieces.de"
    hyp.write_text("".join(split(line.split()) + "\n" for line in lines), encoding="utf-8")
    proc = score(hyp, reference)
    line = one_error_line(proc.stderr)
    assert proc.returncode == 1 and "subword pieces, not text" in line
    assert f"vaswani-prepare-text detokenize --lang de --subwords {method}" in line
    proc = score(run_suggested(line, tmp_path), reference)
    assert proc.returncode == 0 and "sacreBLEU: BLEU = 100.00" in proc.stdout
    proc = score(reference, hyp)  # the same pieces as the reference
    assert proc.returncode == 1 and "not a reference" in one_error_line(proc.stderr)


def test_real_text_with_an_occasional_joiner_is_scored(tmp_path):
    lines = [f"Satz {i} über den Hund ." for i in range(20)]
    lines[7] = "Schreib an hund@@ katze oder an foo@@ bar ."  # 1 line in 20: 5 %
    lines[9] = "Die Adresse ist a@@b.de ."  # not a joiner: no space after it
    hyp = tmp_path / "hyp.de"
    hyp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = score(hyp, hyp)
    assert proc.returncode == 0 and "BLEU = 100.00" in proc.stdout


# --------------------------------------------------------------------------------------------
# Engines that agree at the limit


@pytest.fixture(scope="module")
def endless(trained_multi30k, tmp_path_factory):
    """A tiny model whose EOS never wins (its output projection row of EOS reads a constant
    -100 from the final layer norm), with 64 positions, as a checkpoint and a CTranslate2
    export: every hypothesis runs to the output limit. BOS gets the same row (the fairseq
    backend's strings leave out a generated ``<s>``, CTranslate2's keep it)."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (the test extra)")
    root = tmp_path_factory.mktemp("endless")
    checkpoint = root / "model" / "checkpoint_last.pt"
    checkpoint.parent.mkdir()
    torch.manual_seed(0)
    our_checkpoint_with(trained_multi30k.checkpoint_dir / "checkpoint_last.pt", checkpoint,
                        max_source_positions=64, max_target_positions=64,
                        share_all_embeddings=False, share_decoder_input_output_embed=False,
                        encoder_normalize_before=True, decoder_normalize_before=True)
    state = torch.load(checkpoint, weights_only=True, map_location="cpu")
    weights, eos = state["model"], 2
    weights["decoder.layer_norm.weight"][0] = 0.0
    weights["decoder.layer_norm.bias"][0] = 1.0  # feature 0 of every output is 1
    for never in (0, eos):  # <s>, </s>
        weights["decoder.output_projection.weight"][never] = 0.0
        weights["decoder.output_projection.weight"][never, 0] = -100.0
    torch.save(state, checkpoint)
    export = root / "ct2"
    proc = forked_cli.run([sys.executable, "-m", "user_plugin.export", str(checkpoint),
                           "--data-dir", str(trained_multi30k.data_bin), "--to", "ctranslate2",
                           "--output", str(export)], cwd=REPO, env=fairseq_env(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = [line.split()[0] for line in (trained_multi30k.data_bin / "dict.en.txt").read_text(
        encoding="utf-8").splitlines()[10:60]]
    return checkpoint, export, trained_multi30k.data_bin, words


def test_one_output_limit_counts_tokens_before_eos_within_the_positions():
    assert output_limit(3, MAX_LEN_OVER_SOURCE, 64) == 53
    assert output_limit(40, MAX_LEN_OVER_SOURCE, 64) == 63  # 63 tokens + EOS fill 64 positions
    assert output_limit(0, 0, None) == 1  # at least --min-len
    lengths = torch.tensor([0, 3, 40])
    assert output_limit(lengths, MAX_LEN_OVER_SOURCE, 64).tolist() == [50, 53, 63]


@pytest.mark.parametrize("source_words, expected", [(3, 3 + MAX_LEN_OVER_SOURCE), (40, 63),
                                                     (62, 63)])
def test_both_backends_stop_at_the_same_limit(endless, source_words, expected):
    """CTranslate2 emitted source + 51 tokens (64 at the 63-token position cap) where the exact
    decoder stops at source + 50; both now give the same tokens, length and score."""
    from user_plugin.hub import load_translator

    checkpoint, export, data_bin, words = endless
    ours = load_translator(checkpoint.parent, data_dir=data_bin)
    theirs = load_translator(export, backend="ctranslate2")
    source = " ".join((words * 2)[:source_words])
    for beam in (4, 1):
        exact = ours.translate_tokens([source], nbest=beam, beam=beam)[0]
        engine = theirs.translate_tokens([source], nbest=beam, beam=beam)[0]
        for hypo in exact + engine:
            assert len(hypo["tokens"].split()) == expected
        assert len(exact[0]["positional_scores"]) == expected + 1  # the forced EOS
        assert engine[0]["length"] == expected + 1
        assert engine[0]["tokens"] == exact[0]["tokens"]
        assert engine[0]["score"] == pytest.approx(exact[0]["score"], rel=1e-4)


def test_the_ctranslate2_backend_refuses_a_bad_lenpen(endless):
    from user_plugin.hub import load_translator

    _, export, _, words = endless
    theirs = load_translator(export, backend="ctranslate2")
    for value in (math.nan, 1000.0):
        with pytest.raises(DecodingOptionError, match="^--lenpen: must be"):
            theirs.translate(words[0], lenpen=value)
    assert len(theirs.translate_tokens([words[0]], lenpen=10.0)[0]) == 1
    proc = hub_cli([export, "--backend", "ctranslate2", "--lenpen", "inf"], "a\n")
    assert proc.returncode == 2 and "argument --lenpen: must be" in proc.stderr


# --------------------------------------------------------------------------------------------
# Constraints without a source


@pytest.mark.parametrize("line", ["\tHund", " \tHund", "\tHund\tMann"])
def test_interactive_refuses_an_empty_source_with_constraints(trained_multi30k, line):
    """The line was stripped: 'Hund' became the source and no constraint applied."""
    proc = fairseq_tool("interactive", decoding_args(trained_multi30k, "--constraints"),
                        stdin=line + "\n")
    message = error_line(proc.stderr)
    assert proc.returncode == 1 and "\nH-" not in proc.stdout and "S-0\tHund" not in proc.stdout
    assert "--constraints: a sentence has constraints but an empty source" in message
    assert "'<TAB>Hund" in message


def test_interactive_constraints_still_apply_to_lines_with_a_source(trained_multi30k):
    proc = fairseq_tool("interactive", decoding_args(trained_multi30k, "--constraints"),
                        stdin="A dog runs .\tHund\t\n  A man sleeps .  \n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "C-0\tHund" in lines and "S-1\tA man sleeps ." in lines
    hypothesis = next(line for line in lines if line.startswith("H-0\t"))
    assert "Hund" in hypothesis.split("\t")[2].split()


def test_without_the_patch_the_constraint_became_the_source(trained_multi30k):
    env = {**fairseq_env(), "VASWANI_FAIRSEQ_PATCHES": "off:interactive_empty_source"}
    proc = fairseq_tool("interactive", decoding_args(trained_multi30k, "--constraints"),
                        stdin="\tHund\n", env=env)
    assert proc.returncode == 0 and "S-0\tHund" in proc.stdout and "C-0" not in proc.stdout


def test_the_hub_refuses_an_empty_sentence_with_constraints(trained_multi30k, translator):
    with pytest.raises(ValueError, match="sentence 1 is empty but has the constraints"):
        translator.translate(["", "A dog runs ."], constraints=[["Hund"], []])
    assert translator.translate(["", "A dog runs ."], constraints=[[], ["Hund"]])[0] == ""
    proc = hub_cli([trained_multi30k.checkpoint_dir / "checkpoint_best.pt", "--data-dir",
                    trained_multi30k.data_bin, "--constraints"], "A dog .\n\tHund\n")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "sentence 2 is empty but has the constraints ['Hund']" in one_error_line(proc.stderr)
