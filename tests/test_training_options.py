"""Every model option of fairseq's ``transformer`` is accepted by ``--arch vaswani_base`` under
the same name, with the same meaning or refused in one line: the option lists compared through
fairseq's own parser, activation checkpointing (same loss and gradients), LayerDrop and its
pruning at load (through the real fairseq-train / fairseq-generate), cross+self-attention and
no cross-attention in beam search, and the smaller options. Same-function checks against
fairseq's built-in transformer are in ``test_equivalence_with_fairseq.py``."""

import functools
from types import SimpleNamespace

import forked_cli
import pytest
import torch
from cli import (
    PAPER_OPTIMIZATION_ARGS,
    TINY_MODEL_ARGS,
    USER_DIR,
    hypotheses,
    json_log_records,
    run_fairseq,
)
from conftest import TINY, beam_search_start, build_vaswani, make_dictionary, random_batch

from user_plugin.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropy,
    _fusable_output_weight,
)
from user_plugin.models.transformer_config import UNSUPPORTED_OPTIONS

# options (argparse dests) that one of the two architectures has and the other lacks, and why
INTENTIONAL_DIFFERENCES = {
    "attention_key_dim": "d_k per head set on its own (Table 3 row B); fairseq's transformer "
                         "always uses d_model / h",
    "attention_value_dim": "d_v per head set on its own; fairseq's transformer always uses "
                           "d_model / h",
    "alignment_layer": "fairseq's transformer_align option (which layer --print-alignment "
                       "reads); fairseq's transformer always reads the last",
    "alignment_heads": "fairseq's transformer_align option (how many heads alignments "
                       "average); fairseq's transformer always averages all",
    "full_context_alignment": "fairseq's transformer_align option (alignments without the "
                              "causal mask)",
    "compile_layers": "each layer through torch.compile while training; fairseq has no "
                      "compiled path",
}


def model_options(arch: str) -> dict:
    """``dest -> option strings`` of the model options fairseq-train adds for ``--arch``
    (``options.parse_args_and_arch`` puts them in its "Model-specific configuration" group)."""
    from fairseq import options

    parser = options.get_training_parser()
    options.parse_args_and_arch(parser, ["data", "--user-dir", USER_DIR, "--arch", arch])
    (group,) = [g for g in parser._action_groups if g.title == "Model-specific configuration"]
    return {action.dest: tuple(action.option_strings) for action in group._group_actions}


def test_option_list_equals_fairseq_transformer_but_for_listed_differences():
    theirs, ours = model_options("transformer"), model_options("vaswani_base")
    assert sorted(set(theirs) - set(ours)) == []
    assert sorted(set(ours) - set(theirs)) == sorted(INTENTIONAL_DIFFERENCES)
    for dest in set(theirs) & set(ours):
        assert ours[dest] == theirs[dest], dest
    assert all(INTENTIONAL_DIFFERENCES.values())


def test_model_options_script_lists_every_option_of_fairseqs_transformer():

    from cli import command

    proc = forked_cli.run(command("model_options"),
                          capture_output=True, text=True, check=True)
    listed = set(proc.stdout.split())
    for strings in model_options("transformer").values():
        assert set(strings) <= listed, strings
    text = " ".join(proc.stdout.split())
    assert f"not supported: {UNSUPPORTED_OPTIONS['char_inputs']}" in text


# every option beyond the paper, at a value other than its default
BEYOND_THE_PAPER = [
    "--encoder-layerdrop", "0.2", "--decoder-layerdrop", "0.1", "--checkpoint-activations",
    "--offload-activations", "--cross-self-attention", "--no-cross-attention",
    "--layernorm-embedding", "--no-token-positional-embeddings", "--no-decoder-final-norm",
    "--decoder-output-dim", "48", "--relu-dropout", "0.1", "--min-params-to-wrap", "5",
    "--export", "--quant-noise-pq", "0.1", "--quant-noise-pq-block-size", "4",
    "--quant-noise-scalar", "0.1", "--adaptive-softmax-cutoff", "100,200",
    "--adaptive-softmax-dropout", "0.1", "--adaptive-softmax-factor", "2",
    "--encoder-embed-path", "e.vec", "--decoder-embed-path", "d.vec",
    "--encoder-layers-to-keep", "0,1", "--decoder-layers-to-keep", "0,2",
    "--adaptive-input", "--tie-adaptive-weights", "--tie-adaptive-proj", "--merge-src-tgt-embed",
    "--char-inputs", "--encoder-xformers-att-config", "{}", "--decoder-xformers-att-config", "{}",
    "--base-layers", "1", "--base-sublayers", "2", "--base-shuffle", "0",
]


def test_one_command_line_with_every_option_parses_alike_for_both_archs():
    from fairseq import options

    parsed = {}
    for arch in ("transformer", "vaswani_base"):
        argv = ["data", "--user-dir", USER_DIR, "--arch", arch, *BEYOND_THE_PAPER]
        parsed[arch] = vars(options.parse_args_and_arch(options.get_training_parser(), argv))

    def plain(value):  # fairseq parses a layer list to [0, 2] and the output dim to "48"
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)

    given = [a[2:].replace("-", "_") for a in BEYOND_THE_PAPER if a.startswith("--")]
    for dest in given:
        assert plain(parsed["vaswani_base"][dest]) == plain(parsed["transformer"][dest]), dest


def non_default(name: str):
    from user_plugin.models.transformer_config import VaswaniTransformerConfig

    default = VaswaniTransformerConfig.__dataclass_fields__[name].default
    if isinstance(default, bool):
        return True
    if default is None:
        return "{}"
    return default + 1


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_OPTIONS))
def test_unsupported_options_are_refused_in_one_line_with_the_reason(name):
    with pytest.raises(ValueError) as error:
        build_vaswani(make_dictionary(20), **dict(TINY, **{name: non_default(name)}))
    message = str(error.value)
    assert "\n" not in message
    assert f"--{name.replace('_', '-')} is not supported: {UNSUPPORTED_OPTIONS[name]}" in message


def test_unsupported_options_at_their_default_are_accepted():
    defaults = {name: None for name in UNSUPPORTED_OPTIONS}  # as fairseq leaves unset options
    defaults.update(adaptive_input=False, base_layers=0, base_sublayers=1, base_shuffle=1)
    model = build_vaswani(make_dictionary(20), **dict(TINY, **defaults))
    assert len(model.decoder.layers) == 2


@pytest.mark.parametrize("options, expected", [
    (dict(decoder_layers_to_keep="0,2"), "--decoder-layers-to-keep '0,2' must name distinct "
                                         "layers among the 2 of the stack"),
    (dict(encoder_layers_to_keep="0,x"), "--encoder-layers-to-keep takes comma-separated"),
    (dict(decoder_layerdrop=1.0), "--decoder-layerdrop must be in [0, 1)"),
    (dict(cross_self_attention=True, encoder_embed_dim=48, share_all_embeddings=False),
     "--cross-self-attention projects encoder outputs and decoder states alike"),
    (dict(decoder_output_dim=24), "--decoder-output-dim 24 differs from --decoder-embed-dim"),
    (dict(quant_noise_pq=0.1, quant_noise_pq_block_size=5),
     "--quant-noise-pq-block-size 5 must divide --encoder-embed-dim"),
    (dict(adaptive_softmax_cutoff=[30, 10]), "--adaptive-softmax-cutoff must be increasing"),
    (dict(adaptive_softmax_cutoff=[10, 30]), "exceeds the target vocabulary of 20 types"),
    (dict(decoder_embed_path="other.vec", encoder_embed_path="e.vec"),
     "--decoder-embed-path must be the same file or unset"),
])
def test_impossible_option_values_are_refused_naming_the_option(options, expected):
    with pytest.raises(ValueError) as error:
        build_vaswani(make_dictionary(20), **dict(TINY, **options))
    assert expected in str(error.value) and "\n" not in str(error.value)


# -- activation checkpointing ---------------------------------------------------------------


def loss_and_gradients(model, sample, seed: int):
    """Training-mode loss of our criterion on ``sample``, its gradients, and the bytes of the
    tensors autograd kept for the backward pass."""
    saved_bytes = []

    def pack(t):
        saved_bytes.append(t.numel() * t.element_size())
        return t

    task = SimpleNamespace(target_dictionary=model.decoder.dictionary)
    criterion = LabelSmoothedCrossEntropy(task, sentence_avg=False, label_smoothing=0.1)
    model.train()
    model.zero_grad()
    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _, _ = criterion(model, sample)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return loss.detach(), grads, sum(saved_bytes)


def training_sample(dictionary, seed=0):
    src, src_lengths, prev = random_batch(dictionary, batch=4, src_len=9, tgt_len=7, seed=seed)
    target = torch.cat([prev[:, 1:], torch.full((4, 1), dictionary.pad())], dim=1)
    target = target.masked_fill(prev.eq(dictionary.pad()), dictionary.pad())
    return {
        "net_input": {"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": prev},
        "target": target,
        "ntokens": int(target.ne(dictionary.pad()).sum()),
    }


@pytest.mark.parametrize("option", ["checkpoint_activations", "offload_activations"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients_with_less_memory(option):
    dictionary = make_dictionary(40)
    options = dict(TINY, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
                   encoder_layers=3, decoder_layers=3)
    torch.manual_seed(0)
    plain = build_vaswani(dictionary, **options)
    checkpointed = build_vaswani(dictionary, **dict(options, **{option: True}))
    checkpointed.load_state_dict(plain.state_dict())
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    for layer in [*checkpointed.encoder.layers, *checkpointed.decoder.layers]:
        assert isinstance(layer.forward, functools.partial)  # fairseq's checkpoint_wrapper
        assert layer.forward.args[1] is (option == "offload_activations")  # offload_to_cpu
    sample = training_sample(dictionary)
    loss, grads, plain_bytes = loss_and_gradients(plain, sample, seed=3)
    loss_ckpt, grads_ckpt, ckpt_bytes = loss_and_gradients(checkpointed, sample, seed=3)
    torch.testing.assert_close(loss_ckpt, loss, atol=1e-6, rtol=0)
    assert grads.keys() == grads_ckpt.keys()
    for name, grad in grads.items():  # 1e-6 of the gradient's scale (float32 sums reordered)
        difference = (grads_ckpt[name] - grad).abs().max().item()
        assert difference <= 1e-6 * max(1.0, grad.abs().max().item()), (name, difference)
    assert ckpt_bytes < 0.6 * plain_bytes, (ckpt_bytes, plain_bytes)


# -- LayerDrop --------------------------------------------------------------------------------


def test_layerdrop_skips_whole_layers_in_training_only():
    dictionary = make_dictionary(40)
    options = dict(TINY, encoder_layers=4, decoder_layers=4)
    torch.manual_seed(0)
    plain = build_vaswani(dictionary, **options)
    dropping = build_vaswani(dictionary, **dict(options, encoder_layerdrop=0.5,
                                                decoder_layerdrop=0.5))
    dropping.load_state_dict(plain.state_dict())
    assert list(dropping.state_dict()) == list(plain.state_dict())
    calls = []
    for stack in (dropping.encoder, dropping.decoder):
        for i in range(len(stack.layers)):  # iterating would skip layers: it is in training
            stack.layers[i].register_forward_hook(lambda *_: calls.append(1))
    src, src_lengths, prev = random_batch(dictionary, batch=2, src_len=6, tgt_len=5)

    def layers_run(model):
        calls.clear()
        model(src, src_lengths, prev)
        return len(calls)

    torch.manual_seed(1)
    dropping.train()
    in_training = [layers_run(dropping) for _ in range(12)]
    assert min(in_training) < 8 and len(set(in_training)) > 1, in_training
    dropping.eval()
    plain.eval()
    assert [layers_run(dropping) for _ in range(3)] == [8, 8, 8]
    with torch.no_grad():
        torch.testing.assert_close(dropping(src, src_lengths, prev)[0],
                                   plain(src, src_lengths, prev)[0])


@pytest.fixture(scope="module")
def layerdrop_checkpoint(multi30k_bin):
    """A 3+3-layer model trained with LayerDrop 0.3 by the real fairseq-train (30 updates)."""
    save_dir = multi30k_bin.root / "layerdrop"
    args = [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "1",
        *TINY_MODEL_ARGS, "--encoder-layers", "3", "--decoder-layers", "3",
        "--encoder-layerdrop", "0.3", "--decoder-layerdrop", "0.3",
        *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", "20",
        "--max-tokens", "1500", "--max-update", "30", "--save-dir", save_dir,
        "--log-format", "json", "--log-interval", "5", "--no-epoch-checkpoints",
        "--required-batch-size-multiple", "1", "--num-workers", "0",
    ]
    proc = run_fairseq("train", args)
    return SimpleNamespace(path=save_dir / "checkpoint_last.pt", args=[str(a) for a in args],
                           log=proc.stdout + proc.stderr, data_bin=multi30k_bin.data_bin)


def test_layerdrop_trains_through_fairseq_train(layerdrop_checkpoint):
    losses = [float(r["loss"]) for r in json_log_records(layerdrop_checkpoint.log, "train_inner")]
    assert len(losses) >= 5 and losses[-1] < losses[0], losses
    state = torch.load(layerdrop_checkpoint.path, map_location="cpu", weights_only=True)
    assert state["cfg"]["model"]["decoder_layerdrop"] == 0.3
    assert "decoder.layers.2.ffn.fc1.weight" in state["model"]


def test_pruned_checkpoint_decodes_with_model_overrides(layerdrop_checkpoint):
    """fairseq's flow for a checkpoint trained with LayerDrop: fairseq-generate
    --model-overrides "{'decoder_layers_to_keep': '0,2'}" builds the smaller model and
    ``prune_state_dict`` loads the kept layers into it."""
    from fairseq import checkpoint_utils

    overrides = {"encoder_layers_to_keep": "1,2", "decoder_layers_to_keep": "0,2"}
    proc = run_fairseq("generate", [
        layerdrop_checkpoint.data_bin, "--user-dir", USER_DIR,
        "--path", layerdrop_checkpoint.path, "--model-overrides", repr(overrides),
        "--gen-subset", "test", "--beam", "4", "--batch-size", "32",
        "--required-batch-size-multiple", "1", "--cpu",
    ])
    assert "Pruning model to specified layer configuration" in proc.stdout + proc.stderr
    hyps = hypotheses(proc.stdout)
    assert sorted(hyps) == list(range(100)) and all("tokens" in h for h in hyps.values())

    (model,), _ = checkpoint_utils.load_model_ensemble([str(layerdrop_checkpoint.path)],
                                                       arg_overrides=dict(overrides))
    state = torch.load(layerdrop_checkpoint.path, map_location="cpu", weights_only=True)["model"]
    assert len(model.encoder.layers) == len(model.decoder.layers) == 2
    pruned = model.state_dict()
    for ours, theirs in (("encoder.layers.0", "encoder.layers.1"),
                         ("encoder.layers.1", "encoder.layers.2"),
                         ("decoder.layers.0", "decoder.layers.0"),
                         ("decoder.layers.1", "decoder.layers.2")):
        name = "ffn.fc1.weight"
        torch.testing.assert_close(pruned[f"{ours}.{name}"], state[f"{theirs}.{name}"])


def test_pruned_model_trains_on_with_the_training_option(layerdrop_checkpoint, tmp_path):
    """fairseq's flow to go on training a pruned model: fairseq-train --finetune-from-model
    with --decoder-layers-to-keep (the encoder keeps its layers). Rerunning the same command
    resumes from the pruned checkpoint_last.pt, and its checkpoints decode with no override."""
    args = list(layerdrop_checkpoint.args)
    args[args.index("--save-dir") + 1] = str(tmp_path)
    args[args.index("--max-update") + 1] = "4"
    args += ["--finetune-from-model", str(layerdrop_checkpoint.path),
             "--decoder-layers-to-keep", "0,2"]
    proc = run_fairseq("train", args)
    assert "Pruning model to specified layer configuration" in proc.stdout + proc.stderr
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    pretrained = torch.load(layerdrop_checkpoint.path, map_location="cpu", weights_only=True)
    def layers(side):
        return {k.split(".")[2] for k in state["model"] if k.startswith(f"{side}.layers.")}

    assert layers("decoder") == {"0", "1"} and layers("encoder") == {"0", "1", "2"}
    assert state["cfg"]["model"]["decoder_layers"] == 2
    assert pretrained["cfg"]["model"]["decoder_layers"] == 3

    args[args.index("--max-update") + 1] = "8"  # the same command, resumed further
    proc = run_fairseq("train", args)
    log = proc.stdout + proc.stderr
    assert "Loaded checkpoint" in log and "@ 4 updates)" in log, log[-3000:]
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 8
    proc = run_fairseq("generate", [
        layerdrop_checkpoint.data_bin, "--user-dir", USER_DIR,
        "--path", tmp_path / "checkpoint_last.pt", "--gen-subset", "test", "--beam", "2",
        "--batch-size", "50", "--required-batch-size-multiple", "1", "--cpu",
    ])
    assert sorted(hypotheses(proc.stdout)) == list(range(100))


def test_checkpoint_from_before_the_options_loads_as_it_was(layerdrop_checkpoint, tmp_path):
    """A checkpoint whose stored configuration lacks the options (written before they
    existed) gets their defaults and loads the same weights."""
    from fairseq import checkpoint_utils

    from user_plugin.models.transformer_config import VaswaniTransformerConfig

    state = torch.load(layerdrop_checkpoint.path, map_location="cpu", weights_only=True)
    old_fields = set(TINY) | {
        "activation_fn", "dropout", "attention_dropout", "activation_dropout",
        "encoder_normalize_before", "encoder_learned_pos", "decoder_normalize_before",
        "decoder_learned_pos", "attention_key_dim", "attention_value_dim",
        "share_decoder_input_output_embed", "no_scale_embedding", "max_source_positions",
        "max_target_positions",
    }
    fields = {f for f in VaswaniTransformerConfig.__dataclass_fields__ if not f.startswith("_")}
    new_fields = fields - old_fields
    assert "cross_self_attention" in new_fields and "decoder_layerdrop" in new_fields
    for name in new_fields:
        del state["cfg"]["model"][name]
    old = tmp_path / "old.pt"
    torch.save(state, old)
    (model,), _ = checkpoint_utils.load_model_ensemble([str(old)])
    loaded = model.state_dict()
    assert loaded.keys() == state["model"].keys()
    for name, tensor in state["model"].items():
        torch.testing.assert_close(loaded[name], tensor.to(loaded[name].dtype), msg=name)


def test_an_unsupported_option_stops_fairseq_train_with_one_line(multi30k_bin, tmp_path):
    import sys

    from cli import fairseq_env

    proc = forked_cli.run(
        [sys.executable, "-m", "fairseq_cli.train", str(multi30k_bin.data_bin), "--user-dir",
         USER_DIR, "--cpu", *TINY_MODEL_ARGS, *PAPER_OPTIMIZATION_ARGS, "--base-layers", "1",
         "--max-update", "1", "--max-tokens", "1000", "--save-dir", str(tmp_path)],
        env=fairseq_env(), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("train.py: error: vaswani_transformer: --base-layers is not supported: "
                    + UNSUPPORTED_OPTIONS["base_layers"])


def test_options_beyond_the_paper_train_and_decode_through_the_real_clis(multi30k_bin,
                                                                         tmp_path):
    """Many options at once through fairseq-train, its checkpoint and fairseq-generate."""
    options = [
        "--cross-self-attention", "--checkpoint-activations", "--offload-activations",
        "--layernorm-embedding", "--encoder-normalize-before", "--decoder-normalize-before",
        "--no-decoder-final-norm", "--relu-dropout", "0.1", "--quant-noise-pq", "0.05",
        "--adaptive-softmax-cutoff", "500,1500", "--decoder-output-dim", "48",
        "--min-params-to-wrap", "1000", "--export",
    ]
    proc = run_fairseq("train", [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--cpu", "--seed", "2",
        *TINY_MODEL_ARGS, *options, *PAPER_OPTIMIZATION_ARGS, "--warmup-updates", "40",
        "--lr-scale", "0.5",
        "--max-tokens", "1500", "--max-update", "12", "--save-dir", tmp_path,
        "--log-format", "json", "--log-interval", "4", "--no-epoch-checkpoints",
        "--required-batch-size-multiple", "1", "--num-workers", "0",
    ])
    losses = [float(r["loss"]) for r in json_log_records(proc.stdout + proc.stderr,
                                                         "train_inner")]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["cfg"]["model"]["adaptive_softmax_cutoff"] == [500, 1500]
    assert "decoder.adaptive_softmax.head.weight" in state["model"]
    assert "decoder.layer_norm.weight" not in state["model"]
    assert state["model"]["decoder.project_out_dim.weight"].shape == (48, 64)
    proc = run_fairseq("generate", [
        multi30k_bin.data_bin, "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt",
        "--gen-subset", "test", "--beam", "4", "--batch-size", "50",
        "--required-batch-size-multiple", "1", "--cpu",
    ])
    hyps = hypotheses(proc.stdout)
    assert sorted(hyps) == list(range(100)) and all("score" in h for h in hyps.values())


# -- cross+self-attention and no cross-attention in beam search -----------------------------

DECODER_VARIANTS = {
    "cross_self_attention": dict(cross_self_attention=True),
    "cross_self_attention_only": dict(cross_self_attention=True, no_cross_attention=True),
    "no_cross_attention": dict(no_cross_attention=True),
}


@pytest.mark.parametrize("variant", sorted(DECODER_VARIANTS))
def test_beam_search_steps_follow_the_full_forward(variant, monkeypatch):
    """Three sentences x beam 3 as fairseq's SequenceGenerator expands them: reorders inside
    sentences, a sentence leaving, a reorder across sentences (the caches' fallback), buffers
    growing; each step's logits equal the full forward of each hypothesis' prefix."""
    from user_plugin.modules import beam_state

    monkeypatch.setattr(beam_state, "INITIAL_CAPACITY", 2)
    torch.manual_seed(0)
    dictionary = make_dictionary(40)
    model = build_vaswani(dictionary, **dict(TINY, **DECODER_VARIANTS[variant])).eval()
    beam = 3
    src, src_lengths, _ = random_batch(dictionary, batch=3, src_len=6, tgt_len=2, seed=1)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        encoder_out, sentence_of_row, prefixes = beam_search_start(model, dictionary, src,
                                                                   src_lengths, beam)
        state = {}
        for step in range(8):
            logits, _ = model.decoder(prefixes, encoder_out, incremental_state=state)
            full, _ = model(src[sentence_of_row], src_lengths[sentence_of_row], prefixes)
            torch.testing.assert_close(logits[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)
            if step == 0 and DECODER_VARIANTS[variant].get("cross_self_attention"):
                cache = model.decoder.layers[0].self_attn.get_incremental_state(
                    state, "attn_cache")["cache"]
                assert cache.encoder.key.size(0) == 3  # the source's keys once per sentence
            groups = torch.tensor([0, 2]) if step == 3 else torch.arange(prefixes.size(0) // beam)
            within = torch.randint(0, beam, (groups.numel(), beam), generator=gen)
            new_order = (groups[:, None] * beam + within).reshape(-1)
            if step == 5:
                new_order = new_order.roll(1)
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            sentence_of_row = sentence_of_row[new_order]
            next_tokens = torch.randint(4, len(dictionary), (new_order.numel(), 1), generator=gen)
            prefixes = torch.cat([prefixes[new_order], next_tokens], dim=1)


def test_cross_self_attention_weights_step_by_step_equal_the_full_forward():
    torch.manual_seed(2)
    dictionary = make_dictionary(40)
    model = build_vaswani(dictionary, **dict(TINY, cross_self_attention=True)).eval()
    src, src_lengths, _ = random_batch(dictionary, batch=2, src_len=6, seed=3)
    src[1, :2] = dictionary.pad()
    expand = torch.arange(2).repeat_interleave(2)
    tokens = torch.randint(4, len(dictionary), (4, 5))
    tokens[:, 0] = dictionary.eos()
    with torch.no_grad():
        _, full = model(src[expand], src_lengths[expand], tokens, need_attn=True)
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths), expand)
        state = {}
        for step in range(1, 6):
            _, extra = model.decoder(tokens[:, :step], encoder_out, incremental_state=state,
                                     need_attn=True)
            for layer in range(2):
                stepped = extra["layer_attn"][layer]["self_attn"][:, :, 0]  # [rows, h, S + step]
                whole = full["layer_attn"][layer]["self_attn"][:, :, step - 1, : 6 + step]
                torch.testing.assert_close(stepped, whole, atol=1e-5, rtol=1e-5)
    padded = full["layer_attn"][0]["self_attn"][2:, :, :, :2]
    assert padded.abs().max() == 0  # padded source positions get no weight


# -- the smaller options ----------------------------------------------------------------------


def test_quant_noise_acts_on_every_linear_weight_while_training_only():
    """Quant-Noise drops random blocks of every linear weight of the layers in each training
    forward, leaves the parameters as they are, replays under activation checkpointing, and
    changes nothing in evaluation."""
    dictionary = make_dictionary(40)
    options = dict(TINY, dropout=0.0)
    torch.manual_seed(0)
    plain = build_vaswani(dictionary, **options)
    noisy = build_vaswani(dictionary, **dict(options, quant_noise_pq=0.3,
                                             quant_noise_pq_block_size=8))
    noisy_ckpt = build_vaswani(dictionary, **dict(options, quant_noise_pq=0.3,
                                                  quant_noise_pq_block_size=8,
                                                  checkpoint_activations=True))
    noisy.load_state_dict(plain.state_dict())
    noisy_ckpt.load_state_dict(plain.state_dict())
    assert list(noisy.state_dict()) == list(plain.state_dict())
    for stack in (noisy.encoder, noisy.decoder):
        for layer in stack.layers:
            linears = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
            assert len(linears) in (6, 10) and all(m.quant_noise == (0.3, 8) for m in linears)
    src, src_lengths, prev = random_batch(dictionary)
    before = {name: t.clone() for name, t in noisy.state_dict().items()}
    with torch.no_grad():
        noisy.train()
        plain.train()
        first = noisy(src, src_lengths, prev)[0]
        assert not torch.allclose(first, noisy(src, src_lengths, prev)[0])
        assert not torch.allclose(first, plain(src, src_lengths, prev)[0])
        noisy.eval()
        plain.eval()
        torch.testing.assert_close(noisy(src, src_lengths, prev)[0],
                                   plain(src, src_lengths, prev)[0])
    for name, tensor in noisy.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    sample = training_sample(dictionary)
    loss, grads, _ = loss_and_gradients(noisy, sample, seed=5)
    loss_ckpt, grads_ckpt, _ = loss_and_gradients(noisy_ckpt, sample, seed=5)
    torch.testing.assert_close(loss_ckpt, loss, atol=1e-6, rtol=0)
    for name, grad in grads.items():
        difference = (grads_ckpt[name] - grad).abs().max().item()
        assert difference <= 1e-6 * max(1.0, grad.abs().max().item()), (name, difference)


def test_scalar_quant_noise_is_fairseqs_task_quantizing_the_model(monkeypatch):
    """``--quant-noise-scalar`` is applied by fairseq's task to any model (``quantize_model_
    scalar``); fairseq 0.12's quantizer calls ``.cuda()``, here made a no-op so that our model
    can be checked on a CPU: it trains and decodes quantized."""
    from fairseq import quantization_utils

    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    dictionary = make_dictionary(40)
    torch.manual_seed(0)
    model = build_vaswani(dictionary, **dict(TINY, quant_noise_scalar=0.5))
    quantization_utils.quantize_model_scalar(model, model.cfg)
    assert type(model.decoder.layers[0].ffn.fc1).__name__ == "IntLinear"
    assert type(model.encoder.embed_tokens).__name__ == "IntEmbedding"
    loss, grads, _ = loss_and_gradients(model, training_sample(dictionary), seed=1)
    assert torch.isfinite(loss) and grads["decoder.layers.0.ffn.fc1.weight"].abs().sum() > 0
    model.eval()
    src, src_lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        full, _ = model(src, src_lengths, prev)
        step, _ = model.decoder(prev[:, :1], model.encoder(src, src_lengths),
                                incremental_state={})
    torch.testing.assert_close(step[:, 0], full[:, 0], atol=1e-5, rtol=1e-5)


def test_adaptive_softmax_trains_with_our_criterion_and_with_fairseqs_adaptive_loss():
    """The label-smoothed loss steps aside from the fused path and reads every type's
    log-probability from the adaptive softmax: fairseq's values (its label-smoothed criterion,
    its decoding log-probabilities), and differentiable (fairseq's own are not, hence its
    adaptive_loss criterion, which trains our model too)."""
    from fairseq.criterions.adaptive_loss import AdaptiveLoss
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    from user_plugin.criterions.label_smoothed_cross_entropy import adaptive_log_probs

    torch.manual_seed(4)
    dictionary = make_dictionary(40)
    model = build_vaswani(dictionary, **dict(TINY, adaptive_softmax_cutoff=[15, 30],
                                             adaptive_softmax_dropout=0.1,
                                             share_all_embeddings=False)).eval()
    assert model.decoder.output_projection is None and _fusable_output_weight(model) is None
    sample = training_sample(dictionary, seed=2)
    task = SimpleNamespace(target_dictionary=dictionary)
    ours = LabelSmoothedCrossEntropy(task, sentence_avg=False, label_smoothing=0.1)
    theirs = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    with torch.no_grad():
        features, _ = model(**sample["net_input"])
        torch.testing.assert_close(
            adaptive_log_probs(model.decoder.adaptive_softmax, features),
            model.decoder.adaptive_softmax.get_log_prob(features, None).view(-1, 40),
            atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours(model, sample)[0], theirs(model, sample)[0],
                                   rtol=1e-5, atol=1e-4)
    model.train()
    for criterion in (ours, AdaptiveLoss(task, sentence_avg=False)):
        model.zero_grad()
        loss, _, _ = criterion(model, sample)
        loss.backward()
        tail = model.decoder.adaptive_softmax.tail[0][0].weight.grad
        assert torch.isfinite(loss) and tail is not None and tail.abs().sum() > 0


def test_decoder_output_dim_keeps_the_fused_loss_exact():
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    torch.manual_seed(5)
    dictionary = make_dictionary(40)
    model = build_vaswani(dictionary, **dict(TINY, decoder_output_dim=24,
                                             share_all_embeddings=False)).eval()
    assert model.decoder.project_out_dim.weight.shape == (24, 32)
    assert _fusable_output_weight(model) is model.decoder.output_projection.weight
    sample = training_sample(dictionary, seed=3)
    task = SimpleNamespace(target_dictionary=dictionary)
    ours = LabelSmoothedCrossEntropy(task, sentence_avg=False, label_smoothing=0.1)
    theirs = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    torch.testing.assert_close(ours(model, sample)[0], theirs(model, sample)[0],
                               rtol=1e-5, atol=1e-4)


def test_pretrained_embeddings_are_loaded_from_the_embed_paths(tmp_path):
    dictionary = make_dictionary(20)
    encoder_vectors, decoder_vectors = torch.randn(2, 32), torch.randn(1, 32)

    def write(path, words, vectors):
        lines = [f"{len(words)} 32"]
        lines += [" ".join([w, *map(str, v.tolist())]) for w, v in zip(words, vectors)]
        path.write_text("\n".join(lines) + "\n")

    write(tmp_path / "enc.vec", ["w3", "w7"], encoder_vectors)
    write(tmp_path / "dec.vec", ["w5"], decoder_vectors)
    torch.manual_seed(0)
    plain = build_vaswani(dictionary, **dict(TINY, share_all_embeddings=False))
    torch.manual_seed(0)
    model = build_vaswani(dictionary, **dict(TINY, share_all_embeddings=False,
                                             encoder_embed_path=str(tmp_path / "enc.vec"),
                                             decoder_embed_path=str(tmp_path / "dec.vec")))
    encoder, decoder = model.encoder.embed_tokens.weight, model.decoder.embed_tokens.weight
    torch.testing.assert_close(encoder[dictionary.index("w3")], encoder_vectors[0])
    torch.testing.assert_close(encoder[dictionary.index("w7")], encoder_vectors[1])
    torch.testing.assert_close(decoder[dictionary.index("w5")], decoder_vectors[0])
    other = dictionary.index("w4")
    torch.testing.assert_close(encoder[other], plain.encoder.embed_tokens.weight[other])

    write(tmp_path / "narrow.vec", ["w3"], torch.randn(1, 16)[:, :16])
    (tmp_path / "narrow.vec").write_text("1 16\nw3 " + " ".join(["0.5"] * 16) + "\n")
    with pytest.raises(ValueError, match="holds 16-dimensional vectors"):
        build_vaswani(dictionary, **dict(TINY, encoder_embed_path=str(tmp_path / "narrow.vec")))
    with pytest.raises(FileNotFoundError, match="--encoder-embed-path: no such file"):
        build_vaswani(dictionary, **dict(TINY, encoder_embed_path=str(tmp_path / "none.vec")))


def test_relu_dropout_is_the_activation_dropout_when_that_is_zero():
    dictionary = make_dictionary(20)
    model = build_vaswani(dictionary, **dict(TINY, relu_dropout=0.2))
    assert model.decoder.layers[0].ffn.activation_dropout == 0.2
    model = build_vaswani(dictionary, **dict(TINY, relu_dropout=0.2, activation_dropout=0.1))
    assert model.encoder.layers[0].ffn.activation_dropout == 0.1


def test_stack_options_build_the_modules_fairseq_names():
    dictionary = make_dictionary(20)
    model = build_vaswani(dictionary, **dict(
        TINY, layernorm_embedding=True, no_token_positional_embeddings=True,
        decoder_normalize_before=True, encoder_normalize_before=True, no_decoder_final_norm=True,
        no_cross_attention=True, export=True, min_params_to_wrap=0))
    names = set(model.state_dict())
    assert {"encoder.layernorm_embedding.weight", "decoder.layernorm_embedding.weight",
            "encoder.layer_norm.weight"} <= names
    assert "decoder.layer_norm.weight" not in names
    assert not any(".encoder_attn." in name or "embed_positions" in name for name in names)
    assert model.encoder.embed_positions is None and model.decoder.max_positions() == 1024
