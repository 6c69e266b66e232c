"""The product as a user runs it: fairseq-preprocess, fairseq-train with our model, criterion
and scheduler, resume from checkpoint_last.pt, fairseq-generate, on real Multi30k text."""

import forked_cli
import pytest
import torch
from cli import USER_DIR, hypotheses, json_log_records, run_fairseq


def test_training_loss_falls(trained_multi30k):
    records = json_log_records(trained_multi30k.train_log, "train_inner")
    losses = [float(r["loss"]) for r in records]
    assert len(losses) >= 10, trained_multi30k.train_log[-2000:]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0, losses


def test_learning_rate_follows_the_paper_schedule(trained_multi30k):
    records = json_log_records(trained_multi30k.train_log, "train_inner")
    assert records
    for record in records:
        # after update k fairseq logs the lr already set for update k + 1, the paper's
        # step_num = k + 1; here d_model 64, warmup 40, scale 0.5
        step = int(record["num_updates"]) + 1
        expected = 0.5 * 64**-0.5 * min(step**-0.5, step * 40**-1.5)
        assert abs(float(record["lr"]) - expected) <= 1e-5 * expected


def test_checkpoint_stores_no_unsafe_globals(trained_multi30k):
    path = trained_multi30k.checkpoint_dir / "checkpoint_last.pt"
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert state["cfg"]["model"]["_name"] == "vaswani_base"
    assert state["cfg"]["criterion"]["_name"] == "vaswani_label_smoothed_cross_entropy"


def test_resume_continues_from_checkpoint_last(trained_multi30k, tmp_path):
    import shutil

    save_dir = tmp_path / "resume"
    shutil.copytree(trained_multi30k.checkpoint_dir, save_dir)
    args = list(trained_multi30k.train_args)
    args[args.index("--max-update") + 1] = "80"
    args[args.index("--save-dir") + 1] = str(save_dir)
    args[args.index("--dropout") + 1] = "0.2"
    args[args.index("--lr-scale") + 1] = "0.25"
    proc = run_fairseq("train", args)
    log = proc.stdout + proc.stderr
    assert "Loaded checkpoint" in log and "@ 60 updates)" in log, log[-3000:]
    # every changed training setting goes on changed, with one line naming both values
    last = save_dir / "checkpoint_last.pt"
    changes = sorted(line.split(" | ")[-1] for line in log.splitlines()
                     if "resuming with" in line)
    assert changes == [f"resuming with --dropout 0.2 where {last} was trained with 0.1",
                       f"resuming with --lr-scale 0.25 where {last} was trained with 0.5",
                       f"resuming with --max-update 80 where {last} was trained with 60"]
    updates = [int(r["num_updates"]) for r in json_log_records(log, "train_inner")]
    assert updates and min(updates) > 60 and max(updates) == 80, updates
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 80


def test_generate_decodes_every_test_sentence(trained_multi30k):
    proc = run_fairseq("generate", [
        trained_multi30k.data_bin, "--user-dir", USER_DIR,
        "--path", trained_multi30k.checkpoint_dir / "checkpoint_last.pt",
        "--gen-subset", "test", "--beam", "4", "--batch-size", "16",
        "--required-batch-size-multiple", "1", "--cpu",
    ])
    hyps = hypotheses(proc.stdout)
    assert sorted(hyps) == list(range(100))
    assert all("score" in h for h in hyps.values())


FAIRSEQ_TRANSFORMER_OPTIONS = {
    "--encoder-embed-dim": ("encoder_embed_dim", "48", 48),
    "--encoder-ffn-embed-dim": ("encoder_ffn_embed_dim", "96", 96),
    "--encoder-layers": ("encoder_layers", "3", 3),
    "--encoder-attention-heads": ("encoder_attention_heads", "6", 6),
    "--decoder-embed-dim": ("decoder_embed_dim", "48", 48),
    "--decoder-ffn-embed-dim": ("decoder_ffn_embed_dim", "96", 96),
    "--decoder-layers": ("decoder_layers", "1", 1),
    "--decoder-attention-heads": ("decoder_attention_heads", "6", 6),
    "--dropout": ("dropout", "0.2", 0.2),
    "--attention-dropout": ("attention_dropout", "0.05", 0.05),
    "--activation-dropout": ("activation_dropout", "0.04", 0.04),
    "--activation-fn": ("activation_fn", "gelu", "gelu"),
    "--max-source-positions": ("max_source_positions", "300", 300),
    "--max-target-positions": ("max_target_positions", "301", 301),
}
FAIRSEQ_TRANSFORMER_FLAGS = [
    "--share-all-embeddings", "--share-decoder-input-output-embed", "--no-scale-embedding",
    "--encoder-normalize-before", "--decoder-normalize-before", "--encoder-learned-pos",
    "--decoder-learned-pos",
]


@pytest.mark.parametrize("arch", ["transformer", "vaswani_base"])
def test_one_command_line_for_fairseq_transformer_and_ours(arch):
    """The same fairseq-train model options parse to the same values under --arch transformer
    and --arch vaswani_base (fairseq's own parser, as fairseq-train uses it)."""
    from fairseq import options

    argv = ["data", "--user-dir", USER_DIR, "--arch", arch, *FAIRSEQ_TRANSFORMER_FLAGS]
    for option, (_, text, _) in FAIRSEQ_TRANSFORMER_OPTIONS.items():
        argv += [option, text]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    for name, _, value in FAIRSEQ_TRANSFORMER_OPTIONS.values():
        assert str(getattr(args, name)) == str(value), name
    for flag in FAIRSEQ_TRANSFORMER_FLAGS:
        assert getattr(args, flag[2:].replace("-", "_")) is True, flag


def test_paper_values_are_the_defaults_of_vaswani_base():
    from fairseq import options

    args = options.parse_args_and_arch(
        options.get_training_parser(), ["data", "--user-dir", USER_DIR, "--arch", "vaswani_base",
                                         "--criterion", "vaswani_label_smoothed_cross_entropy",
                                         "--lr-scheduler", "vaswani_inverse_sqrt"])
    assert (args.encoder_layers, args.encoder_embed_dim, args.encoder_ffn_embed_dim,
            args.encoder_attention_heads, args.dropout) == (6, 512, 2048, 8, 0.1)
    assert (args.decoder_layers, args.decoder_embed_dim, args.decoder_ffn_embed_dim,
            args.decoder_attention_heads) == (6, 512, 2048, 8)
    from user_plugin.models.transformer_config import VaswaniTransformerConfig

    cfg = VaswaniTransformerConfig.from_namespace(args)
    assert cfg.encoder_normalize_before is False and cfg.encoder_learned_pos is False
    assert cfg.encoder_embed_dim == 512 and str(cfg.activation_fn) == "relu"
    assert args.label_smoothing == 0.1 and args.warmup_updates == 4000


def test_model_options_script_lists_every_option_with_its_default():

    from cli import command

    proc = forked_cli.run(command("model_options"),
                          capture_output=True, text=True, check=True)
    for option in [*FAIRSEQ_TRANSFORMER_OPTIONS, *FAIRSEQ_TRANSFORMER_FLAGS, "--label-smoothing",
                   "--warmup-updates", "--lr-scale", "--attention-key-dim",
                   "--length-penalty-form", "--max-len-over-source"]:
        assert option in proc.stdout, option
    text = " ".join(proc.stdout.split())
    assert "(paper: 0.1) (default: 0.1)" in text and "(4000) (default: 4000)" in text


def test_model_options_show_the_asked_architectures_defaults_and_refuse_others():
    """vaswani-options --arch vaswani_big printed base's defaults, and --arch nonexistent
    exited 0 printing everything: neither said what was asked."""

    from cli import command

    def defaults(arch: str) -> str:
        proc = forked_cli.run([*command("model_options"), "--arch", arch], capture_output=True,
                              text=True, check=True)
        return " ".join(proc.stdout.split())

    assert "d_model of the encoder (default: 1024)" in defaults("vaswani_big")
    assert "d_model of the encoder (default: 512)" in defaults("vaswani_base")
    assert "(default: 4)" in defaults("vaswani_table3_c_layers4")  # layers of that row
    proc = forked_cli.run([*command("model_options"), "--arch", "nonexistent"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "argument --arch: invalid choice: 'nonexistent'" in proc.stderr
