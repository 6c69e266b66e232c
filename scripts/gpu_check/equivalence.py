#!/usr/bin/env python
"""Same weights, same function, on one device and in one precision: our model against fairseq's
built-in ``transformer``, and our criterion against fairseq's ``label_smoothed_cross_entropy``.

For each precision (fp32; fp16 and bf16 as weights cast to that type, as fairseq's ``--fp16``
does; bf16 also as autocast over float32 weights, as the plugin's ``--bf16 --amp`` trains) it
measures:

* the training forward: max |log p_ours - log p_fairseq| over the real target positions;
* incremental decoding, step by step: the same, over every step;
* beam search (beam 4, fairseq's ``SequenceGenerator`` for both): the share of hypotheses
  identical token for token, and the max score difference among identical ones;
* the criterion (our fused projection + loss path against fairseq's criterion on full logits):
  |loss| and |nll| differences relative to the loss, and the largest parameter-gradient
  difference relative to that parameter's largest gradient (floored at 1e-3 of the model's).

It also runs the float32-master optimizer of the plugin's ``--fp16`` / ``--bf16`` step by step
on the device (``user_plugin/optimizers/master_weights_equivalence.py``, the functions the CPU
tests run): against fairseq's ``FP16Optimizer`` in float16 (the same overflows, loss scales and
weights, to the last bit with fairseq's ``adam`` inside) and in bfloat16, and bfloat16 weights
with float32 masters against float32 training of a small Transformer (within
``BF16_TOLERANCES``).

Each figure is compared with the tolerance stated in :data:`TOLERANCES`; the script prints one
JSON object (figures, tolerances, pass/fail) and exits 0 whether or not a check failed, so that
the caller reports every figure. Run by ``scripts/gpu_check/run_check.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from user_plugin.paper import LABEL_SMOOTHING  # noqa: E402
from user_plugin.registration import register  # noqa: E402

register()  # the model, safe loading
from user_plugin.artifacts.builtin_transformer import (  # noqa: E402
    OurPositionsForFairseq,
    build_fairseq_transformer,
    copy_fairseq_weights_into_ours,
)

#: Tolerances per precision: log-probabilities (absolute), criterion loss and gradients
#: (relative). fp32 on a GPU differs from the CPU by reduction order only; float16 keeps 11
#: significant bits and bfloat16 8, so two implementations that round in other places differ
#: by a few units of the last place of each layer's output, compounded over the layers.
TOLERANCES = {
    "fp32": {"logprob": 1e-4, "loss": 1e-5, "grad": 1e-3, "beam_identical": 1.0},
    "fp16": {"logprob": 3e-2, "loss": 2e-3, "grad": 5e-2, "beam_identical": 0.75},
    "bf16": {"logprob": 2e-1, "loss": 2e-2, "grad": 2e-1, "beam_identical": 0.5},
    "bf16_autocast": {"logprob": 2e-1, "loss": 2e-2, "grad": 2e-1, "beam_identical": 0.5},
}
SIZES = {  # layers, d_model, d_ff, heads, vocabulary, batch, source length, target length
    "tiny": (2, 32, 64, 4, 60, 4, 9, 7),
    "small": (3, 256, 1024, 4, 1000, 16, 40, 36),
}


def dictionary_of(size: int):
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i in range(size - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def build_pair(dictionary, layers: int, dim: int, ffn: int, heads: int, seed: int):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from user_plugin.models.transformer_config import VaswaniTransformerConfig
    from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

    torch.manual_seed(seed)
    options = dict(encoder_layers=layers, decoder_layers=layers, encoder_embed_dim=dim,
                   decoder_embed_dim=dim, encoder_ffn_embed_dim=ffn, decoder_ffn_embed_dim=ffn,
                   encoder_attention_heads=heads, decoder_attention_heads=heads, dropout=0.0,
                   share_all_embeddings=True)
    args = argparse.Namespace(**options)
    ARCH_CONFIG_REGISTRY["vaswani_base"](args)
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    ours = VaswaniTransformerModel.build_model(VaswaniTransformerConfig.from_namespace(args), task)
    theirs = build_fairseq_transformer(ours, task, ours.cfg)
    copy_fairseq_weights_into_ours(theirs, ours)
    pad = dictionary.pad()
    theirs.encoder.embed_positions = OurPositionsForFairseq(ours.encoder.embed_positions, pad)
    theirs.decoder.embed_positions = OurPositionsForFairseq(ours.decoder.embed_positions, pad)
    return ours.eval(), theirs.eval()


def random_batch(dictionary, batch: int, src_len: int, tgt_len: int, seed: int):
    """Left-padded sources, right-padded targets, as fairseq batches them."""
    gen = torch.Generator().manual_seed(seed)
    pad, eos, first = dictionary.pad(), dictionary.eos(), dictionary.nspecial
    src = torch.full((batch, src_len), pad, dtype=torch.long)
    prev = torch.full((batch, tgt_len), pad, dtype=torch.long)
    target = torch.full((batch, tgt_len), pad, dtype=torch.long)
    src_lengths = torch.randint(2, src_len + 1, (batch,), generator=gen)
    src_lengths[0] = src_len
    for i in range(batch):
        n = int(src_lengths[i])
        src[i, src_len - n:] = torch.randint(first, len(dictionary), (n,), generator=gen)
        src[i, -1] = eos
        m = int(torch.randint(2, tgt_len + 1, (1,), generator=gen)) if i else tgt_len
        words = torch.randint(first, len(dictionary), (m - 1,), generator=gen)
        prev[i, 0] = eos
        prev[i, 1:m] = words
        target[i, : m - 1] = words
        target[i, m - 1] = eos
    return src, src_lengths, prev, target


def cast(model, precision: str, device: str):
    model = model.to(device)
    if precision == "fp16":
        return model.half()
    if precision == "bf16":
        return model.to(torch.bfloat16)
    return model


def autocast_for(precision: str, device: str):
    enabled = precision == "bf16_autocast"
    return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=enabled)


def log_probs(model, output) -> torch.Tensor:
    return model.get_normalized_probs(output, log_probs=True).float()


def forward_difference(ours, theirs, batch, autocast) -> float:
    src, src_lengths, prev, _ = batch
    with torch.no_grad(), autocast:
        a = log_probs(ours, ours(src, src_lengths, prev))
        b = log_probs(theirs, theirs(src, src_lengths, prev))
    real = prev.ne(ours.decoder.padding_idx)
    return float((a[real] - b[real]).abs().max())


def incremental_difference(ours, theirs, batch, autocast) -> float:
    src, src_lengths, prev, _ = batch
    worst = 0.0
    with torch.no_grad(), autocast:
        enc_a, enc_b = ours.encoder(src, src_lengths), theirs.encoder(src, src_lengths)
        state_a: Dict = {}
        state_b: Dict = {}
        tokens = prev.clone()
        tokens[tokens.eq(ours.decoder.padding_idx)] = ours.decoder.padding_idx + 3
        for step in range(1, tokens.size(1) + 1):
            a = log_probs(ours, ours.decoder(tokens[:, :step], enc_a, incremental_state=state_a))
            b = log_probs(theirs, theirs.decoder(tokens[:, :step], enc_b,
                                                 incremental_state=state_b))
            worst = max(worst, float((a - b).abs().max()))
    return worst


def beam_agreement(ours, theirs, dictionary, batch, autocast) -> Dict[str, float]:
    from fairseq.sequence_generator import SequenceGenerator

    src, src_lengths, _, _ = batch
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    results = []
    for model in (ours, theirs):
        generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_b=20)
        with torch.no_grad(), autocast:
            results.append(generator.generate([model], sample))
    same = total = 0
    worst = 0.0
    for ours_hyps, their_hyps in zip(*results):
        for a, b in zip(ours_hyps, their_hyps):
            total += 1
            if a["tokens"].tolist() == b["tokens"].tolist():
                same += 1
                worst = max(worst, abs(float(a["score"]) - float(b["score"])))
    return {"beam_identical": same / max(total, 1), "beam_score_diff": worst,
            "beam_hypotheses": total}


def criterion_differences(ours, theirs_unused, dictionary, batch, autocast) -> Dict[str, float]:
    """Our criterion (fused projection path) against fairseq's, on our model's parameters."""
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    from user_plugin.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropy

    src, src_lengths, prev, target = batch
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths,
                            "prev_output_tokens": prev},
              "target": target, "ntokens": int(target.ne(dictionary.pad()).sum())}
    task = SimpleNamespace(target_dictionary=dictionary)
    figures = []
    smoothing = LABEL_SMOOTHING
    for criterion in (LabelSmoothedCrossEntropy(task, sentence_avg=False,
                                                label_smoothing=smoothing),
                      LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False,
                                                         label_smoothing=smoothing)):
        ours.zero_grad()
        with autocast:
            loss, _, log = criterion(ours, sample)
        loss.float().backward()
        grads = {n: p.grad.detach().float().clone() for n, p in ours.named_parameters()
                 if p.grad is not None}
        figures.append((float(loss.detach()), float(log["nll_loss"]), grads))
    (loss_a, nll_a, grads_a), (loss_b, nll_b, grads_b) = figures
    # relative to the parameter's largest gradient, floored at 1e-3 of the model's largest: a
    # gradient that is zero analytically (the key projection's bias: softmax ignores a shift
    # shared by all keys) is rounding noise on both sides
    floor = 1e-3 * max(float(g.abs().max()) for g in grads_b.values())
    worst, worst_name = 0.0, ""
    for name, grad in grads_a.items():
        scale = max(float(grads_b[name].abs().max()), floor)
        difference = float((grad - grads_b[name]).abs().max()) / scale
        if difference > worst:
            worst, worst_name = difference, name
    return {"loss": abs(loss_a - loss_b) / abs(loss_b), "nll": abs(nll_a - nll_b) / abs(nll_b),
            "grad": worst, "grad_worst_parameter": worst_name, "loss_value": loss_b}


def run(device: str, size: str, precisions: List[str]) -> Dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    layers, dim, ffn, heads, vocab, batch_size, src_len, tgt_len = SIZES[size]
    dictionary = dictionary_of(vocab)
    report: Dict = {"device": device, "size": size, "tolerances": TOLERANCES, "results": {}}
    for precision in precisions:
        start = time.time()
        ours, theirs = build_pair(dictionary, layers, dim, ffn, heads, seed=7)
        weights = "fp32" if precision == "bf16_autocast" else precision
        ours, theirs = cast(ours, weights, device), cast(theirs, weights, device)
        batch = tuple(t.to(device) for t in random_batch(dictionary, batch_size, src_len,
                                                           tgt_len, seed=3))
        figures: Dict = {
            "forward_logprob": forward_difference(ours, theirs, batch, autocast_for(precision,
                                                                                    device)),
            "incremental_logprob": incremental_difference(ours, theirs, batch,
                                                          autocast_for(precision, device)),
        }
        figures.update(beam_agreement(ours, theirs, dictionary, batch,
                                      autocast_for(precision, device)))
        crit = criterion_differences(ours, theirs, dictionary, batch,
                                     autocast_for(precision, device))
        figures.update({"criterion_loss": crit["loss"], "criterion_nll": crit["nll"],
                        "criterion_grad": crit["grad"], "loss_value": crit["loss_value"],
                        "criterion_grad_worst": crit["grad_worst_parameter"]})
        tol = TOLERANCES[precision]
        figures["passed"] = {
            "forward": figures["forward_logprob"] <= tol["logprob"],
            "incremental": figures["incremental_logprob"] <= tol["logprob"],
            "beam": figures["beam_identical"] >= tol["beam_identical"],
            "criterion": max(crit["loss"], crit["nll"]) <= tol["loss"]
            and crit["grad"] <= tol["grad"],
        }
        figures["seconds"] = round(time.time() - start, 2)
        report["results"][precision] = figures
    report["master_weights"] = master_weights(device)
    report["passed"] = all(all(r["passed"].values()) for r in report["results"].values()) \
        and report["master_weights"]["passed"]
    return report


def master_weights(device: str) -> Dict:
    """The float32-master optimizer against fairseq's and against float32 training."""
    from user_plugin.optimizers import master_weights_equivalence as equivalence

    start = time.time()
    fp16 = equivalence.fp16_against_fairseq(device, optimizer="adam")
    fp16_fused = equivalence.fp16_against_fairseq(device, optimizer="vaswani_adam")
    bf16 = equivalence.bf16_against_fairseq(device, optimizer="adam")
    bf16_fp32 = equivalence.bf16_against_float32(device)
    bf16_fp32.pop("losses")
    passed = {
        "fp16_same_as_fairseq": fp16["same_overflows"] and fp16["same_loss_scales"]
        and fp16["overflows"] > 0 and fp16["max_weight_difference"] == 0.0,
        "fp16_fused_adam_within_one_rounding": fp16_fused["same_overflows"]
        and fp16_fused["max_weight_difference"] <= 4 * 2**-10,
        "bf16_same_as_fairseq": bf16["max_weight_difference"] == 0.0,
        "bf16_within_float32_tolerances": bf16_fp32["passed"],
    }
    return {"fp16_against_fairseq": fp16, "fp16_vaswani_adam_against_fairseq": fp16_fused,
            "bf16_against_fairseq": bf16, "bf16_against_float32": bf16_fp32,
            "checks": passed, "passed": all(passed.values()),
            "seconds": round(time.time() - start, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--precisions", default="fp32,fp16,bf16,bf16_autocast")
    args = parser.parse_args()
    precisions = [p for p in args.precisions.split(",") if p]
    unknown = sorted(set(precisions) - set(TOLERANCES))
    if unknown:
        print(f"equivalence.py: error: unknown precision(s) {unknown}", file=sys.stderr)
        return 2
    print(json.dumps(run(args.device, args.size, precisions)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
