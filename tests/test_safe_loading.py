"""Checkpoints load under torch's ``weights_only`` safe loading in fairseq's entry points,
because the plugin allow-lists exactly fairseq's checkpoint types — safe loading stays on."""

import sys
from fractions import Fraction

import forked_cli
import numpy
import pytest
import torch
from cli import USER_DIR, hypotheses, run_fairseq


@pytest.fixture(scope="module")
def checkpoint_with_numpy_meters(trained_multi30k, tmp_path_factory):
    """checkpoint_last.pt plus the numpy values that --eval-bleu validation stores."""
    state = torch.load(trained_multi30k.checkpoint_dir / "checkpoint_last.pt",
                       map_location="cpu", weights_only=True)
    state["extra_state"]["eval_bleu_counts"] = numpy.arange(4, dtype=numpy.int64)
    state["extra_state"]["best_bleu"] = numpy.float64(12.5)
    path = tmp_path_factory.mktemp("safe") / "checkpoint_numpy.pt"
    torch.save(state, path)
    return path


def test_plain_torch_refuses_it_without_the_plugin(checkpoint_with_numpy_meters):
    code = f"import torch; torch.load(r'{checkpoint_with_numpy_meters}', weights_only=True)"
    proc = forked_cli.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and "Unsupported global" in proc.stderr


def test_fairseq_generate_loads_it_with_the_plugin(trained_multi30k, checkpoint_with_numpy_meters):
    proc = run_fairseq("generate", [
        trained_multi30k.data_bin, "--user-dir", USER_DIR, "--path", checkpoint_with_numpy_meters,
        "--gen-subset", "valid", "--max-sentences", "50", "--beam", "2",
        "--required-batch-size-multiple", "1", "--cpu",
    ])
    assert len(hypotheses(proc.stdout)) == 200


def test_safe_loading_is_still_on_for_other_types(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"x": Fraction(1, 3)}, path)
    with pytest.raises(Exception, match="Unsupported global"):
        torch.load(path, weights_only=True)
