#!/usr/bin/env python
"""Observe fairseq's training step inside a real ``fairseq-train`` process.

``python user_plugin/measurement/train_step_probe.py OUT.json [options] -- MODULE ARGS...``
runs the fairseq command-line module MODULE (``fairseq_cli.train``) with ARGS in this process,
as ``python -m MODULE ARGS...`` would, and wraps fairseq's ``Trainer.train_step`` to observe it.
It is run as a file, not imported as ``user_plugin...``: the package is then not loaded at all,
so a stock fairseq command stays stock (the plugin is loaded only by a ``--user-dir`` among
ARGS, by fairseq itself; OUT.json says whether it was, ``plugin_loaded``). Options, each about
numbered calls of ``train_step`` (1 = the first):

``--count-operators FIRST:COUNT``
    count the ATen operators of calls FIRST..FIRST+COUNT-1 (:mod:`operator_count`): compute
    and view operators and host-device synchronisations per update, those inside the
    forward and backward pass (the task's ``train_step``: the criterion and the backward) apart.
``--window WARMUP:INTERVAL:COUNT``
    after call WARMUP, every INTERVAL calls, COUNT times: wait for the device, then record the
    interval's seconds, target tokens and updates (the throughput of a steady state; the
    warm-up is not counted, nor anything after the last interval).
``--profile FIRST:COUNT``
    ``torch.profiler`` over calls FIRST..: the operator tables (``--profile-table``), the
    shares of the host's operator time (matrix products, attention kernels, the Python between
    operators, the rest: :func:`host_operator_shares`) and, on a GPU, the GPU-busy fraction,
    kernels and synchronisations per update, the top kernels and the
    scaled-dot-product-attention backend of each attention call.
``--sync-debug CALL``
    call CALL under ``torch.cuda.set_sync_debug_mode("warn")``: every synchronising CUDA call
    recorded with the Python line that made it and whether it was in the forward-backward.
``--fp16-masters-on-cpu``
    on a CPU, answer fairseq's ``FP16Optimizer`` (stock ``--fp16``), which allocates its master
    weights on ``torch.cuda.current_device()``: the answer is None, the device index its own
    grouping of CPU parameters uses, so that stock ``--fp16`` runs on a CPU to be counted.

OUT.json is rewritten (atomically) after each recorded interval and at the end: a run stopped
by a time limit keeps what it measured. The peak memory is ``torch.cuda.max_memory_allocated``
(fairseq resets that counter at every logged step; each peak is kept before the reset) or the
peak resident set size on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import runpy
import statistics
import sys
import time
import warnings
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

try:  # run as a file (its directory is on sys.path) or imported from the package
    from operator_count import OperatorCounter  # type: ignore[import-not-found,no-redef]
except ImportError:  # pragma: no cover - the package import
    from .operator_count import OperatorCounter

#: The scaled-dot-product-attention operators, by backend.
SDPA_BACKENDS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "cpu_flash",
    "aten::_scaled_dot_product_attention_math": "math",
}
#: The host operators that are matrix products (each op's self time is the product itself).
MATRIX_PRODUCTS = frozenset({"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm",
                             "aten::baddbmm", "aten::_addmm_activation"})
SYNC_RUNTIME_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                      "cudaMemcpy", "cudaStreamWaitEvent")


def span(text: str, parts: int) -> Tuple[int, ...]:
    values = tuple(int(v) for v in text.split(":"))
    if len(values) != parts or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected {parts} positive numbers separated by ':'")
    return values


class Probe:
    """The observations of one process (see the module description)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = args.out
        self.cuda = torch.cuda.is_available()
        self.calls = 0
        self.report: Dict[str, Any] = {"argv": list(args.command), "device": "cpu",
                                       "intervals": [], "calls": 0, "updates": 0}
        self.counter: Optional[OperatorCounter] = None
        self.counted: Dict[str, Any] = {"calls": 0, "updates": 0}
        self.window_start: Optional[Tuple[float, int, int]] = None
        self.tokens = 0
        self.profiler: Any = None
        self.profile_steps: List[Tuple[int, Any]] = []
        self.sync_warnings: List[Dict[str, Any]] = []
        self.phase = [0]
        self.peaks = [0]
        self.started = time.time()

    # ---------------------------------------------------------------------------------------

    def install(self) -> None:
        from fairseq.trainer import Trainer

        original = Trainer.train_step
        probe = self

        def train_step(trainer: Any, samples: Any, *rest: Any, **kwargs: Any) -> Any:
            return probe.step(original, trainer, samples, *rest, **kwargs)

        Trainer.train_step = train_step
        if self.cuda:
            reset = torch.cuda.reset_peak_memory_stats

            def keep_peak_then_reset(*device: Any) -> None:
                self.peaks.append(torch.cuda.max_memory_allocated(*device))
                reset(*device)

            torch.cuda.reset_peak_memory_stats = keep_peak_then_reset
        elif self.args.fp16_masters_on_cpu:
            torch.cuda.current_device = lambda: None  # type: ignore[assignment]

    def step(self, original: Any, trainer: Any, samples: Any, *rest: Any, **kwargs: Any) -> Any:
        self.calls += 1
        call = self.calls
        args = self.args
        counting = args.count_operators and \
            args.count_operators[0] <= call < sum(args.count_operators)
        profiling = args.profile and args.profile[0] <= call < sum(args.profile)
        sync_debug = args.sync_debug == call and self.cuda
        if counting and self.counter is None:
            self.counter = OperatorCounter()
        if profiling and self.profiler is None:
            self.start_profiler()
        updates_before = trainer.get_num_updates()
        marked = counting or sync_debug
        if marked:
            self.mark_forward_backward(trainer)
        try:
            with self.observing(counting, sync_debug, profiling, call):
                result = original(trainer, samples, *rest, **kwargs)
        finally:
            if marked:
                trainer.task.__dict__.pop("train_step", None)
        updates = trainer.get_num_updates() - updates_before
        tokens = sum(s.get("ntokens", 0) for s in samples if isinstance(s, dict))
        self.report["calls"], self.report["updates"] = call, trainer.get_num_updates()
        if counting:
            self.counted["calls"] += 1
            self.counted["updates"] += updates
            if call == sum(args.count_operators) - 1:
                self.finish_counting()
        if profiling and call == sum(args.profile) - 1:
            self.finish_profile()
        if sync_debug:
            self.report["sync_debug"] = {"call": call, "warnings": self.sync_warnings,
                                         "in_forward_backward": sum(
                                             w["in_forward_backward"] for w in self.sync_warnings)}
        self.record_window(call, tokens, updates)
        return result

    def observing(self, counting: bool, sync_debug: bool, profiling: bool, call: int) -> Any:
        import contextlib

        stack = contextlib.ExitStack()
        if profiling:
            stack.enter_context(torch.profiler.record_function(f"train_step-{call}"))
        if counting:
            stack.enter_context(self.counter)
        if sync_debug:
            stack.enter_context(self.sync_debug_mode())
        return stack

    def mark_forward_backward(self, trainer: Any) -> None:
        """The task's ``train_step`` (forward and backward) of this call, marked as such."""
        task_train_step = trainer.task.train_step
        probe = self

        def marked(*args: Any, **kwargs: Any) -> Any:
            probe.phase[0] += 1
            if probe.counter is not None:
                probe.counter.enter_forward_backward()
            try:
                return task_train_step(*args, **kwargs)
            finally:
                probe.phase[0] -= 1
                if probe.counter is not None:
                    probe.counter.leave_forward_backward()

        trainer.task.train_step = marked

    # -- operator counts ------------------------------------------------------------------

    def finish_counting(self) -> None:
        counter, calls = self.counter, max(1, self.counted["calls"])
        totals = counter.totals()
        self.report["operators"] = {
            "calls": self.counted["calls"], "updates": self.counted["updates"],
            "ops_per_update": totals["compute"] / calls,
            "view_ops_per_update": totals["views"] / calls,
            "syncs_per_update": totals["syncs"] / calls,
            "syncs_in_forward_backward": totals["syncs_in_forward_backward"] / calls,
            "top_compute": counter.compute.most_common(25),
            "top_views": counter.views.most_common(10),
            "syncs": dict(counter.syncs), "sync_callers": counter.sync_callers.most_common(20),
        }
        self.counter = None
        self.save()

    # -- steady-state throughput ---------------------------------------------------------------

    def record_window(self, call: int, tokens: int, updates: int) -> None:
        if not self.args.window:
            return
        warmup, interval, count = self.args.window
        if call < warmup or call > warmup + interval * count:
            return
        if call == warmup:
            self.synchronize()
            self.window_start = (time.perf_counter(), 0, 0)
            return
        start, seen_tokens, seen_updates = self.window_start
        seen_tokens, seen_updates = seen_tokens + tokens, seen_updates + updates
        self.window_start = (start, seen_tokens, seen_updates)
        if (call - warmup) % interval:
            return
        self.synchronize()
        now = time.perf_counter()
        seconds = now - start
        self.report["intervals"].append({"last_call": call, "seconds": seconds,
                                         "target_tokens": seen_tokens, "updates": seen_updates,
                                         "target_tokens_per_s": seen_tokens / seconds})
        self.window_start = (now, 0, 0)
        self.summarize_intervals()
        self.save()

    def summarize_intervals(self) -> None:
        rates = [i["target_tokens_per_s"] for i in self.report["intervals"]]
        median = statistics.median(rates)
        self.report["throughput"] = {
            "intervals": len(rates), "median_target_tokens_per_s": median,
            "min": min(rates), "max": max(rates),
            "spread": (max(rates) - min(rates)) / median if median else None,
            "updates": sum(i["updates"] for i in self.report["intervals"]),
            "target_tokens_per_update": sum(i["target_tokens"] for i in self.report["intervals"])
            / max(1, sum(i["updates"] for i in self.report["intervals"])),
        }

    def synchronize(self) -> None:
        if self.cuda and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    # -- profile -------------------------------------------------------------------------------

    def start_profiler(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.synchronize()
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.__enter__()

    def finish_profile(self) -> None:
        self.synchronize()
        self.profiler.__exit__(None, None, None)
        first, count = self.args.profile
        averages = self.profiler.key_averages()
        device_key = "cuda_time_total" if self.cuda else "cpu_time_total"
        if self.args.profile_table:
            with open(self.args.profile_table, "w", encoding="utf-8") as handle:
                handle.write(f"train_step calls {first}..{first + count - 1}\n")
                handle.write(averages.table(sort_by=device_key, row_limit=40) + "\n")
                handle.write(averages.table(sort_by="self_cpu_time_total", row_limit=40))
        self.report["profile"] = analyze_profile(self.profiler.events(), first, count,
                                                 self.args.layers)
        self.profiler = None
        self.save()

    # -- synchronisation debug -------------------------------------------------------------------

    def sync_debug_mode(self) -> Any:
        import contextlib

        probe = self

        @contextlib.contextmanager
        def mode() -> Any:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                shown = warnings.showwarning

                def record(message: Any, category: Any, filename: str, lineno: int,
                           *rest: Any) -> None:
                    probe.sync_warnings.append({
                        "message": str(message).splitlines()[0][:200],
                        "where": f"{filename}:{lineno}",
                        "in_forward_backward": probe.phase[0] > 0})

                warnings.showwarning = record
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    yield
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                    warnings.showwarning = shown

        return mode()

    # ---------------------------------------------------------------------------------------

    def finish(self, code: int) -> None:
        if self.cuda and torch.cuda.is_initialized():
            self.report["peak_memory_bytes"] = max(self.peaks
                                                   + [torch.cuda.max_memory_allocated()])
            self.report["device"] = torch.cuda.get_device_name()
        else:
            self.report["peak_memory_bytes"] = \
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.report["plugin_loaded"] = "user_plugin.registration" in sys.modules
        self.report["exit_code"] = code
        self.report["seconds"] = time.time() - self.started
        self.save()

    def save(self) -> None:
        tmp = f"{self.out}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(self.report, handle, indent=1, default=str)
        os.replace(tmp, self.out)


def analyze_profile(events: Sequence[Any], first: int, count: int,
                    layers: Optional[Tuple[int, int]] = None) -> Dict[str, Any]:
    """What a profiled window says: wall and GPU-busy time, kernels, memory copies and host
    synchronisations per update, the top kernels, the attention backends (in forward order,
    labelled by layer when ``layers`` = (encoder, decoder) layer counts match)."""
    steps = [e for e in events if e.name.startswith("train_step-") and not _on_device(e)]
    kernels = [e for e in events if _kind(e) == "kernel"]
    copies = [e for e in events if _kind(e) == "copy"]
    start = min((e.time_range.start for e in steps), default=0.0)
    end = max([e.time_range.end for e in steps] + [e.time_range.end for e in kernels],
              default=0.0)
    wall = max(end - start, 1e-9)
    busy = _union_length([(e.time_range.start, e.time_range.end) for e in kernels + copies])
    by_kernel: Dict[str, List[float]] = {}
    for e in kernels:
        by_kernel.setdefault(e.name, []).append(e.time_range.elapsed_us())
    top = sorted(by_kernel.items(), key=lambda item: -sum(item[1]))[:20]
    syncs = Counter(e.name for e in events if e.name in SYNC_RUNTIME_CALLS)
    attention = [SDPA_BACKENDS[e.name] for e in sorted(events, key=lambda e: e.time_range.start)
                 if e.name in SDPA_BACKENDS]
    first_step = steps[0] if steps else None
    forward = [SDPA_BACKENDS[e.name] for e in sorted(events, key=lambda e: e.time_range.start)
               if e.name in SDPA_BACKENDS and first_step is not None
               and first_step.time_range.start <= e.time_range.start <= first_step.time_range.end]
    result: Dict[str, Any] = {
        "calls": [first, first + count - 1],
        "wall_ms_per_update": wall / 1000 / count,
        "gpu_busy_fraction": busy / wall if kernels else None,
        "kernels_per_update": len(kernels) / count,
        "memory_copies_per_update": len(copies) / count,
        "syncs_per_update": sum(syncs.values()) / count,
        "sync_calls": dict(syncs),
        "top_kernels": [{"name": name[:160], "per_update": len(times) / count,
                         "ms_per_update": sum(times) / 1000 / count} for name, times in top],
        "attention_backends_per_update": {k: v / count for k, v in Counter(attention).items()},
        "attention_forward_order": forward,
        "host_operator_shares": host_operator_shares(events),
    }
    if layers and forward:
        encoder, decoder = layers
        labels = ["encoder self"] * encoder + ["decoder self", "decoder cross"] * decoder
        if len(forward) == len(labels):
            result["attention_backend_by_layer"] = [
                f"{label} {index}: {backend}" for index, (label, backend)
                in enumerate(zip(labels, forward))]
    return result


def host_operator_shares(events: Sequence[Any], top: int = 5) -> Dict[str, Any]:
    """Where the host's operator time goes: fractions of the summed self time of the host's
    events (so a nested operator counts once) in matrix products, attention kernels (every
    scaled-dot-product operator, forward and backward), the Python between operators (the
    self time of ``record_function`` ranges) and everything else, with the ``top`` largest
    operators of everything else. On a CPU this is where the step's time goes; on a GPU, where
    the host's goes."""
    parts: Counter = Counter()
    others: Counter = Counter()
    for event in events:
        kind = _kind(event)
        if kind not in ("host", "annotation") or _on_device(event):
            continue
        spent = float(event.self_cpu_time_total)
        if kind == "annotation":
            parts["python_between_operators"] += spent
        elif event.name in MATRIX_PRODUCTS:
            parts["matrix_products"] += spent
        elif "scaled_dot_product" in event.name:
            parts["attention_kernels"] += spent
        else:
            parts["other_operators"] += spent
            others[event.name] += spent
    total = sum(parts.values()) or 1.0
    shares: Dict[str, Any] = {name: parts[name] / total for name in (
        "matrix_products", "attention_kernels", "python_between_operators", "other_operators")}
    shares["largest_other_operators"] = {name: spent / total
                                         for name, spent in others.most_common(top)}
    return shares


def shares_line(shares: Dict[str, Any]) -> str:
    """:func:`host_operator_shares` as one line of percentages."""
    parts = ", ".join(f"{name.replace('_', ' ')} {100 * shares[name]:.1f} %" for name in (
        "matrix_products", "attention_kernels", "python_between_operators", "other_operators"))
    largest = ", ".join(f"{name} {100 * share:.1f} %"
                        for name, share in shares["largest_other_operators"].items())
    return f"{parts} (largest other operators: {largest})"


def _on_device(event: Any) -> bool:
    return str(getattr(event, "device_type", "")).endswith("CUDA")


def _kind(event: Any) -> str:
    """"kernel", "copy" (memory copy or set on the device), "annotation" (a
    ``record_function`` range, on the host or its mirror on the device) or "host"."""
    activity = str(getattr(event, "activity_type", "") or "").lower()
    if getattr(event, "is_user_annotation", False) or "annotation" in activity:
        return "annotation"
    if not _on_device(event):
        return "host"
    if _is_copy(event.name) or "memcpy" in activity or "memset" in activity:
        return "copy"
    return "kernel"


def _is_copy(name: str) -> bool:
    return name.startswith(("Memcpy", "Memset", "memcpy", "memset"))


def _union_length(intervals: List[Tuple[float, float]]) -> float:
    total, current = 0.0, None
    for lo, hi in sorted(intervals):
        if current is None or lo > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = [lo, hi]
        else:
            current[1] = max(current[1], hi)
    if current is not None:
        total += current[1] - current[0]
    return total


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit("train_step_probe: error: expected OUT.json [options] -- MODULE ARGS...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="train_step_probe", description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--count-operators", type=lambda t: span(t, 2))
    parser.add_argument("--window", type=lambda t: span(t, 3))
    parser.add_argument("--profile", type=lambda t: span(t, 2))
    parser.add_argument("--profile-table")
    parser.add_argument("--layers", type=lambda t: span(t, 2),
                        help="ENCODER:DECODER layer counts, to label the attention backends")
    parser.add_argument("--sync-debug", type=int)
    parser.add_argument("--fp16-masters-on-cpu", action="store_true")
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1:]
    if not args.command:
        parser.error("no MODULE after --")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    probe = Probe(args)
    probe.install()
    module, *module_args = args.command
    sys.argv = [module, *module_args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    probe.finish(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
