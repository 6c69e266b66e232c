"""The benchmark compares like with like: same weights, same batches, same hypotheses.

Wall time is printed by the script, never asserted: this test runs it at toy sizes and
checks what makes its ratios meaningful.
"""

import json
import math
import sys

import forked_cli
import pytest
from conftest import MULTI30K, REPO, require_data


def test_benchmark_runs_both_models_on_the_same_work_and_reports_ratios(tmp_path):
    require_data(MULTI30K / "train.en")
    out = tmp_path / "bench.json"
    command = [
        sys.executable, "scripts/benchmark.py", "--model", "tiny", "--pairs", "300",
        "--vocab", "600", "--train-batches", "2", "--max-tokens", "400", "--dropout", "0",
        "--decode-sentences", "6", "--decode-batch", "3", "--max-len-b", "5", "--repeats", "1",
        "--sweep", "8", "--sweep-tokens", "32", "--sweep-steps", "1", "--decode-sweep", "3",
        "--decode-sweep-sentences", "2", "--work-dir", str(tmp_path / "work"),
        "--json-out", str(out),
    ]
    proc = forked_cli.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    # same weights and batches: without dropout the first training loss is the same
    ours = result["runs"]["train"]["ours"][0]
    builtin = result["runs"]["train"]["builtin"][0]
    assert ours["tokens"] == builtin["tokens"] > 0
    assert math.isclose(ours["first_loss"], builtin["first_loss"], rel_tol=1e-4)
    # same beam search: identical hypotheses, in the main run and in the length sweep
    assert result["identical_hypotheses"] is True
    assert [row["identical_hypotheses"] for row in result["decode_sweep"]] == [True]
    sweep_tokens = [r["ours"]["tokens"] for r in result["decode_sweep"]]
    assert sweep_tokens == [2 * (3 + 1)]  # two sentences, exactly 3 tokens + EOS each
    # the attention-free bound decodes the same number of tokens, and its speed-up is printed
    bound = result["decode_sweep"][0]["attention-free"]
    assert bound["tokens"] == sweep_tokens[0]
    assert "| speed-up bound |" in proc.stdout
    summary = result["summary"]["training target tokens/s"]
    assert math.isclose(summary["ratio"], summary["ours"] / summary["builtin"])
    assert "| training target tokens/s |" in proc.stdout
    # the CPU efficiency figure: model FLOP/s over the CPU's own matmul peak, measured in the run
    peaks = result["matmul_peak_tflops"]
    assert peaks["fp32"] > 0 and set(peaks) in ({"fp32"}, {"fp32", "bf16"})
    assert ("bf16" in peaks) == bool({"avx512_bf16", "amx_bf16"}
                                     & set(result["machine"]["cpu_flags"]))
    fraction = result["summary"]["fraction of the CPU's fp32 matmul peak"]
    for impl, run in (("ours", ours), ("builtin", builtin)):
        assert math.isclose(fraction[impl], run["tflops"] / peaks["fp32"], rel_tol=1e-9)
        assert 0 < fraction[impl] < 1
    assert "| fraction of the CPU's fp32 matmul peak |" in proc.stdout
    assert f"CPU: {result['machine']['cpu']}, flags " in proc.stdout
    assert "identical beam-search hypotheses: True" in proc.stdout
    # the built-in is stock fairseq: every one of its runs had neither the plugin nor a patch
    builtin_runs = [*result["runs"]["train"]["builtin"], *result["runs"]["decode"]["builtin"],
                    *(row["builtin"] for row in result["sweep"] + result["decode_sweep"])]
    assert [(r["plugin_loaded"], r["fairseq_patches"]) for r in builtin_runs] == [
        (False, [])] * len(builtin_runs)
    assert ours["plugin_loaded"] is True and ours["fairseq_patches"]
    assert "process without the plugin" in proc.stdout


def test_attention_free_bound_keeps_every_matrix_product_and_drops_the_attention_work():
    """The decoding bound is meaningful only if it does all of the real decoder's matrix
    products (so its time is a floor, not a different model) and none of the attention work."""
    import torch
    from conftest import TINY, build_vaswani, make_dictionary, random_batch
    from fairseq.sequence_generator import SequenceGenerator

    from user_plugin.modules.projections_only_attention import attention_free

    dictionary = make_dictionary(40)
    torch.manual_seed(0)
    real = build_vaswani(dictionary, "vaswani_base", **TINY).eval()
    bound = build_vaswani(dictionary, "vaswani_base", **TINY).eval()
    bound.load_state_dict(real.state_dict())
    attention_free(bound)
    assert bound.state_dict().keys() != real.state_dict().keys()  # wrapped, same tensors
    assert len(bound.state_dict()) == len(real.state_dict())

    def linear_shapes_per_step(model):
        calls = []

        def hook(module, inputs, output):
            calls.append((tuple(module.weight.shape), inputs[0].shape[0]))

        handles = [m.register_forward_hook(hook) for m in model.decoder.modules()
                   if isinstance(m, torch.nn.Linear)]
        src, src_lengths, _ = random_batch(dictionary, batch=2, src_len=5, tgt_len=2)
        generator = SequenceGenerator([model], dictionary, beam_size=3, max_len_a=0,
                                      max_len_b=4, min_len=4)
        with torch.no_grad():
            hypos = generator.generate([model], {"net_input": {"src_tokens": src,
                                                               "src_lengths": src_lengths}})
        for handle in handles:
            handle.remove()
        assert all(len(h[0]["tokens"]) == 5 for h in hypos)  # exactly 4 tokens + EOS
        return sorted(calls)

    real_calls = linear_shapes_per_step(real)
    bound_calls = linear_shapes_per_step(bound)
    # every projection of the real decoder, on as many rows, except the encoder-decoder
    # keys and values, which the real decoder computes once per sentence on the first step
    encoder_kv = [c for c in real_calls if c[1] == 2]
    assert len(encoder_kv) == 2 * TINY["decoder_layers"]
    assert sorted(c for c in real_calls if c[1] != 2) == bound_calls

    state = {}
    src, src_lengths, _ = random_batch(dictionary, batch=2, src_len=5, tgt_len=2)
    with torch.no_grad():
        encoder_out = bound.encoder(src, src_lengths)
        prefix = torch.full((2, 1), dictionary.eos())
        bound.decoder(prefix, encoder_out, incremental_state=state)
    assert not any("attn_cache" in key for key in state)  # no keys or values kept
    with pytest.raises(ValueError, match="step by step"):
        bound.decoder(prefix, encoder_out)  # a full forward has no meaning for the bound
