#!/usr/bin/env python
"""Run one fairseq command-line module in this process and record its peak memory.

``python measure.py OUT.json fairseq_cli.train ARGS...`` runs ``fairseq_cli.train`` with ARGS as
``python -m fairseq_cli.train ARGS...`` would, then writes ``{"peak_bytes": ..., "device": ...,
"seconds": ..., "exit_code": ...}`` to OUT.json: ``torch.cuda.max_memory_allocated()`` on a GPU,
the peak resident set size on a CPU. Nothing of the plugin is imported here: a stock fairseq
command stays stock (the plugin is loaded only by a ``--user-dir`` among ARGS). The only
change to the process: ``torch.cuda.reset_peak_memory_stats``, which fairseq's trainer calls at
every logged step, first records the peak it is about to clear; with ``VASWANI_PROFILE`` set,
``Trainer.train_step`` is timed by ``torch.profiler`` over a few steps
(:func:`profile_train_steps`).
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys
import time


def profile_train_steps(spec: str) -> None:
    """``VASWANI_PROFILE=OUT.txt:FIRST:COUNT``: profile training steps FIRST..FIRST+COUNT-1 with
    ``torch.profiler`` and write the operators by device time, then by host time, to OUT.txt."""
    import torch
    from fairseq.trainer import Trainer

    out, first, count = spec.rsplit(":", 2)
    first, count = int(first), int(count)
    original = Trainer.train_step
    state = {"step": 0, "profiler": None}

    def profiled_train_step(self, *args, **kwargs):
        state["step"] += 1
        if state["step"] == first:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            state["profiler"] = torch.profiler.profile(activities=activities)
            state["profiler"].__enter__()
        result = original(self, *args, **kwargs)
        if state["step"] == first + count - 1 and state["profiler"] is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            state["profiler"].__exit__(None, None, None)
            averages = state["profiler"].key_averages()
            device_key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
            with open(out, "w", encoding="utf-8") as handle:
                handle.write(f"steps {first}..{first + count - 1}\n")
                handle.write(averages.table(sort_by=device_key, row_limit=30) + "\n")
                handle.write(averages.table(sort_by="self_cpu_time_total", row_limit=30))
            state["profiler"] = None
        return result

    Trainer.train_step = profiled_train_step


def main() -> int:
    if len(sys.argv) < 3:
        print("usage: measure.py OUT.json MODULE [ARGS...]", file=sys.stderr)
        return 2
    out, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    sys.argv = [module, *args]
    peaks = [0]
    import torch

    # fairseq's trainer resets CUDA's peak-memory counter at every logged step (for its
    # ``gb_free`` figure): keep the largest peak seen before each reset.
    reset = torch.cuda.reset_peak_memory_stats

    def keep_peak_then_reset(*device):
        peaks.append(torch.cuda.max_memory_allocated(*device))
        reset(*device)

    torch.cuda.reset_peak_memory_stats = keep_peak_then_reset
    profile = os.environ.get("VASWANI_PROFILE")
    if profile:
        profile_train_steps(profile)
    start = time.time()
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    torch.cuda.reset_peak_memory_stats = reset
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peak = max(peaks + [torch.cuda.max_memory_allocated()])
        device = torch.cuda.get_device_name()
    else:
        peak, device = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu"
    with open(out, "w", encoding="utf-8") as handle:
        json.dump({"peak_bytes": peak, "device": device, "seconds": time.time() - start,
                   "exit_code": code}, handle)
    return code


if __name__ == "__main__":
    sys.exit(main())
