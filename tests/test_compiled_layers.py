"""``--compile-layers``: each layer of a training forward pass through ``torch.compile``
(``user_plugin/models/stack.py``). On a CPU inductor generates C++ and needs a compiler; the
test is skipped, with the reason, where there is none.

* the compiled model computes the same loss and gradients as the eager one (dropout 0: compiled
  dropout draws other masks), over two batches of different shapes, without compiling a layer
  type more than twice (the first shape, then once with dynamic shapes);
* decoding and the evaluation forward pass stay eager; the state dict is the eager model's;
* with dropout, a compiled training step runs (the graph draws its own masks).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import TINY, build_vaswani, fake_task, make_dictionary
from test_host_syncs import translation_sample

from user_plugin.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropy

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="torch.compile's inductor needs a C++ compiler on a CPU (none on PATH)")


def loss_and_gradients(model, criterion, sample):
    model.zero_grad(set_to_none=True)
    loss, _, _ = criterion(model, sample)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


def test_compiled_layers_give_the_eager_loss_and_gradients():
    import torch._dynamo

    torch._dynamo.reset()
    dictionary = make_dictionary(60)
    options = dict(TINY, encoder_layers=2, decoder_layers=2, dropout=0.0)
    torch.manual_seed(0)
    eager = build_vaswani(dictionary, "vaswani_base", **options).train()
    compiled = build_vaswani(dictionary, "vaswani_base", compile_layers=True, **options).train()
    compiled.load_state_dict(eager.state_dict())
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    criterion = LabelSmoothedCrossEntropy(fake_task(dictionary), False, 0.1)
    counters = torch._dynamo.utils.counters
    counters.clear()
    for seed, batch in ((0, 4), (1, 6)):  # two shapes
        sample = translation_sample(dictionary, batch=batch, seed=seed)
        eager_loss, eager_grads = loss_and_gradients(eager, criterion, sample)
        compiled_loss, compiled_grads = loss_and_gradients(compiled, criterion, sample)
        torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-5, rtol=1e-5)
        assert compiled_grads.keys() == eager_grads.keys()
        for name, grad in eager_grads.items():
            torch.testing.assert_close(compiled_grads[name], grad, atol=1e-5, rtol=1e-4,
                                       msg=name)
    assert len(compiled.encoder._compiled_layers) == 2 == len(compiled.decoder._compiled_layers)
    # one graph per layer type: the layers of a stack share it, the second shape reuses it
    assert counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])
    assert compiled.state_dict().keys() == eager.state_dict().keys()


def test_decoding_and_evaluation_stay_eager():
    dictionary = make_dictionary(60)
    model = build_vaswani(dictionary, "vaswani_base", compile_layers=True, **TINY).eval()
    sample = translation_sample(dictionary)
    with torch.no_grad():
        model(**sample["net_input"])
    assert model.encoder._compiled_layers == [] == model.decoder._compiled_layers


def test_compiled_layers_train_with_dropout():
    """With dropout the compiled layers use the compiled graph's own random numbers (the eager
    CPU masks of modules/dropout.py are not traced): a training step runs, two seeds give two
    losses, and the gradients are finite."""
    import torch._dynamo

    torch._dynamo.reset()
    dictionary = make_dictionary(60)
    options = dict(TINY, encoder_layers=2, decoder_layers=2, dropout=0.3)
    torch.manual_seed(0)
    compiled = build_vaswani(dictionary, "vaswani_base", compile_layers=True, **options).train()
    criterion = LabelSmoothedCrossEntropy(fake_task(dictionary), False, 0.1)
    sample = translation_sample(dictionary, batch=4, seed=0)
    losses = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        loss, grads = loss_and_gradients(compiled, criterion, sample)
        assert all(torch.isfinite(g).all() for g in grads.values())
        losses.append(loss.item())
    assert losses[0] != losses[1]
    assert len(compiled.encoder._compiled_layers) == 2
