"""``vaswani-plot-attention``: attention heatmaps (the paper's Figures 3-5) from a checkpoint
trained by the real fairseq-train (the ``trained_multi30k`` fixture)."""

import os
from pathlib import Path

import forked_cli
import pytest
import torch
from cli import command, fairseq_env

from user_plugin.commands import plot_attention

REPO = Path(__file__).resolve().parents[1]

LAYERS, HEADS = 2, 4  # the fixture's tiny model (cli.TINY_MODEL_ARGS)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_script(*args):
    return forked_cli.run([*command("plot_attention"), *map(str, args)], env=fairseq_env(),
                          capture_output=True, text=True, timeout=300, check=False)


def expected_names():
    return sorted(f"{kind}_layer{layer}.png" for kind in plot_attention.KINDS
                  for layer in range(1, LAYERS + 1))


def test_decodes_the_source_and_writes_one_png_per_kind_and_layer(trained_multi30k, tmp_path):
    out = tmp_path / "attention"
    proc = run_script("--checkpoint", trained_multi30k.checkpoint_dir / "checkpoint_last.pt",
                      "--data-dir", trained_multi30k.data_bin,
                      "--source", "A man in a blue shirt is standing on a ladder.",
                      "--out-dir", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "decoded target:" in proc.stdout
    files = sorted(p.name for p in out.iterdir())
    assert files == expected_names()  # 3 kinds x 2 layers, no temporary files left
    for name in files:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000


def test_source_target_pair_from_a_model_dir(trained_multi30k, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    os.symlink(trained_multi30k.checkpoint_dir / "checkpoint_best.pt", model_dir / "model.pt")
    for lang in ("en", "de"):
        os.symlink(trained_multi30k.data_bin / f"dict.{lang}.txt", model_dir / f"dict.{lang}.txt")
    out = tmp_path / "pair"
    proc = run_script("--model-dir", model_dir, "--source-lang", "en", "--target-lang", "de",
                      "--source", "Two dogs play in the snow.",
                      "--target", "Zwei Hunde spielen im Schnee.", "--out-dir", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "decoded target:" not in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == expected_names()
    import matplotlib.image

    image = matplotlib.image.imread(out / "encoder_decoder_layer1.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.05  # not a blank picture


def test_attention_maps_are_distributions_with_the_right_shapes(trained_multi30k):
    from user_plugin.hub import load_translator

    translator = load_translator(trained_multi30k.checkpoint_dir / "checkpoint_best.pt",
                                 data_dir=trained_multi30k.data_bin)
    src_dict, tgt_dict = translator.task.source_dictionary, translator.task.target_dictionary
    src = src_dict.encode_line("A dog runs on the beach .", add_if_not_exist=False).long()
    tgt = tgt_dict.encode_line("Ein Hund rennt am Strand .", add_if_not_exist=False).long()
    maps = plot_attention.attention_maps(translator.models[0], src, tgt, tgt_dict.eos())
    S, T = len(src), len(tgt)
    shapes = {"encoder_self": (HEADS, S, S), "decoder_self": (HEADS, T, T),
              "encoder_decoder": (HEADS, T, S)}
    for kind, shape in shapes.items():
        assert len(maps[kind]) == LAYERS
        for weights in maps[kind]:
            assert tuple(weights.shape) == shape
            assert torch.allclose(weights.sum(-1), torch.ones(shape[:2]), atol=1e-5)
    for weights in maps["decoder_self"]:  # masked: no position sees a later one
        assert float(torch.triu(weights, diagonal=1).abs().max()) == 0.0


def test_bad_checkpoint_is_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(b"PK\x03\x04 not really a checkpoint")
    data = tmp_path / "data"  # an output never lies inside a directory the command reads
    data.mkdir()
    (data / "dict.en.txt").write_text("a 1\n", encoding="utf-8")
    (data / "dict.de.txt").write_text("a 1\n", encoding="utf-8")
    out = tmp_path / "none"
    proc = run_script("--checkpoint", bad, "--data-dir", data, "--source-lang", "en",
                      "--target-lang", "de", "--source", "x", "--out-dir", out)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("vaswani-plot-attention: error:") and str(bad) in last
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("missing", [["--out-dir"], ["--source"]])
def test_missing_arguments_are_refused(tmp_path, missing):
    args = {"--checkpoint": tmp_path / "c.pt", "--data-dir": tmp_path, "--source": "x",
            "--out-dir": tmp_path / "o"}
    for key in missing:
        del args[key]
    proc = run_script(*[item for pair in args.items() for item in pair])
    assert proc.returncode == 2 and "required" in proc.stderr
