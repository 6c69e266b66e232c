#!/usr/bin/env python
"""Time one optimizer update of a Transformer's parameters: fairseq's ``adam`` against the
plugin's ``vaswani_adam`` (``foreach`` and ``fused``), as ``fairseq-train`` runs it in float32
and under the plugin's ``--bf16 --amp`` (float32 weights): the gradient norm, then the Adam
step. (The plugin's ``--fp16`` and ``--bf16`` update one flat float32 tensor: one tensor here.)

The parameters are those of our model at the chosen size (``vaswani_base`` by default, with a
joined vocabulary of ``--vocab`` types), each with a random gradient. For each optimizer the
script reports the median milliseconds per update over ``--steps`` updates (after two not
counted), the number of operator calls one update makes from Python (torch.profiler's top-level
calls; on a GPU each is at least one kernel launch, which is what bounds a small-batch step
there), and the ratio to
fairseq's adam, from one run. The three optimizers' weights are compared after the last update.

Example (about a minute on 2 CPU cores)::

    python scripts/benchmark_optimizer.py --model base --steps 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from user_plugin import paper  # noqa: E402
from user_plugin.files import UserError, run_main  # noqa: E402

# layers per stack, d_model, d_ff, heads: the paper's Table 3 sizes
SIZES = {"small": (3, 256, 1024, 4), "base": (6, 512, 2048, 8), "big": (6, 1024, 4096, 16)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmark_optimizer.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SIZES), default="base")
    parser.add_argument("--vocab", type=int, default=8000, help="joined vocabulary size")
    parser.add_argument("--steps", type=int, default=10, help="updates timed per optimizer")
    parser.add_argument("--threads", type=int, default=1)
    return parser


def model_parameters(size: str, vocab: int) -> List[torch.Tensor]:
    """The parameter tensors of our model at ``size`` (shared embeddings), as fresh copies."""
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from user_plugin.registration import register

    register()
    from user_plugin.models.transformer_config import VaswaniTransformerConfig
    from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

    layers, dim, ffn, heads = SIZES[size]
    dictionary = Dictionary()
    for index in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{index}")
    namespace = argparse.Namespace(
        encoder_layers=layers, decoder_layers=layers, encoder_embed_dim=dim,
        decoder_embed_dim=dim, encoder_ffn_embed_dim=ffn, decoder_ffn_embed_dim=ffn,
        encoder_attention_heads=heads, decoder_attention_heads=heads, share_all_embeddings=True)
    ARCH_CONFIG_REGISTRY["vaswani_base"](namespace)
    cfg = VaswaniTransformerConfig.from_namespace(namespace)
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = VaswaniTransformerModel.build_model(cfg, task)
    return [p.detach().clone() for p in model.parameters()]


def build(name: str, weights: Sequence[torch.Tensor]):
    from fairseq.optim.adam import FairseqAdam

    from user_plugin.optimizers.multi_tensor_adam import MultiTensorAdam

    cfg = SimpleNamespace(lr=[7e-4], adam_betas=paper.adam_betas_option(),
                          adam_eps=paper.ADAM_EPS, weight_decay=0.0,
                          use_old_adam=False, fp16_adam_stats=False, tpu=False,
                          adam_implementation=name.split("/")[-1])
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    optimizer = (FairseqAdam if name == "adam" else MultiTensorAdam)(cfg, params)
    return optimizer, params


def update(optimizer) -> None:
    optimizer.clip_grad_norm(0.0)  # fairseq-train computes the norm at every update
    optimizer.step()


def measure(name: str, weights, grads, steps: int) -> Dict[str, object]:
    optimizer, params = build(name, weights)
    for param, grad in zip(params, grads):
        param.grad = grad.clone()
    for _ in range(2):
        update(optimizer)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        update(optimizer)
        times.append(time.perf_counter() - start)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        update(optimizer)
    calls = sum(1 for event in profile.events() if event.name.startswith("aten::") and (
        event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::")))
    return {"ms": 1000 * statistics.median(times), "operator_calls": calls, "params": params}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.vocab < 8 or args.threads < 1:
        raise UserError("--steps and --threads must be >= 1, --vocab >= 8")
    torch.set_num_threads(args.threads)
    weights = model_parameters(args.model, args.vocab)
    generator = torch.Generator().manual_seed(1)
    grads = [torch.randn(w.shape, generator=generator) * 1e-3 for w in weights]
    count = sum(w.numel() for w in weights)
    print(f"{args.model}: {len(weights)} parameter tensors, {count:,} values; "
          f"{args.steps} updates each, {args.threads} thread(s)")
    results = {name: measure(name, weights, grads, args.steps)
               for name in ("adam", "vaswani_adam/foreach", "vaswani_adam/fused")}
    base = results["adam"]
    print("| optimizer | ms per update | operator calls per update | speed-up over adam |")
    print("| --- | --- | --- | --- |")
    for name, figures in results.items():
        print(f"| {name} | {figures['ms']:.1f} | {figures['operator_calls']} | "
              f"{base['ms'] / figures['ms']:.2f} |")
    difference = max(float((a - b).detach().abs().max()) for name in results if name != "adam"
                     for a, b in zip(results[name]["params"], base["params"]))
    print(f"largest weight difference from fairseq's adam after {args.steps + 3} updates: "
          f"{difference:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, "benchmark_optimizer.py"))
