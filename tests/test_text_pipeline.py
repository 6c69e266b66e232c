"""Train = serve: the recipes' prepare step, the hub (fairseq and CTranslate2 backends) and the
Hugging Face transformers export encode raw text into exactly the same model tokens, because all
of them run the one text pipeline recorded beside the prepared data
(user_plugin/artifacts/text_pipeline.py)."""

from __future__ import annotations

import json
import logging
import sys

import forked_cli
import pytest
from cli import REPO, fairseq_env
from conftest import SHARED_DATA, require_data
from prepared_model import run_prepare, train_tiny, write_raw

from user_plugin.artifacts.errors import ArtifactError
from user_plugin.artifacts.text_pipeline import RECORD_NAME, TextPipeline
from user_plugin.hub import load_translator

NEWSTEST = SHARED_DATA / "newstest2014-en-de"
NEWSTEST2013 = SHARED_DATA / "newstest2013-en-de"
LINES = 300  # raw newstest2014 lines: quotes, dashes, apostrophes, non-ASCII punctuation


def read(path, limit=None) -> list[str]:
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines[:limit] if limit else lines


@pytest.fixture(scope="module")
def news(tmp_path_factory):
    """newstest2014 EN-DE (first lines) prepared by recipes/steps/prepare.sh, and a tiny
    model trained 2 updates on it: only its vocabulary and the pipeline matter here."""
    require_data(NEWSTEST)
    require_data(NEWSTEST2013)
    root = tmp_path_factory.mktemp("train serve ü")  # a space and a non-ASCII letter
    raw = {lang: read(NEWSTEST / f"newstest2014.{lang}", LINES) for lang in ("en", "de")}
    valid = {lang: read(NEWSTEST2013 / f"newstest2013.{lang}", 50) for lang in ("en", "de")}
    write_raw(root / "raw", {"train": raw, "valid": valid, "test": raw})
    prep = run_prepare("wmt14_en_de", root / "raw", root / "work", BPE_OPS="400")
    model = train_tiny(prep, root, "en", "de", updates=2)
    model.raw, model.raw_target = raw["en"], raw["de"]
    model.trained, model.trained_target = read(prep / "test.en"), read(prep / "test.de")
    return model


def test_the_prepare_step_records_its_pipeline(news):
    record = json.loads((news.prep_dir / RECORD_NAME).read_text(encoding="utf-8"))
    assert record["subword"] == "bpe" and record["subword_model"] == "bpe.codes"
    assert record["normalize_punctuation"] and record["aggressive_dash_splits"]
    assert not record["escape"]
    from user_plugin.artifacts.digests import sha256_of

    assert record["subword_model_sha256"] == sha256_of(news.prep_dir / "bpe.codes")


def test_the_raw_text_is_hard(news):
    """The slice holds what the serving side used to get wrong: hyphenated words, straight
    quotes and apostrophes (English), low and high curly quotes and dashes (German); without
    normalization and dash splits many lines differ."""
    for mark in ("-", "'", "\""):
        assert mark in "\n".join(news.raw)
    for mark in ("\u201e", "\u201c", "\u2013"):
        assert mark in "\n".join(news.raw_target)
    unprepared = TextPipeline("en", "de", normalize_punctuation=False,
                              aggressive_dash_splits=False, subword="bpe",
                              model_path=news.prep_dir / "bpe.codes")
    differing = sum(unprepared.encode(line) != trained
                    for line, trained in zip(news.raw, news.trained))
    assert differing >= LINES // 20


def test_hub_fairseq_backend_encodes_as_training(news):
    translator = load_translator(news.model_dir, data_dir=news.data_bin)
    encoded = [translator.codec.encode(line) for line in news.raw]
    assert len(encoded) == len(news.trained) == LINES
    assert [i for i, (a, b) in enumerate(zip(encoded, news.trained)) if a != b] == []
    # target-side text (constraints) too: German quotes and dashes
    target = [translator.codec.encode(line, target=True) for line in news.raw_target]
    assert [i for i, (a, b) in enumerate(zip(target, news.trained_target)) if a != b] == []


def test_ctranslate2_backend_encodes_as_training(news, tmp_path):
    pytest.importorskip("ctranslate2")
    from user_plugin.export.ctranslate2_model import export_ctranslate2

    out = tmp_path / "ct2 export"
    export_ctranslate2(news.checkpoint, news.data_bin, out)
    translator = load_translator(out, backend="ctranslate2")
    encoded = [translator.codec.encode(line) for line in news.raw]
    assert [i for i, (a, b) in enumerate(zip(encoded, news.trained)) if a != b] == []
    target = [translator.codec.encode(line, target=True) for line in news.raw_target]
    assert [i for i, (a, b) in enumerate(zip(target, news.trained_target)) if a != b] == []
    # the model tokens both backends feed (unknown pieces as <unk>) are the same too
    fairseq_side = load_translator(news.model_dir, data_dir=news.data_bin)
    assert translator.model_tokens(news.raw) == fairseq_side.model_tokens(news.raw)


def test_transformers_route_gives_the_training_ids(news, tmp_path):
    from fairseq.data import Dictionary

    from user_plugin.artifacts.transformers_layout import (
        ExportTokenizer,
        hide_unloadable_torchaudio,
        require_transformers,
    )

    hide_unloadable_torchaudio()
    pytest.importorskip("transformers")
    from user_plugin.export.transformers_model import export_transformers

    out = tmp_path / "hf export"
    export_transformers(news.checkpoint, news.data_bin, out)
    dictionary = Dictionary.load(str(news.data_bin / "dict.en.txt"))
    expected = [dictionary.encode_line(line, add_if_not_exist=False).tolist()
                for line in news.trained]
    tokenizer = ExportTokenizer(out)
    got = [tokenizer.source_ids(line) for line in news.raw]
    assert [i for i, (a, b) in enumerate(zip(got, expected)) if a != b] == []
    # the tokenizer transformers loads by itself (FSMTTokenizer, with the exported merges)
    hf = require_transformers().AutoTokenizer.from_pretrained(str(out))
    assert type(hf).__name__ == "FSMTTokenizer"
    native = [hf(line)["input_ids"] for line in news.raw]
    assert [i for i, (a, b) in enumerate(zip(native, expected)) if a != b] == []


def test_print_tokens_shows_what_the_model_gets(news):
    raw = "\n".join(news.raw[:20]) + "\n"
    proc = forked_cli.run(
        [sys.executable, "-m", "user_plugin.hub", str(news.model_dir), "--data-dir",
         str(news.data_bin), "--print-tokens"], input=raw, cwd=REPO, env=fairseq_env(),
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    translator = load_translator(news.model_dir, data_dir=news.data_bin)
    assert proc.stdout.splitlines() == translator.model_tokens(news.raw[:20])
    known = set(translator.task.source_dictionary.symbols)
    expected = [" ".join(t if t in known else "<unk>" for t in line.split())
                for line in news.trained[:20]]
    assert proc.stdout.splitlines() == expected
    assert "assuming" not in proc.stderr  # the record was found: nothing assumed


def test_a_directory_without_a_record_says_what_it_assumes(news, tmp_path, caplog):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.pt").symlink_to(news.checkpoint)
    (bare / "bpecodes").symlink_to(news.prep_dir / "bpe.codes")
    with caplog.at_level(logging.WARNING):
        translator = load_translator(bare, data_dir=news.data_bin)
    notes = [r.getMessage() for r in caplog.records if "assuming" in r.getMessage()]
    assert len(notes) == 1 and "\n" not in notes[0] and RECORD_NAME in notes[0]
    assert "aggressive dash splits" in notes[0]
    # the assumed pipeline is the recipes': it still encodes as training did
    assert [translator.codec.encode(line) for line in news.raw] == news.trained


def test_another_subword_model_is_refused(news, tmp_path):
    other = tmp_path / "other.codes"
    other.write_text("#version: 0.2\nt h\n", encoding="utf-8")
    with pytest.raises(ArtifactError, match="not the bpe model") as info:
        load_translator(news.model_dir, data_dir=news.data_bin, bpe_codes=other)
    assert "\n" not in str(info.value)


def test_record_round_trip_and_corrupt_records(tmp_path):
    codes = tmp_path / "codes"
    codes.write_text("#version: 0.2\nt h\nth e</w>\n", encoding="utf-8")
    pipeline = TextPipeline.recipe("en", "de", "bpe", codes)
    written = pipeline.write(tmp_path)
    loaded = TextPipeline.load(written)
    assert loaded == pipeline and loaded.pretokenize("the well-known") == "the well @-@ known"
    assert loaded.encode("the well-known").startswith("the w@@ e@@ ")  # "th e</w>" merged
    written.write_text("{", encoding="utf-8")
    with pytest.raises(ArtifactError, match="corrupt text pipeline record"):
        TextPipeline.load(written)
    written.write_text(json.dumps({**pipeline.record(), "stemming": True}), encoding="utf-8")
    with pytest.raises(ArtifactError, match="unknown setting 'stemming'"):
        TextPipeline.load(written)
    written.write_text(json.dumps({**pipeline.record(), "escape": "no"}), encoding="utf-8")
    with pytest.raises(ArtifactError, match="escape must be true or false"):
        TextPipeline.load(written)
    codes.write_text("#version: 0.2\nt h\n", encoding="utf-8")
    pipeline.write(tmp_path)
    with pytest.raises(ArtifactError, match="not the bpe model"):
        TextPipeline.load(tmp_path)
