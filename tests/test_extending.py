"""The extension guide's example (docs/extending.md, examples/custom_ffn): a user dir that loads
vaswani's plugin, registers a model whose feed-forward block (§3.3) is a gated linear unit, and
trains and decodes with the real fairseq-train and fairseq-generate."""

import json
import sys

import forked_cli
import pytest
import torch
from cli import (
    PAPER_OPTIMIZATION_ARGS,
    REPO,
    TINY_MODEL_ARGS,
    fairseq_env,
    hypotheses,
    json_log_records,
    run_fairseq,
)
from conftest import fake_task, make_dictionary, model_args, random_batch

EXAMPLE_DIR = REPO / "examples" / "custom_ffn"
PLUGIN_DIR = REPO / "user_plugin"
# the tests' tiny model, with the example's architecture instead of vaswani_base
TINY_GATED_ARGS = ["--arch", "gated_ffn_base", *TINY_MODEL_ARGS[2:]]
assert TINY_MODEL_ARGS[:2] == ["--arch", "vaswani_base"]

REGISTRY_REPORT = """
import json, sys
from argparse import Namespace
from fairseq import utils
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq.tasks import TASK_REGISTRY
for path in sys.argv[1:]:
    utils.import_user_module(Namespace(user_dir=path))
import user_plugin
print(json.dumps({
    "gated_model": MODEL_REGISTRY["gated_ffn_transformer"].__name__,
    "gated_bases": [c.__name__ for c in MODEL_REGISTRY["gated_ffn_transformer"].__mro__],
    "gated_arch": ARCH_MODEL_REGISTRY["gated_ffn_base"].__name__,
    "base_arch": ARCH_MODEL_REGISTRY["vaswani_base"].__name__,
    "table3_arch": ARCH_MODEL_REGISTRY["vaswani_table3_b_dk16"].__name__,
    "plugin_file": user_plugin.__file__,
    "plugin_modules": sorted(m for m in sys.modules if m.split(".")[0] == "user_plugin"),
    "duplicate_packages": sorted(m for m in sys.modules if m.endswith(".user_plugin")),
}))
"""


@pytest.mark.parametrize("order", [
    [PLUGIN_DIR, EXAMPLE_DIR, EXAMPLE_DIR],
    [EXAMPLE_DIR, PLUGIN_DIR, EXAMPLE_DIR, PLUGIN_DIR],
], ids=["plugin-then-example", "example-then-plugin"])
def test_loading_both_user_dirs_registers_each_once(order, tmp_path):
    """fairseq takes one --user-dir; the example loads ours, in any order, without duplicates."""
    proc = forked_cli.run(
        [sys.executable, "-c", REGISTRY_REPORT, *map(str, order)], cwd=tmp_path,
        env=fairseq_env(), capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["gated_model"] == report["gated_arch"] == "GatedFFNTransformerModel"
    assert "VaswaniTransformerModel" in report["gated_bases"]
    assert report["base_arch"] == report["table3_arch"] == "VaswaniTransformerModel"
    assert report["plugin_file"] == str(PLUGIN_DIR / "__init__.py")
    assert "user_plugin.models.table3_architectures" in report["plugin_modules"]
    assert report["duplicate_packages"] == []


@pytest.fixture(scope="module")
def custom_ffn():
    """The example package, imported as fairseq's --user-dir would."""
    from argparse import Namespace

    from fairseq import utils

    utils.import_user_module(Namespace(user_dir=str(EXAMPLE_DIR)))
    import custom_ffn.models.gated_ffn_transformer as gated

    return gated


def build_gated(dictionary, **overrides):
    gated = sys.modules["custom_ffn.models.gated_ffn_transformer"]
    cfg = gated.GatedFFNTransformerConfig.from_namespace(model_args("gated_ffn_base", **overrides))
    return gated.GatedFFNTransformerModel.build_model(cfg, fake_task(dictionary))


def test_every_layer_uses_the_gated_block(custom_ffn):
    from custom_ffn.gated_feed_forward import GatedFeedForward

    dictionary = make_dictionary(60)
    model = build_gated(dictionary, encoder_layers=2, decoder_layers=3, encoder_embed_dim=32,
                        decoder_embed_dim=32, encoder_ffn_embed_dim=48, decoder_ffn_embed_dim=48,
                        encoder_attention_heads=4, decoder_attention_heads=4, dropout=0.0,
                        share_all_embeddings=True)
    layers = [*model.encoder.layers, *model.decoder.layers]
    assert len(layers) == 5
    assert all(isinstance(layer.ffn, GatedFeedForward) for layer in layers)
    assert model.cfg.ffn_gate_activation == "gelu"
    src, src_lengths, prev = random_batch(dictionary)
    logits, _ = model(src, src_lengths, prev)
    assert logits.shape == (*prev.shape, len(dictionary)) and torch.isfinite(logits).all()


def test_gated_block_computes_the_gated_linear_unit(custom_ffn):
    from custom_ffn.gated_feed_forward import GatedFeedForward

    torch.manual_seed(0)
    block = GatedFeedForward(8, 12, activation_fn="gelu")
    x = torch.randn(2, 3, 8)
    expected = block.fc2(torch.nn.functional.gelu(block.fc1(x)) * block.fc_gate(x))
    torch.testing.assert_close(block(x), expected)
    with torch.no_grad():  # a closed gate lets only the output bias through
        block.fc_gate.weight.zero_()
        block.fc_gate.bias.zero_()
    torch.testing.assert_close(block(x), block.fc2.bias.expand(2, 3, 8))


def test_gated_base_keeps_the_base_parameter_count(custom_ffn):
    from conftest import build_vaswani

    with torch.device("meta"):
        dictionary = make_dictionary(37000)
        gated = build_gated(dictionary, share_all_embeddings=True)
        base = build_vaswani(dictionary, "vaswani_base", share_all_embeddings=True)
    gated_count = sum(p.numel() for p in gated.parameters())
    base_count = sum(p.numel() for p in base.parameters())
    assert abs(gated_count - base_count) / base_count < 0.001, (gated_count, base_count)


@pytest.fixture(scope="module")
def trained_example(multi30k_bin):
    save_dir = multi30k_bin.root / "gated_checkpoints"
    proc = run_fairseq("train", [
        multi30k_bin.data_bin, "--user-dir", EXAMPLE_DIR, "--cpu", "--seed", "1",
        *TINY_GATED_ARGS, *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", "20", "--lr-scale", "0.5",
        "--max-tokens", "1500", "--max-update", "40", "--save-dir", save_dir,
        "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "5",
        "--required-batch-size-multiple", "1", "--num-workers", "0",
    ])
    return save_dir, proc.stdout + proc.stderr


def test_example_trains_through_fairseq_train(trained_example):
    _, log = trained_example
    assert "model: GatedFFNTransformerModel" in log
    losses = [float(r["loss"]) for r in json_log_records(log, "train_inner")]
    assert len(losses) >= 6 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0, losses


def test_checkpoint_holds_the_gate_weights_of_every_layer(trained_example):
    save_dir, _ = trained_example
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["cfg"]["model"]["_name"] == "gated_ffn_base"
    assert state["cfg"]["model"]["ffn_gate_activation"] == "gelu"
    weights = state["model"]
    for stack in ("encoder", "decoder"):
        for i in range(2):
            gate = weights[f"{stack}.layers.{i}.ffn.fc_gate.weight"]
            assert gate.shape == (128, 64)
            assert gate.abs().sum() > 0


def test_example_decodes_through_fairseq_generate(trained_example, multi30k_bin):
    save_dir, _ = trained_example
    proc = run_fairseq("generate", [
        multi30k_bin.data_bin, "--user-dir", EXAMPLE_DIR,
        "--path", save_dir / "checkpoint_last.pt", "--gen-subset", "test", "--beam", "4",
        "--batch-size", "32", "--required-batch-size-multiple", "1", "--cpu",
    ])
    hyps = hypotheses(proc.stdout)
    assert sorted(hyps) == list(range(100))
    assert all(len(h["tokens"]) > 0 for h in hyps.values())
