#!/usr/bin/env python
"""Benchmark ``vaswani_transformer`` against fairseq's built-in ``transformer``.

Both models get the same hyperparameters and the same weights (fairseq's initial weights are
copied into ours), the same real batches (Moses-tokenized Multi30k EN-DE, a word-level joined
dictionary built on the fly, batches sorted by length up to ``--max-tokens``), the same optimizer
(Adam, betas (0.9, 0.98), eps 1e-9, paper §5.3) and label smoothing 0.1 (§5.4): ours through our
``vaswani_label_smoothed_cross_entropy``, the built-in through fairseq's
``label_smoothed_cross_entropy``. Measured, each run in a fresh subprocess per model, alternating
which model goes first on every repeat:

* training: target tokens/s of forward + backward + optimizer step, and peak memory;
* decoding: beam search (beam 4, output limit = padded source width + 50, §6.1) through fairseq's
  plain ``SequenceGenerator`` for both models, sentences/s and generated tokens/s;
* a sweep over sentence length (training step time and memory at a fixed token budget);
* a sweep over output length (beam search made to produce exactly L tokens), with an
  attention-free bound: our model with every decoder attention reduced to its matrix products
  (``user_plugin/modules/projections_only_attention.py``), whose time is a floor for any
  implementation of the same model in the same generator, so built-in / bound is the largest
  reachable speed-up.

The built-in runs as stock fairseq: its processes never import the plugin's registration, so
none of the plugin's fairseq patches is active there (each run checks this and records it as
``plugin_loaded`` and ``fairseq_patches``). Ours runs as ``--user-dir`` loads it, patches and
all. The built-in model is given our positional encoding (§3.5, interleaved sine/cosine; fairseq's
concatenates the sines and cosines), so that both models compute the same function: the same
first training loss without dropout, and the same hypotheses, which the benchmark checks.

Peak memory: on CPU the peak resident set size of the subprocess (``getrusage`` maxrss) and its
growth over the resident size before the measured work; on a GPU
``torch.cuda.max_memory_allocated``.
``--dtype bf16`` trains as ``fairseq-train --bf16 --amp`` does with the plugin
(:mod:`user_plugin.fairseq_patches.precision`): float32 weights and Adam state, the criterion's
forward pass (model and loss) under bfloat16 autocast; it decodes under the same autocast. It runs
on a CPU too. ``--dtype fp16`` (CUDA only) uses ``torch.autocast(float16)`` with a ``GradScaler``,
which is not fairseq's ``--fp16`` (float16 weights). Training's model FLOPs per second
(``user_plugin/measurement/flops.py`` on the padded batches) are reported for both models; on a CPU
the benchmark also measures, in the same run, the CPU's matrix-multiply peak with this torch build
and ``--threads`` (fp32, and bf16 where the CPU has bf16 instructions;
``user_plugin/measurement/cpu.py``) and reports training's fraction of it, with the CPU's name and
flags. ``--device cuda`` reports model FLOPs utilisation (MFU) against the GPU's tensor-core peak.
The GPU figures that users would compare come from ``scripts/gpu_check/run_check.py`` (``fairseq-
train`` itself); this script's CUDA path has not been run on a GPU.

Example (the default small model, a few minutes on 2 CPU cores)::

    python scripts/benchmark.py --json-out bench.json
    python scripts/benchmark.py --model base --repeats 5        # the paper's base sizes
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import logging
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence

import torch

# ``import user_plugin`` from any directory; logging set up before fairseq is imported (see
# user_plugin.files).
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin import paper  # noqa: E402
from user_plugin.files import UserError, atomic_write_text, run_main  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "multi30k-en-de"
IMPLS = ("ours", "builtin")
BOUND = "attention-free"  # decoding sweep only: see ProjectionsOnlyAttention

# layers (each stack), d_model, d_ff, heads. "base" and "big" are the paper's Table 3 sizes.
MODEL_SIZES = {
    "tiny": (2, 64, 256, 4),
    "small": (3, 256, 1024, 4),
    "base": (6, 512, 2048, 8),
    "big": (6, 1024, 4096, 16),
}
STOCK_NOTE = ("built-in: fairseq's transformer and label_smoothed_cross_entropy, each run in a "
              "process without the plugin (not registered, no fairseq patch active; checked)")
# dense bf16/fp16 tensor-core peak (TFLOP/s) by GPU name, for MFU; override with --peak-tflops
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


# --------------------------------------------------------------------------------------------
# command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="benchmark.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="folder with train.{en,de} and test_2016_flickr.{en,de} (raw text)")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--train-prefix", default="train")
    parser.add_argument("--test-prefix", default="test_2016_flickr")
    parser.add_argument("--pairs", type=int, default=2000, help="training pairs read")
    parser.add_argument("--vocab", type=int, default=8000, help="joined word-level vocabulary")
    parser.add_argument("--model", choices=sorted(MODEL_SIZES), default="small")
    parser.add_argument("--dropout", type=float, default=paper.DROPOUT)
    parser.add_argument("--max-tokens", type=int, default=2000,
                        help="tokens per training batch (max length x sentences)")
    parser.add_argument("--train-batches", type=int, default=8,
                        help="batches timed per run, spread over the length-sorted data")
    parser.add_argument("--decode-sentences", type=int, default=64)
    parser.add_argument("--decode-batch", type=int, default=32, help="sentences per batch")
    parser.add_argument("--beam", type=int, default=paper.BEAM)
    parser.add_argument("--max-len-b", type=int, default=paper.MAX_LEN_OVER_SOURCE)
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per model (alternating which goes first)")
    parser.add_argument("--sweep", default="32,64,128,256,512,1024",
                        help="sentence lengths for the length sweep ('' to skip)")
    parser.add_argument("--sweep-tokens", type=int, default=2048,
                        help="tokens per sweep batch (sentences = tokens / length, at least 1)")
    parser.add_argument("--sweep-steps", type=int, default=3)
    parser.add_argument("--decode-sweep", default="16,32,64,128,256",
                        help="output lengths for the decoding sweep: every hypothesis is made "
                             "exactly this long (min = max length) ('' to skip)")
    parser.add_argument("--decode-sweep-sentences", type=int, default=32,
                        help="sentences (each x beam) per decoding-sweep batch (the default is "
                             "--decode-batch's, so the sweep and its bound speak for the main "
                             "decoding run)")
    parser.add_argument("--no-decode-bound", action="store_true",
                        help="skip the decoding sweep's attention-free bound (our model with "
                             "every decoder attention reduced to its projections)")
    parser.add_argument("--skip", default="",
                        help="comma list of train,decode,sweep,decode-sweep to skip")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="accelerator peak for MFU (default: by GPU name)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per run (1 is steadier on a shared machine)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where the prepared data and weights go (default: a temp dir)")
    parser.add_argument("--json-out", type=Path, default=None)
    return parser


# --------------------------------------------------------------------------------------------
# data


def read_pairs(data: Path, prefix: str, src: str, tgt: str, limit: int) -> List[tuple]:
    """Moses-tokenized (source, target) lines, the first ``limit`` pairs."""
    from sacremoses import MosesTokenizer

    paths = [data / f"{prefix}.{lang}" for lang in (src, tgt)]
    for path in paths:
        if not path.is_file():
            raise UserError(f"{path}: no such file (see --data, --*-prefix, --*-lang)")
    tokenizers = [MosesTokenizer(lang=src), MosesTokenizer(lang=tgt)]
    columns = []
    for path, tok in zip(paths, tokenizers):
        with open(path, encoding="utf-8") as handle:
            lines = [next(handle, "") for _ in range(limit)]
        columns.append([tok.tokenize(x.strip(), escape=False, return_str=True) for x in lines])
    pairs = [(s, t) for s, t in zip(*columns) if s and t]
    if not pairs:
        raise UserError(f"{paths[0]}: no sentence pairs read")
    return pairs


def prepare(args, work: Path) -> None:
    """Tokenize, build the joined dictionary, encode, build both models' identical weights."""
    from fairseq.data import Dictionary

    train = read_pairs(args.data, args.train_prefix, args.src_lang, args.tgt_lang, args.pairs)
    test = read_pairs(args.data, args.test_prefix, args.src_lang, args.tgt_lang,
                      args.decode_sentences)
    dictionary = Dictionary()
    for src, tgt in train:
        for line in (src, tgt):
            for word in line.split():
                dictionary.add_symbol(word)
    dictionary.finalize(threshold=1, nwords=args.vocab, padding_factor=8)
    dictionary.save(str(work / "dict.txt"))

    def encode(pairs):
        return [
            [dictionary.encode_line(x, add_if_not_exist=False, append_eos=True).long() for x in p]
            for p in pairs
        ]

    torch.save({"train": encode(train), "test": encode(test)}, work / "data.pt")
    ours, builtin = build_models(args, dictionary, work, fresh=True)
    torch.save(ours.state_dict(), work / "ours.pt")
    torch.save(builtin.state_dict(), work / "builtin.pt")


def max_positions(args) -> int:
    lengths = sweep_lengths(args)
    return max([1024, *[n + 2 for n in lengths]])


def comma_integers(text: str, option: str) -> List[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{option} {text!r}: expected comma-separated integers") from None


def decode_sweep_lengths(args) -> List[int]:
    return comma_integers(args.decode_sweep, "--decode-sweep")


def sweep_lengths(args) -> List[int]:
    return comma_integers(args.sweep, "--sweep")


def model_cfg(args):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from user_plugin.models.transformer_config import VaswaniTransformerConfig

    layers, dim, ffn, heads = MODEL_SIZES[args.model]
    namespace = argparse.Namespace(
        encoder_layers=layers, decoder_layers=layers, encoder_embed_dim=dim,
        decoder_embed_dim=dim, encoder_ffn_embed_dim=ffn, decoder_ffn_embed_dim=ffn,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        dropout=args.dropout, share_all_embeddings=True,
        max_source_positions=max_positions(args), max_target_positions=max_positions(args),
    )
    ARCH_CONFIG_REGISTRY["vaswani_base"](namespace)
    return VaswaniTransformerConfig.from_namespace(namespace)


def build_models(args, dictionary, work: Path, fresh: bool):
    """Our model and fairseq's with the same hyperparameters; weights copied fairseq -> ours."""
    from user_plugin.artifacts.builtin_transformer import (
        build_fairseq_transformer,
        copy_fairseq_weights_into_ours,
    )
    from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(args.seed)
    cfg = model_cfg(args)
    ours = VaswaniTransformerModel.build_model(cfg, task)
    builtin = build_fairseq_transformer(ours, task, cfg)
    if fresh:
        copy_fairseq_weights_into_ours(builtin, ours)
    return ours, builtin


# --------------------------------------------------------------------------------------------
# batches


def collate(pairs, pad: int, eos: int, device) -> Dict[str, Any]:
    """A fairseq-style sample: left-padded sources, right-padded targets, shifted decoder input."""
    from fairseq.data.data_utils import collate_tokens

    sources = [s for s, _ in pairs]
    targets = [t for _, t in pairs]
    src = collate_tokens(sources, pad, eos, left_pad=True)
    target = collate_tokens(targets, pad, eos, left_pad=False)
    prev = collate_tokens(targets, pad, eos, left_pad=False, move_eos_to_beginning=True)
    return {
        "id": None,
        "nsentences": len(pairs),
        "ntokens": int(sum(len(t) for t in targets)),
        "net_input": {
            "src_tokens": src.to(device),
            "src_lengths": torch.tensor([len(s) for s in sources]).to(device),
            "prev_output_tokens": prev.to(device),
        },
        "target": target.to(device),
    }


def length_sorted_batches(pairs, max_tokens: int) -> List[list]:
    """Consecutive length-sorted pairs, each batch at most ``max_tokens`` padded tokens."""
    ordered = sorted(pairs, key=lambda p: (len(p[0]), len(p[1])))
    batches, current, longest = [], [], 0
    for pair in ordered:
        width = max(longest, len(pair[0]), len(pair[1]))
        if current and width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, width = [], max(len(pair[0]), len(pair[1]))
        current.append(pair)
        longest = width
    if current:
        batches.append(current)
    return batches


def spread(items: list, count: int) -> list:
    """``count`` items evenly spaced over ``items`` (all of them if fewer)."""
    if count >= len(items):
        return list(items)
    return [items[round(i * (len(items) - 1) / max(count - 1, 1))] for i in range(count)]


def sweep_batch(train_pairs, length: int, sentences: int, eos: int) -> list:
    """``sentences`` pairs of exactly ``length`` tokens (EOS included), made by concatenating
    real sentences (a source/target of that length is padding-free)."""

    def stream(column: int):
        while True:
            for pair in train_pairs:
                yield from pair[column][:-1].tolist()

    pairs = []
    src_stream, tgt_stream = stream(0), stream(1)
    for _ in range(sentences):
        src = [next(src_stream) for _ in range(length - 1)] + [eos]
        tgt = [next(tgt_stream) for _ in range(length - 1)] + [eos]
        pairs.append((torch.tensor(src), torch.tensor(tgt)))
    return pairs


# --------------------------------------------------------------------------------------------
# the worker: one model, one measurement, in a fresh process


def current_rss_kb() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class MemoryMeter:
    """Peak memory of the measured work: CUDA allocator peak, or process maxrss on CPU."""

    def __init__(self, device: str) -> None:

        self.device = device
        gc.collect()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.start = current_rss_kb() * 1024

    def result(self) -> Dict[str, float]:

        if self.device == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = peak_rss_kb() * 1024
        return {"peak_mb": peak / 2**20, "growth_mb": max(peak - self.start, 0) / 2**20}


def sync(device: str) -> None:
    if device == "cuda":

        torch.cuda.synchronize()


def training_flops(cfg, vocab: int, samples: list) -> float:
    """Model FLOPs of forward + backward of ``samples``, on their padded shapes
    (``user_plugin.measurement.flops``, the project's one formula)."""
    from user_plugin.measurement.flops import TokenCounts, TransformerShape
    from user_plugin.measurement.flops import training_flops as formula

    shape = TransformerShape(cfg.encoder_layers, cfg.decoder_layers, cfg.encoder_embed_dim,
                             cfg.encoder_ffn_embed_dim, vocab)
    total = 0.0
    for sample in samples:
        batch, src = sample["net_input"]["src_tokens"].shape
        tgt = sample["net_input"]["prev_output_tokens"].size(1)
        total += formula(shape, TokenCounts.of_padded_batch(batch, src, tgt))
    return total


def peak_flops(args) -> Optional[float]:

    if args.peak_tflops:
        return args.peak_tflops * 1e12
    name = torch.cuda.get_device_name()
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value * 1e12
    return None


def worker(spec: Dict[str, Any]) -> Dict[str, Any]:
    from fairseq.data import Dictionary

    if spec["impl"] != "builtin":
        # as ``--user-dir`` loads the plugin: our model, criterion and fairseq patches
        from user_plugin.registration import register

        register()
    args = argparse.Namespace(**spec["args"])
    for key in ("data", "work_dir", "json_out"):
        if getattr(args, key) is not None:
            setattr(args, key, Path(getattr(args, key)))
    work, impl, mode = Path(spec["work"]), spec["impl"], spec["mode"]
    torch.set_num_threads(args.threads)
    device = args.device
    dictionary = Dictionary.load(str(work / "dict.txt"))
    data = torch.load(work / "data.pt")
    pad, eos = dictionary.pad(), dictionary.eos()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(args.seed)
    cfg = model_cfg(args)
    if impl in ("ours", BOUND):
        from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

        model = VaswaniTransformerModel.build_model(cfg, task)
    else:
        from user_plugin.artifacts.builtin_transformer import build_fairseq_transformer

        model = build_fairseq_transformer(None, task, cfg)
    model.load_state_dict(torch.load(work / f"{'ours' if impl == BOUND else impl}.pt"))
    if impl == BOUND:
        if mode != "decode-sweep":
            raise ValueError("the attention-free bound is only measured at fixed output lengths")
        from user_plugin.modules.projections_only_attention import attention_free

        attention_free(model)
    if impl == "builtin":  # our §3.5 encoding, so that both models compute the same function
        from user_plugin.artifacts.builtin_transformer import OurPositionsForFairseq
        from user_plugin.modules.positional_encoding import SinusoidalPositionalEncoding

        for side in (model.encoder, model.decoder):
            encoding = SinusoidalPositionalEncoding(side.embed_tokens.embedding_dim,
                                                    max_positions(args))
            side.embed_positions = OurPositionsForFairseq(encoding, dictionary.pad())
    model.to(device)

    def autocast():
        """The context of the measured forward passes for --dtype."""
        if args.dtype == "bf16":
            from user_plugin.fairseq_patches.precision import bf16_autocast

            return bf16_autocast(device)
        if args.dtype == "fp16":
            return torch.autocast(device_type=device, dtype=torch.float16)
        return contextlib.nullcontext()

    if mode in ("train", "sweep"):
        if mode == "train":
            batches = spread(length_sorted_batches(data["train"], args.max_tokens),
                             args.train_batches)
            samples = [collate(b, pad, eos, device) for b in batches]
            warmup, repeats = samples[:2], samples
        else:
            length = spec["length"]
            count = max(1, args.sweep_tokens // length)
            samples = [collate(sweep_batch(data["train"], length, count, eos), pad, eos, device)]
            warmup, repeats = samples, samples * args.sweep_steps
        result = train_measure(args, model, task, impl, cfg, len(dictionary), device,
                               autocast, warmup, repeats)
        return {**result, **plugin_state(impl)}
    if mode == "decode-sweep":
        result = decode_measure(args, model, dictionary, impl, data["test"], device, autocast,
                                output_length=spec["length"])
    else:
        result = decode_measure(args, model, dictionary, impl, data["test"], device, autocast)
    return {**result, **plugin_state(impl)}


def plugin_state(impl: str) -> Dict[str, Any]:
    """Whether this process had the plugin registered and which of its fairseq patches were
    active. The built-in must run as stock fairseq: a process without either, checked after the
    measurement so that nothing imported on the way went unnoticed."""
    loaded = getattr(sys.modules.get("user_plugin.registration"), "_registered", False)
    patches: List[str] = []
    if "user_plugin.fairseq_patches" in sys.modules:
        from user_plugin.fairseq_patches import installed

        patches = list(installed())
    if impl == "builtin" and (loaded or patches):
        raise RuntimeError(f"the built-in ran with the plugin loaded ({patches}): "
                           "not stock fairseq")
    return {"plugin_loaded": loaded, "fairseq_patches": patches}


def train_measure(args, model, task, impl, cfg, vocab, device, autocast, warmup, samples):

    if impl == "ours":
        from user_plugin.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropy

        criterion = LabelSmoothedCrossEntropy(task, sentence_avg=False,
                                              label_smoothing=paper.LABEL_SMOOTHING)
    else:
        from fairseq.criterions.label_smoothed_cross_entropy import (
            LabelSmoothedCrossEntropyCriterion,
        )

        criterion = LabelSmoothedCrossEntropyCriterion(task, False, paper.LABEL_SMOOTHING)
    if args.dtype == "bf16":
        from user_plugin.fairseq_patches.precision import autocast_forward_bf16

        # as fairseq-train --bf16 with the plugin: the criterion's forward under autocast
        autocast_forward_bf16(criterion, device)
        forward_context = contextlib.nullcontext
    else:
        forward_context = autocast
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=paper.ADAM_BETAS,
                                 eps=paper.ADAM_EPS)
    scaler = torch.amp.GradScaler(device, enabled=args.dtype == "fp16")

    def step(sample) -> float:
        optimizer.zero_grad(set_to_none=True)
        with forward_context():
            loss, _, _ = criterion(model, sample)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return float(loss.detach())

    memory = MemoryMeter(device)
    for sample in warmup:
        step(sample)
    sync(device)
    losses, times = [], []
    for sample in samples:
        start = time.perf_counter()
        losses.append(step(sample))
        sync(device)
        times.append(time.perf_counter() - start)
    tokens = sum(s["ntokens"] for s in samples)
    seconds = sum(times)
    result = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
              "step_ms": 1000 * statistics.median(times),
              "first_loss": losses[0], **memory.result()}
    result["tflops"] = training_flops(cfg, vocab, samples) / seconds / 1e12
    if device == "cuda":
        peak = peak_flops(args)
        result["mfu"] = result["tflops"] * 1e12 / peak if peak else None
    return result


def decode_measure(args, model, dictionary, impl, test_pairs, device, autocast,
                   output_length: Optional[int] = None):
    """Beam search over the test sentences; with ``output_length``, the first
    ``--decode-sweep-sentences`` of them in one batch, every hypothesis exactly that long
    (median time of ``--sweep-steps`` passes)."""
    from fairseq.sequence_generator import SequenceGenerator

    model.eval()
    if output_length is None:
        generator = SequenceGenerator([model], dictionary, beam_size=args.beam, max_len_a=1,
                                      max_len_b=args.max_len_b)
        batch_size = args.decode_batch
    else:
        generator = SequenceGenerator([model], dictionary, beam_size=args.beam, max_len_a=0,
                                      max_len_b=output_length, min_len=output_length)
        test_pairs = test_pairs[: args.decode_sweep_sentences]
        batch_size = args.decode_sweep_sentences
    pad, eos = dictionary.pad(), dictionary.eos()
    ordered = sorted(test_pairs, key=lambda p: len(p[0]))
    batches = [ordered[i: i + batch_size] for i in range(0, len(ordered), batch_size)]
    samples = [collate(b, pad, eos, device) for b in batches]

    def run(sample):
        with torch.no_grad(), autocast():
            return generator.generate([model], {"net_input": {
                "src_tokens": sample["net_input"]["src_tokens"],
                "src_lengths": sample["net_input"]["src_lengths"]}})

    run(samples[0])  # warm-up
    memory = MemoryMeter(device)
    passes = 1 if output_length is None else args.sweep_steps  # sweep: median of passes
    times = []
    for _ in range(passes):
        digest = hashlib.sha256()
        sentences = tokens = 0
        sync(device)
        start = time.perf_counter()
        for sample in samples:
            for hypos in run(sample):
                best = hypos[0]["tokens"]
                digest.update(bytes(str(best.tolist()), "ascii"))
                sentences += 1
                tokens += best.numel()
        sync(device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {"seconds": seconds, "sentences": sentences, "tokens": tokens,
            "sentences_per_s": sentences / seconds, "tokens_per_s": tokens / seconds,
            "hypotheses_sha256": digest.hexdigest()[:16], **memory.result()}


# --------------------------------------------------------------------------------------------
# the driver


def run_worker(args, argv_spec: Dict[str, Any], work: Path, impl: str, mode: str,
               length: Optional[int] = None) -> Dict[str, Any]:
    spec = {"args": argv_spec, "work": str(work), "impl": impl, "mode": mode, "length": length}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, __file__, "--_worker", json.dumps(spec)],
                          capture_output=True, text=True, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{impl} {mode} run failed: {tail}")
    return json.loads(lines[-1])


def summarize(runs: Dict[str, List[dict]], key: str) -> Dict[str, Any]:
    """Medians per model, ratio ours / built-in, and the spread (max-min)/median as noise."""
    out: Dict[str, Any] = {}
    for impl in IMPLS:
        values = [r[key] for r in runs[impl]]
        median = statistics.median(values)
        out[impl] = median
        out[f"{impl}_noise"] = (max(values) - min(values)) / median if median else 0.0
    out["ratio"] = out["ours"] / out["builtin"] if out["builtin"] else math.nan
    return out


def fmt(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def table(rows: List[tuple]) -> str:
    header = ("measure", "ours", "built-in", "ours / built-in", "noise ours / built-in")
    body = [(name, fmt(summary["ours"]), fmt(summary["builtin"]), f"{summary['ratio']:.3f}",
             f"{summary['ours_noise']:.1%} / {summary['builtin_noise']:.1%}")
            for name, summary in rows]
    return markdown_table(header, body)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    unknown = skip - {"train", "decode", "sweep", "decode-sweep"}
    if unknown:
        raise UserError(f"--skip: unknown step(s) {sorted(unknown)}; "
                        "use train, decode, sweep, decode-sweep")
    if not args.data.is_dir():
        raise UserError(f"{args.data}: no such data folder (see --data)")
    for name in ("pairs", "vocab", "max_tokens", "train_batches", "decode_sentences",
                 "decode_batch", "beam", "repeats", "sweep_tokens", "sweep_steps", "threads",
                 "decode_sweep_sentences"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1")
    if any(n < 2 for n in sweep_lengths(args)):
        raise UserError("--sweep lengths must be >= 2")
    if any(n < 1 or n + 2 > max_positions(args) for n in decode_sweep_lengths(args)):
        raise UserError(f"--decode-sweep lengths must be in [1, {max_positions(args) - 2}]")
    if args.device == "cpu" and args.dtype == "fp16":
        raise UserError("--dtype fp16 needs --device cuda (bf16 and fp32 run on a CPU too)")
    if args.device == "cuda":

        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device visible to torch")
    argv_spec = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}

    with tempfile.TemporaryDirectory(prefix="vaswani-bench-") as temp:
        work = args.work_dir or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        print(f"preparing data and weights in {work} ...", flush=True)
        prepare(args, work)
        results: Dict[str, Any] = {"config": argv_spec, "machine": machine_info(args)}
        rows = []
        report_notes: List[str] = []
        modes = [m for m in ("train", "decode") if m not in skip]
        peaks = cpu_matmul_peaks(args) if args.device == "cpu" and "train" in modes else {}
        runs: Dict[str, Dict[str, List[dict]]] = {m: {i: [] for i in IMPLS} for m in modes}
        for repeat in range(args.repeats):
            order = IMPLS if repeat % 2 == 0 else IMPLS[::-1]
            for mode in modes:
                for impl in order:
                    result = run_worker(args, argv_spec, work, impl, mode)
                    runs[mode][impl].append(result)
                    print(f"repeat {repeat + 1}/{args.repeats} {mode:6s} {impl:8s} "
                          f"{json.dumps(result)}", flush=True)
        results["runs"] = runs
        if "train" in runs:
            rows += [("training target tokens/s", summarize(runs["train"], "tokens_per_s")),
                     ("training peak memory (MB)", summarize(runs["train"], "peak_mb")),
                     ("training memory growth (MB)", summarize(runs["train"], "growth_mb"))]
            rows.append(("training model TFLOP/s", summarize(runs["train"], "tflops")))
            peaks = cpu_matmul_peaks(args, peaks) if peaks else {}
            for key, value in peaks.items():
                for impl in IMPLS:
                    for run in runs["train"][impl]:
                        run[f"{key}_peak_fraction"] = run["tflops"] * 1e12 / value
                rows.append((f"fraction of the CPU's {key} matmul peak",
                             summarize(runs["train"], f"{key}_peak_fraction")))
            if peaks:
                results["matmul_peak_tflops"] = {k: v / 1e12 for k, v in peaks.items()}
                report_notes.append(cpu_peak_note(args, peaks))
        if "decode" in runs:
            rows += [("beam-4 sentences/s", summarize(runs["decode"], "sentences_per_s")),
                     ("beam-4 tokens/s", summarize(runs["decode"], "tokens_per_s")),
                     ("decoding peak memory (MB)", summarize(runs["decode"], "peak_mb"))]
            hashes = {r["hypotheses_sha256"] for i in IMPLS for r in runs["decode"][i]}
            results["identical_hypotheses"] = len(hashes) == 1
        results["summary"] = {name: summary for name, summary in rows}
        report = [table(rows)] if rows else []
        if "decode" in runs:
            report.append(f"\nidentical beam-search hypotheses: {results['identical_hypotheses']}")
        if rows:
            report += [STOCK_NOTE, *report_notes]
        if "sweep" not in skip and sweep_lengths(args):
            sweep = run_sweep(args, argv_spec, work)
            results["sweep"] = sweep
            report.append("\n" + sweep_table(sweep))
        if "decode-sweep" not in skip and decode_sweep_lengths(args):
            decode_sweep = run_decode_sweep(args, argv_spec, work)
            results["decode_sweep"] = decode_sweep
            report.append("\n" + decode_sweep_table(decode_sweep))
        text = "\n".join(report)
        print("\n" + text)
        if args.json_out:
            atomic_write_text(args.json_out, json.dumps(results, indent=1) + "\n")
            print(f"wrote {args.json_out}")
    return 0


def run_sweep(args, argv_spec, work: Path) -> List[dict]:
    return run_length_sweep(args, argv_spec, work, "sweep", sweep_lengths(args),
                            lambda length: max(1, args.sweep_tokens // length))


def run_decode_sweep(args, argv_spec, work: Path) -> List[dict]:
    extra = () if args.no_decode_bound else (BOUND,)
    return run_length_sweep(args, argv_spec, work, "decode-sweep", decode_sweep_lengths(args),
                            lambda length: args.decode_sweep_sentences, extra)


def run_length_sweep(args, argv_spec, work: Path, mode: str, lengths: List[int],
                     sentences, extra: tuple = ()) -> List[dict]:
    """One row per length: each model (alternating which goes first), then ``extra``; decoding
    rows also say whether ours and the built-in found the same hypotheses."""
    rows = []
    for index, length in enumerate(lengths):
        order = (IMPLS if index % 2 == 0 else IMPLS[::-1]) + extra
        row: Dict[str, Any] = {"length": length, "sentences": sentences(length)}
        for impl in order:
            row[impl] = run_worker(args, argv_spec, work, impl, mode, length)
        if "hypotheses_sha256" in row["ours"]:
            row["identical_hypotheses"] = (row["ours"]["hypotheses_sha256"]
                                           == row["builtin"]["hypotheses_sha256"])
        print(f"{mode} length {length}: {json.dumps(row)}", flush=True)
        rows.append(row)
    return rows


def markdown_table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in body]
    return "\n".join(lines)


def decode_sweep_table(rows: List[dict]) -> str:
    """Seconds and speed-up (built-in / ours) per output length; with the attention-free bound,
    also its seconds and the largest reachable speed-up (built-in / bound)."""
    bound = all(BOUND in row for row in rows)
    header = ("output length", "seconds ours", "seconds built-in", "speed-up", "peak MB ours",
              "peak MB built-in", "identical")
    if bound:
        header += ("seconds attention-free", "speed-up bound")
    body = []
    for row in rows:
        ours, theirs = row["ours"], row["builtin"]
        line = (row["length"], f"{ours['seconds']:.2f}", f"{theirs['seconds']:.2f}",
                f"{theirs['seconds'] / ours['seconds']:.3f}", f"{ours['peak_mb']:.0f}",
                f"{theirs['peak_mb']:.0f}", row["identical_hypotheses"])
        if bound:
            floor = row[BOUND]["seconds"]
            line += (f"{floor:.2f}", f"{theirs['seconds'] / floor:.3f}")
        body.append(line)
    return markdown_table(header, body)


def sweep_table(rows: List[dict]) -> str:
    header = ("length", "sentences", "step ms ours", "step ms built-in", "ratio", "peak MB ours",
              "peak MB built-in", "growth MB ours", "growth MB built-in")
    body = []
    for row in rows:
        ours, theirs = row["ours"], row["builtin"]
        body.append((row["length"], row["sentences"], f"{ours['step_ms']:.0f}",
                     f"{theirs['step_ms']:.0f}", f"{ours['step_ms'] / theirs['step_ms']:.3f}",
                     f"{ours['peak_mb']:.0f}", f"{theirs['peak_mb']:.0f}",
                     f"{ours['growth_mb']:.0f}", f"{theirs['growth_mb']:.0f}"))
    return markdown_table(header, body)


def cpu_matmul_peaks(args, earlier: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """The CPU's matrix-multiply peak (FLOP/s) with this torch build and ``--threads``, in fp32
    and, where the CPU has bf16 instructions, bf16; measured before and after the runs, the
    better of the two kept (``earlier``: the first measurement)."""
    from user_plugin.measurement.cpu import has_bf16_instructions, matmul_peak

    torch.set_num_threads(args.threads)
    dtypes = {"fp32": torch.float32}
    if has_bf16_instructions():
        dtypes["bf16"] = torch.bfloat16
    earlier = earlier or {}
    return {key: max(matmul_peak(dtype), earlier.get(key, 0.0)) for key, dtype in dtypes.items()}


def cpu_peak_note(args, peaks: Dict[str, float]) -> str:
    from user_plugin.measurement.cpu import cpu_flags, cpu_name

    measured = ", ".join(f"{key} {value / 1e9:,.0f} GFLOP/s" for key, value in peaks.items())
    return (f"CPU: {cpu_name()}, flags {' '.join(cpu_flags()) or 'none of note'}; matmul peak "
            f"(2048x2048, {args.threads} threads, this torch): {measured}. Model FLOPs: "
            "user_plugin/measurement/flops.py on the padded batches.")


def machine_info(args) -> Dict[str, Any]:
    import platform

    import fairseq

    from user_plugin.measurement.cpu import cpu_flags, cpu_name

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "fairseq": fairseq.__version__, "cpu": cpu_name(), "cpu_flags": cpu_flags(),
            "cores": os.cpu_count(), "threads": args.threads,
            "load_average": os.getloadavg()}
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(run_main(main, None, "benchmark.py"))
