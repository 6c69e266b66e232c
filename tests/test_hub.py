"""user_plugin.hub: raw text in, detokenized translations out, on a model trained by the real
fairseq-train (the ``trained_multi30k`` fixture); the hub must agree with fairseq-generate."""

import io
import os

import pytest
import torch
from cli import USER_DIR, run_fairseq
from conftest import MULTI30K, require_data

from user_plugin.commands.translate import PROG, main
from user_plugin.files.errors import run_main
from user_plugin.hub import ArtifactError, TextPipeline, load_translator

SOURCES = 12  # test sentences compared with fairseq-generate


@pytest.fixture(scope="module")
def model_dir(trained_multi30k, tmp_path_factory):
    """A hub model directory: model.pt and the two dictionaries, nothing else."""
    directory = tmp_path_factory.mktemp("hub_model")
    os.symlink(trained_multi30k.checkpoint_dir / "checkpoint_last.pt", directory / "model.pt")
    for lang in ("en", "de"):
        os.symlink(trained_multi30k.data_bin / f"dict.{lang}.txt", directory / f"dict.{lang}.txt")
    return directory


@pytest.fixture(scope="module")
def translator(model_dir):
    return load_translator(model_dir, source_lang="en", target_lang="de")


@pytest.fixture(scope="module")
def cli_best(trained_multi30k):
    """fairseq-generate's best hypothesis (token string) per test sentence id, paper settings."""
    proc = run_fairseq("generate", [
        trained_multi30k.data_bin, "--user-dir", USER_DIR, "--task", "vaswani_translation",
        "--path", trained_multi30k.checkpoint_dir / "checkpoint_last.pt", "--gen-subset", "test",
        "--cpu", "--beam", "4", "--lenpen", "0.6", "--batch-size", "64",
    ])
    best = {}
    for line in proc.stdout.splitlines():
        if line.startswith("H-"):
            head, _, text = line.split("\t", 2)
            best[int(head[2:])] = text
    return best


def test_hub_matches_fairseq_generate_on_tokenized_input(trained_multi30k, translator, cli_best):
    lines = (trained_multi30k.text_dir / "test.en").read_text(encoding="utf-8").splitlines()
    hypos = translator.translate_tokens(lines[:SOURCES])
    assert [h[0]["tokens"] for h in hypos] == [cli_best[i] for i in range(SOURCES)]


def test_translate_raw_text_round_trip(translator, cli_best):
    """Raw sentence -> Moses tokenize -> model -> Moses detokenize equals the detokenized CLI
    output for the same sentence (the fixture tokenized the same raw lines the same way)."""
    from sacremoses import MosesDetokenizer

    raw = (require_data(MULTI30K) / "test_2016_flickr.en").read_text(encoding="utf-8")
    raw = raw.splitlines()[:SOURCES]
    detok = MosesDetokenizer(lang="de")
    expected = [detok.detokenize(cli_best[i].split()) for i in range(SOURCES)]

    single = translator.translate(raw[0])
    assert isinstance(single, str) and single == expected[0]
    several = translator.translate(raw)
    assert several == expected
    assert all(" ." not in text[-3:] for text in several if text.endswith("."))


def test_nbest_returns_k_distinct_hypotheses_best_first(translator):
    sentences = ["A man is riding a bike .", "Two dogs are playing in the snow ."]
    out = translator.translate(sentences, nbest=3)
    assert len(out) == 2 and all(len(per) == 3 and all(isinstance(t, str) for t in per)
                                 for per in out)
    assert translator.translate(sentences[0], nbest=3) == out[0]
    for per in translator.translate_tokens(sentences, nbest=3):
        assert len({h["tokens"] for h in per}) == 3
        scores = [h["score"] for h in per]
        assert scores == sorted(scores, reverse=True)
        for h in per:  # GNMT-normalized log-probability
            length = len(h["positional_scores"])
            expected = float(h["positional_scores"].sum()) / ((5 + length) / 6) ** 0.6
            assert h["score"] == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ValueError, match="nbest"):
        translator.translate(sentences[0], nbest=5)


def test_ensemble_of_two_checkpoints(trained_multi30k, translator):
    ckpt = trained_multi30k.checkpoint_dir
    sentences = ["A woman sings on a stage .", "A dog runs ."]
    twice = load_translator(ckpt, checkpoints=["checkpoint_last.pt", ckpt / "checkpoint_last.pt"],
                            data_dir=trained_multi30k.data_bin)
    assert len(twice.models) == 1  # one checkpoint given twice is used once
    # and decodes as the model alone
    for a, b in zip(twice.translate_tokens(sentences), translator.translate_tokens(sentences)):
        assert a[0]["tokens"] == b[0]["tokens"]
        assert torch.allclose(a[0]["positional_scores"], b[0]["positional_scores"], atol=1e-5)

    names = sorted(p.name for p in ckpt.glob("checkpoint_*_*.pt"))
    ensemble = load_translator(ckpt, checkpoints=[names[0], "checkpoint_last.pt"],
                               data_dir=trained_multi30k.data_bin)
    assert len(ensemble.models) == 2
    mixed = ensemble.translate_tokens(sentences, beam=2)  # beam 2: the early model rambles
    alone = translator.translate_tokens(sentences, beam=2)
    assert all(isinstance(t, str) for t in ensemble.translate(sentences, beam=2))
    assert any(m[0]["tokens"] != a[0]["tokens"]
               or not torch.allclose(m[0]["positional_scores"], a[0]["positional_scores"])
               for m, a in zip(mixed, alone))


def test_languages_are_inferred_from_a_data_dir(trained_multi30k):
    translator = load_translator(trained_multi30k.checkpoint_dir / "checkpoint_best.pt",
                                 data_dir=trained_multi30k.data_bin)
    assert translator.task.cfg.source_lang == "en" and translator.task.cfg.target_lang == "de"
    assert type(translator.task).__name__ == "VaswaniTranslationTask"


def test_bad_paths_and_truncated_checkpoints_name_the_file(model_dir, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ArtifactError, match="nowhere"):
        load_translator(missing)
    with pytest.raises(ArtifactError, match="absent.pt"):
        load_translator(model_dir, checkpoints=["absent.pt"], source_lang="en", target_lang="de")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((model_dir / "model.pt").read_bytes()[:5000])
    with pytest.raises(ArtifactError) as info:
        load_translator(model_dir, checkpoints=[truncated], source_lang="en", target_lang="de")
    assert str(truncated) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ArtifactError, match=r"dict\.fr\.txt"):
        load_translator(model_dir, source_lang="en", target_lang="fr")


def test_command_line_error_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert run_main(main, [str(tmp_path / "nowhere")], PROG) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vaswani-translate: error:") and "nowhere" in err and "\n" not in err


def test_subword_nmt_codec_round_trip(tmp_path):
    from subword_nmt.learn_bpe import learn_bpe

    text = (require_data(MULTI30K) / "train.en").read_text(encoding="utf-8").splitlines()[:300]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(text) + "\n", encoding="utf-8")
    codes = tmp_path / "bpecodes"
    with open(corpus, encoding="utf-8") as fin, open(codes, "w", encoding="utf-8") as fout:
        learn_bpe(fin, fout, 200)
    codec = TextPipeline.from_files("en", "en", moses=True, bpe_codes=codes)
    sentence = "Several men in hard hats are operating a giant pulley system."
    encoded = codec.encode(sentence)
    assert "@@" in encoded and encoded.endswith(".")
    assert codec.decode(encoded) == sentence
    shipped = codec.named_model("bpecodes.shipped")
    assert type(shipped) is TextPipeline and shipped.subword_model == "bpecodes.shipped"
    assert shipped.model_path == codes and shipped.encode(sentence) == encoded


def test_a_pipeline_given_by_files_is_a_text_pipeline(tmp_path):
    """A pipeline of text prepared by hand is a plain TextPipeline: every method works on it,
    renaming its model for an export and writing its record included."""
    moses = TextPipeline.from_files("en", "de", moses=True)
    renamed = moses.named_model("x")
    assert type(renamed) is TextPipeline and renamed.subword_model == "x"
    assert renamed.moses_tokenize and not renamed.normalize_punctuation
    assert renamed.encode("A dog, running.") == "A dog , running ."
    record = TextPipeline.load(moses.write(tmp_path))
    assert record == moses and record.subword == "none"
    with pytest.raises(ArtifactError, match="not both"):
        TextPipeline.from_files("en", "de", moses=True, bpe_codes="a", sentencepiece_model="b")
    with pytest.raises(ArtifactError, match="no such bpe model file"):
        TextPipeline.from_files("en", "de", moses=True, bpe_codes=tmp_path / "absent")


def test_sentencepiece_codec_round_trip(tmp_path):
    import sentencepiece

    text = (require_data(MULTI30K) / "train.de").read_text(encoding="utf-8").splitlines()[:500]
    prefix = tmp_path / "spm"
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_prefix=str(prefix), vocab_size=300,
        minloglevel=2,
    )
    codec = TextPipeline.from_files("de", "de", moses=False,
                                    sentencepiece_model=prefix.with_suffix(".model"))
    sentence = text[7].strip()
    encoded = codec.encode(sentence)
    assert len(encoded.split()) > len(sentence.split())
    assert codec.decode(encoded) == " ".join(sentence.split())
