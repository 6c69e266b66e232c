"""Shared fixtures: tiny dictionaries and configurations, and paths to the real sample data.

Fast subset: ``python -m pytest -m fast`` runs the test modules listed in
:data:`FAST_MODULES` (the model, its blocks and Table 3, attention caches, criterion, schedule,
file helpers, the plugin's fairseq patches and import graph, parsing; only a few short
fairseq runs on a Multi30k slice): 272 tests in 3 min 12 s on 2 cores shared with other jobs
(load 8), against 20 min or more for the whole suite. ``-m "not fast"`` runs the rest. The
marker is given here, by module, so that a new test module joins the subset by being named
below.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import forked_cli
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fairseq.data import Dictionary  # noqa: E402

from user_plugin.registration import register  # noqa: E402

register()

#: The test modules of the fast subset (``-m fast``).
FAST_MODULES = frozenset({
    "test_beam_cache", "test_builtin_transformer", "test_commands", "test_criterion",
    "test_equivalence_with_fairseq", "test_fairseq_patches", "test_fast_subset", "test_files",
    "test_import_cycles", "test_incremental_decoding", "test_line_rule", "test_lr_schedule",
    "test_parameter_counts", "test_parsing_architecture", "test_parsing_evalb",
    "test_parsing_trees", "test_positional_encoding", "test_properties", "test_safe_loading",
    "test_score_translation", "test_table3_architectures",
})


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "fast: the fast subset (conftest.FAST_MODULES)")


#: The slowest test modules, slowest first (wall time per module in a full run on 2 cores: the
#: table that :func:`pytest_terminal_summary` prints at the end). ``scripts/run_tests.sh`` runs
#: whole modules side by side (``--dist loadfile --no-loadscope-reorder``) in collection order,
#: so these start first and the workers finish together; otherwise a long module started last
#: leaves one core idle for its whole length.
SLOWEST_FIRST = (
    "test_decoding_options", "test_faults", "test_gpu_check", "test_recipes",
    "test_recipe_inputs", "test_fault_classes", "test_python312", "test_precision",
    "test_model_package", "test_parsing_recipe", "test_serving", "test_ablation",
    "test_ctranslate2", "test_benchmark_engines", "test_fault_classes_inputs",
)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.path.stem in FAST_MODULES:
            item.add_marker(pytest.mark.fast)
    rank = {name: position for position, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The slowest modules by wall time (set-up, call and tear-down of their tests), to keep
    :data:`SLOWEST_FIRST` true."""
    seconds: Counter[str] = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                seconds[report.nodeid.split("::")[0]] += report.duration
    if len(seconds) > 1:
        terminalreporter.write_sep("=", "slowest 15 modules (seconds, all their tests)")
        for module, total in seconds.most_common(15):
            terminalreporter.write_line(f"{total:8.1f}s {module}")


SHARED_DATA = Path(os.environ.get("VASWANI_SHARED_DATA", REPO.parent / "shared" / "data"))
MULTI30K = SHARED_DATA / "multi30k-en-de"


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """The tests' models are tiny: intra-op threads only add contention on a 2-core machine (a
    two-sentence decode took 2 s with 2 threads, 0.02 s with 1). fairseq CLIs started by the
    tests get ``OMP_NUM_THREADS=1`` likewise (``cli.fairseq_env``)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def require_data(path: Path) -> Path:
    """Skip the calling test, with the reason, when the real sample data is absent."""
    if not path.exists():
        pytest.skip(f"real sample data not found at {path} (set VASWANI_SHARED_DATA)")
    return path


def tokenize_file(src: Path, dst: Path, lang: str, limit: int) -> None:
    """Moses-tokenize the first ``limit`` lines of ``src`` into ``dst`` (sacremoses)."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    with open(src, encoding="utf-8") as fin, open(dst, "w", encoding="utf-8") as fout:
        for i, line in enumerate(fin):
            if i >= limit:
                break
            fout.write(tokenizer.tokenize(line.strip(), escape=False, return_str=True) + "\n")


@pytest.fixture(scope="session")
def multi30k_bin(tmp_path_factory) -> SimpleNamespace:
    """A real slice of Multi30k EN-DE, Moses-tokenized and binarized with a joined dictionary:
    3000 training pairs, 200 validation pairs, 100 test pairs (test_2016_flickr)."""
    from cli import run_fairseq

    require_data(MULTI30K)
    root = tmp_path_factory.mktemp("multi30k")
    text = root / "text"
    text.mkdir()
    for split, name, limit in (("train", "train", 3000), ("valid", "val", 200),
                               ("test", "test_2016_flickr", 100)):
        for lang in ("en", "de"):
            tokenize_file(MULTI30K / f"{name}.{lang}", text / f"{split}.{lang}", lang, limit)
    data_bin = root / "data-bin"
    run_fairseq("preprocess", [
        "--source-lang", "en", "--target-lang", "de", "--joined-dictionary",
        "--trainpref", text / "train", "--validpref", text / "valid", "--testpref", text / "test",
        "--destdir", data_bin, "--thresholdsrc", "2", "--thresholdtgt", "2", "--workers", "1",
    ])
    return SimpleNamespace(root=root, text_dir=text, data_bin=data_bin)


@pytest.fixture(scope="session")
def packaged_tiny_model(tmp_path_factory) -> SimpleNamespace:
    """Multi30k lines prepared by the recipes' prepare step (BPE) and a tiny model trained a few
    updates on them (:mod:`prepared_model`), in a folder whose name holds a space and a
    non-ASCII letter; the save directory holds one checkpoint with the text pipeline record and
    BPE codes beside it, and ``package`` is its model package (``vaswani-package``)."""
    from cli import command, fairseq_env
    from prepared_model import run_prepare, train_tiny, write_raw

    require_data(MULTI30K)
    root = tmp_path_factory.mktemp("package ü")
    splits = {"train": 400, "valid": 40, "test": 40}

    def lines(split: str, lang: str, count: int) -> list[str]:
        name = f"{'val' if split == 'valid' else 'train'}.{lang}"
        return (MULTI30K / name).read_text(encoding="utf-8").split("\n")[:count]

    write_raw(root / "raw", {split: {lang: lines(split, lang, count) for lang in ("en", "de")}
                             for split, count in splits.items()})
    prep = run_prepare("wmt14_en_de", root / "raw", root / "work", BPE_OPS="300")
    model = train_tiny(prep, root, "en", "de", updates=4)
    package = root / "the package"
    proc = forked_cli.run([*command("package"), str(model.checkpoint), "--data-dir",
                           str(model.data_bin), "--output", str(package)], text=True,
                          capture_output=True, env=fairseq_env(), timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    model.package = package
    model.root = root
    return model


@pytest.fixture(scope="session")
def trained_multi30k(multi30k_bin) -> SimpleNamespace:
    """A tiny ``vaswani_base`` trained by the real ``fairseq-train`` for 60 updates on
    :func:`multi30k_bin`, with a checkpoint every 20 updates. ``train_log`` is its output."""
    from cli import PAPER_OPTIMIZATION_ARGS, TINY_MODEL_ARGS, USER_DIR, run_fairseq

    checkpoint_dir = multi30k_bin.root / "checkpoints"
    train_args = [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1",
        *TINY_MODEL_ARGS, *PAPER_OPTIMIZATION_ARGS,
        "--warmup-updates", "40", "--lr-scale", "0.5",
        "--max-tokens", "1500", "--max-update", "60", "--save-interval-updates", "20",
        "--save-dir", checkpoint_dir, "--log-format", "json", "--log-interval", "5",
        "--required-batch-size-multiple", "1", "--num-workers", "0",
    ]
    proc = run_fairseq("train", train_args)
    return SimpleNamespace(
        data_bin=multi30k_bin.data_bin, text_dir=multi30k_bin.text_dir,
        checkpoint_dir=checkpoint_dir, user_dir=USER_DIR, train_args=[str(a) for a in train_args],
        train_log=proc.stdout + proc.stderr,
    )


def make_dictionary(num_types: int) -> Dictionary:
    """A fairseq dictionary with the 4 special symbols plus ``num_types - 4`` dummy words."""
    dictionary = Dictionary()
    for i in range(num_types - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def fake_task(src: Dictionary, tgt: Dictionary | None = None) -> SimpleNamespace:
    return SimpleNamespace(source_dictionary=src, target_dictionary=tgt or src)


def model_args(arch: str, **overrides) -> argparse.Namespace:
    """What fairseq-train would hand the model: the arch's defaults under the user's options."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build_vaswani(dictionary: Dictionary, arch: str = "vaswani_base", **overrides):
    from user_plugin.models.transformer_config import VaswaniTransformerConfig
    from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

    cfg = VaswaniTransformerConfig.from_namespace(model_args(arch, **overrides))
    return VaswaniTransformerModel.build_model(cfg, fake_task(dictionary))


TINY = dict(
    encoder_layers=2,
    decoder_layers=2,
    encoder_embed_dim=32,
    decoder_embed_dim=32,
    encoder_ffn_embed_dim=64,
    decoder_ffn_embed_dim=64,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    dropout=0.0,
    share_all_embeddings=True,
)


def beam_search_start(model, dictionary: Dictionary, src, src_lengths, beam: int):
    """What fairseq's SequenceGenerator hands the decoder on its first step: the encoder output
    expanded to ``beam`` rows per sentence, each row's sentence, and the one-token prefixes."""
    sentences = src.size(0)
    expand = torch.arange(sentences).repeat_interleave(beam)
    encoder_out = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths), expand)
    prefixes = torch.full((sentences * beam, 1), dictionary.eos())
    return encoder_out, expand.clone(), prefixes


def random_batch(dictionary: Dictionary, batch: int = 3, src_len: int = 7, tgt_len: int = 6,
                 seed: int = 0):
    """Left-padded sources and right-padded targets of random lengths, as fairseq batches them."""
    gen = torch.Generator().manual_seed(seed)
    nspecial = dictionary.nspecial
    pad, eos = dictionary.pad(), dictionary.eos()
    src = torch.full((batch, src_len), pad, dtype=torch.long)
    prev = torch.full((batch, tgt_len), pad, dtype=torch.long)
    src_lengths = torch.randint(2, src_len + 1, (batch,), generator=gen)
    src_lengths[0] = src_len
    tgt_lengths = torch.randint(2, tgt_len + 1, (batch,), generator=gen)
    tgt_lengths[0] = tgt_len
    for i in range(batch):
        n = int(src_lengths[i])
        src[i, src_len - n:] = torch.randint(nspecial, len(dictionary), (n,), generator=gen)
        src[i, -1] = eos
        m = int(tgt_lengths[i])
        prev[i, :m] = torch.randint(nspecial, len(dictionary), (m,), generator=gen)
        prev[i, 0] = eos
    return src, src_lengths, prev


#: Small models that decode real sentences after a minute of CPU training: d_model 32, 2+2
#: layers; the variants the exports must handle (post-/pre-norm, shared/separate embeddings,
#: sinusoidal/learned positions).
SHIPPING_VARIANTS = {
    "postnorm_shared": ["--share-all-embeddings"],
    "prenorm_separate_learned": ["--encoder-normalize-before", "--decoder-normalize-before",
                                 "--encoder-learned-pos", "--decoder-learned-pos"],
}


@pytest.fixture(scope="session")
def shipping_models(multi30k_bin) -> SimpleNamespace:
    """Each of :data:`SHIPPING_VARIANTS` trained by the real ``fairseq-train`` for 200
    updates (4 epochs) on :func:`multi30k_bin`; ``checkpoints[variant]`` is the average of its
    last two epoch checkpoints (``vaswani-average``, as the paper decodes)."""
    from cli import PAPER_OPTIMIZATION_ARGS, USER_DIR, command, fairseq_env, run_fairseq

    model_args = [
        "--arch", "vaswani_base", "--encoder-layers", "2", "--decoder-layers", "2",
        "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--dropout", "0.1",
    ]
    checkpoints = {}
    for variant, extra in SHIPPING_VARIANTS.items():
        save_dir = multi30k_bin.root / "shipping" / variant
        run_fairseq("train", [
            multi30k_bin.data_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1",
            *model_args, *extra, *PAPER_OPTIMIZATION_ARGS,
            "--warmup-updates", "100", "--max-tokens", "1000",
            "--max-update", "200",
            "--save-dir", save_dir, "--disable-validation", "--num-workers", "0",
            "--required-batch-size-multiple", "1", "--log-interval", "50",
        ])
        average = save_dir / "checkpoint_avg.pt"
        proc = forked_cli.run(
            [*command("average_checkpoints"), "--inputs",
             str(save_dir), "--num-epoch-checkpoints", "2", "--output", str(average)],
            env=fairseq_env(), capture_output=True, text=True, timeout=300, check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        checkpoints[variant] = average
    return SimpleNamespace(data_bin=multi30k_bin.data_bin, text_dir=multi30k_bin.text_dir,
                           checkpoints=checkpoints)


def our_checkpoint_with(source, output, **model_options) -> None:
    """A checkpoint like ``source`` with other model options ``model_options`` (and, for our
    architectures, freshly initialized weights of that shape)."""
    from user_plugin.models.transformer_config import VaswaniTransformerConfig
    from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

    state = torch.load(source, map_location="cpu", weights_only=True)
    state["cfg"]["model"].update(model_options)
    if state["cfg"]["model"]["_name"].startswith("vaswani"):
        dictionary = make_dictionary(state["model"]["encoder.embed_tokens.weight"].size(0))
        cfg = VaswaniTransformerConfig(**{key: value for key, value in
                                          state["cfg"]["model"].items() if key != "_name"})
        model = VaswaniTransformerModel.build_model(cfg, fake_task(dictionary))
        state["model"] = model.state_dict()
    torch.save(state, output)
