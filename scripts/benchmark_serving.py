#!/usr/bin/env python
"""Load benchmark of ``vaswani-serve``, on this machine's loopback only.

For each backend given (``--fairseq MODEL_DIR``, ``--ctranslate2 EXPORT_DIR``), servers are
started on 127.0.0.1 with the same ``--threads`` and driven with one raw source sentence per
request, sentences taken in turn from ``--sentences``. The throughput runs are driven by
``wrk`` (a compiled load generator, Debian's package, with ``scripts/serving_load.lua``), so
that the client does not take the cores it measures; where wrk is missing (or with
``--load-generator python``), by an asyncio client (httpx). The answers that must be checked
(the reference pass, the open loop, the soak) go through the Python client:

1. **reference**: every sentence alone, one request at a time, on the batched server; its
   answers are the ones every later answer is checked against ("differ": another text, which
   float rounding of other batch shapes can cause on near-ties), and with ``--reference``
   their sacreBLEU;
2. **throughput**: ``--clients`` concurrent clients (1, 8, 64), each sending its next request
   when its previous one is answered, ``--requests`` requests or ``--seconds`` at most, against
   the **batched** server (the defaults) and the **one-request-at-a-time** server
   (``--max-batch 1 --batch-wait-ms 0``): sentences/s, p50 and p99 latency, and the cause
   of every request not answered 200 or 503 (its status, or wrk's socket error kind);
3. **overload**: requests arriving on a fixed schedule (open loop) at the batched server's
   best rate of step 2 (its "sustainable" rate), then at ``--overload-factor`` (4) times it,
   for ``--overload-seconds`` each: the share answered, the share refused with 503, the
   number lost (no answer, a connection error, any other status: each cause counted) and
   differing, and the p99 of the answered ones;
4. **soak**: 8 clients for ``--soak-seconds`` (600) on the batched server, each request with
   another ``lenpen`` (:data:`SOAK_LENPENS`), with the server's resident memory (``VmRSS`` of
   ``/proc/PID/status``, Linux) after a warm-up and at the end.

Every phase is bounded in requests and time; the servers are stopped by SIGTERM at the end
and must exit 0. ``--quick`` runs every phase with tiny sizes (a few seconds each) to check
that the benchmark works; its figures mean nothing. Nothing else should run meanwhile: the
client shares the machine with the server, so run it on an idle machine and say which.

    python scripts/benchmark_serving.py --fairseq MODEL_DIR --ctranslate2 CT2_INT8_DIR \\
        --sentences ../shared/data/multi30k-en-de/test_2016_flickr.en \\
        --reference ../shared/data/multi30k-en-de/test_2016_flickr.de \\
        --threads 1 --json-out serving.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WRK_SCRIPT = Path(__file__).resolve().parent / "serving_load.lua"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from user_plugin.files import UserError, atomic_write_text, iter_lines, run_main  # noqa: E402

LISTENING = re.compile(r"vaswani-serve: listening on (http://\S+)")
PROG = "benchmark_serving.py"


# -- servers -------------------------------------------------------------------------------------


class Server:
    """A ``vaswani-serve`` process on a free loopback port."""

    def __init__(self, model_dir: str, backend: str, args: Sequence[str],
                 timeout: float = 600) -> None:
        command = [sys.executable, "-m", "user_plugin.commands.serve", model_dir,
                   "--host", "127.0.0.1", "--port", "0", "--backend", backend, *args]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True, env=env)
        self.lines: list[str] = []
        self.url = ""
        found = threading.Event()

        def drain() -> None:
            for line in self.process.stderr:
                self.lines.append(line.rstrip("\n"))
                match = LISTENING.search(line)
                if match and not self.url:
                    self.url = match.group(1).rstrip("/")
                    found.set()
            found.set()

        threading.Thread(target=drain, daemon=True).start()
        found.wait(timeout)
        deadline = time.monotonic() + timeout
        import httpx

        while True:
            if self.process.poll() is not None or not self.url:
                raise UserError(f"vaswani-serve did not start: {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=10).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise UserError(f"vaswani-serve not ready in {timeout:g} s: {self.output()}")
            time.sleep(0.2)

    def output(self) -> str:
        return " | ".join(self.lines[-5:]) or "no output"

    def rss_kib(self) -> int:
        """Resident memory of the server process (KiB)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text(encoding="utf-8")
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


# -- clients -------------------------------------------------------------------------------------


class Tally:
    """Outcomes and latencies of one phase."""

    def __init__(self, reference: dict[str, str] | None) -> None:
        self.reference = reference
        self.latencies: list[float] = []
        self.answered = self.refused = self.lost = self.differ = 0
        self.causes: dict[str, int] = {}

    def record(self, sentence: str, status: int | None, body: dict | None,
               seconds: float, cause: str | None = None) -> None:
        if status == 200 and body is not None and len(body.get("translations", [])) == 1:
            self.answered += 1
            self.latencies.append(seconds)
            if self.reference is not None and body["translations"][0] != self.reference.get(
                    sentence, body["translations"][0]):
                self.differ += 1
        elif status == 503:
            self.refused += 1
        else:
            self.lost += 1
            cause = cause or (f"HTTP {status}" if status is not None else "no answer")
            self.causes[cause] = self.causes.get(cause, 0) + 1

    def total(self) -> int:
        return self.answered + self.refused + self.lost

    def percentile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    def summary(self, seconds: float) -> dict:
        p50, p99 = self.percentile(0.50), self.percentile(0.99)
        total = self.total()
        return {
            "requests": total, "answered": self.answered, "refused_503": self.refused,
            "lost": self.lost, "differ": self.differ, "seconds": round(seconds, 3),
            "sentences_per_s": round(self.answered / seconds, 2) if seconds > 0 else None,
            "p50_ms": None if p50 is None else round(p50 * 1000, 1),
            "p99_ms": None if p99 is None else round(p99 * 1000, 1),
            "answered_share": round(self.answered / total, 4) if total else None,
            "refused_share": round(self.refused / total, 4) if total else None,
            "lost_causes": dict(sorted(self.causes.items())),
        }


#: The length penalties the soak's requests take in turn (the server must keep no state per
#: value: its memory is what the soak measures).
SOAK_LENPENS = [round(0.05 * i, 2) for i in range(1, 41)]


async def one_request(client, url: str, sentence: str, tally: Tally,
                      lenpen: float | None = None) -> None:
    import httpx

    started = time.perf_counter()
    body: dict = {"text": [sentence]}
    if lenpen is not None:
        body["lenpen"] = lenpen
    cause = None
    try:
        response = await client.post(url + "/translate", json=body)
        answer = response.json() if response.status_code == 200 else None
        status = response.status_code
    except (httpx.HTTPError, ValueError) as error:
        status, answer, cause = None, None, type(error).__name__
    tally.record(sentence, status, answer, time.perf_counter() - started, cause)


def wrk_closed_loop(url: str, sentences: list[str], clients: int, seconds: float,
                    workdir: Path) -> dict:
    """``clients`` connections of wrk, each sending its next request once answered, for
    ``seconds``: what :func:`closed_loop` reports, from wrk's count of statuses and socket
    errors (texts are not checked here)."""
    listing = workdir / "wrk_sentences.txt"
    listing.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    proc = subprocess.run(
        ["wrk", "-t1", f"-c{clients}", f"-d{max(1, math.ceil(seconds))}s",
         f"--timeout={max(2, math.ceil(seconds))}s", "-s", str(WRK_SCRIPT), url, "--",
         str(listing)], capture_output=True, text=True, timeout=seconds + 120, check=False)
    line = next((line for line in proc.stdout.splitlines()
                 if line.startswith("vaswani-load: ")), None)
    if proc.returncode != 0 or line is None:
        raise UserError(f"wrk failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-300:]}")
    load = json.loads(line.removeprefix("vaswani-load: "))
    statuses = {int(status): count for status, count in load["statuses"].items()}
    answered, refused = statuses.pop(200, 0), statuses.pop(503, 0)
    causes = {f"HTTP {status}": count for status, count in statuses.items()}
    causes.update({f"socket {kind}": count for kind, count in load["errors"].items() if count})
    elapsed = load["duration_us"] / 1e6
    total = answered + refused + sum(statuses.values())
    return {
        "requests": total, "answered": answered, "refused_503": refused,
        "lost": sum(causes.values()), "differ": None, "seconds": round(elapsed, 3),
        "sentences_per_s": round(answered / elapsed, 2) if elapsed > 0 else None,
        "p50_ms": round(load["p50_us"] / 1000, 1), "p99_ms": round(load["p99_us"] / 1000, 1),
        "answered_share": round(answered / total, 4) if total else None,
        "refused_share": round(refused / total, 4) if total else None,
        "lost_causes": dict(sorted(causes.items())), "load_generator": "wrk",
    }


#: Connections of the open-loop client (see :func:`open_loop`).
OPEN_LOOP_CONNECTIONS = 512


def http_client(connections: int, timeout: float):
    import httpx

    return httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(
        max_connections=connections, max_keepalive_connections=connections))


async def closed_loop(url: str, sentences: list[str], clients: int, requests: int,
                      seconds: float, reference: dict | None, timeout: float,
                      lenpens: list[float] | None = None) -> dict:
    """``clients`` clients, each sending its next request once answered (with ``lenpens``
    taken in turn, when given)."""
    tally = Tally(reference)
    counter = iter(range(requests))
    stop_at = time.perf_counter() + seconds
    async with http_client(clients, timeout) as client:

        async def worker() -> None:
            for index in counter:
                if time.perf_counter() > stop_at:
                    return
                lenpen = None if lenpens is None else lenpens[index % len(lenpens)]
                await one_request(client, url, sentences[index % len(sentences)], tally,
                                  lenpen)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    return tally.summary(elapsed)


async def open_loop(url: str, sentences: list[str], rate: float, seconds: float,
                    reference: dict | None, timeout: float) -> dict:
    """Requests sent at ``rate`` per second for ``seconds``, whether answered or not, over at
    most :data:`OPEN_LOOP_CONNECTIONS` requests in flight: enough to overflow the server's
    queue, while thousands of requests handed to the HTTP client at once made the client itself
    (one Python process beside the server on 2 cores) the bottleneck: its connection pool
    stalled at 100 % of a core with the server idle. A request's latency is counted from when
    it is sent, so a wait for its turn here is not in it (the phase's elapsed time is)."""
    tally = Tally(reference)
    count = max(1, int(rate * seconds))
    in_flight = asyncio.Semaphore(OPEN_LOOP_CONNECTIONS)

    async def send(sentence: str) -> None:
        async with in_flight:
            await one_request(client, url, sentence, tally)

    async with http_client(OPEN_LOOP_CONNECTIONS, timeout) as client:
        started = time.perf_counter()
        tasks = []
        for index in range(count):
            delay = started + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(send(sentences[index % len(sentences)])))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    summary = tally.summary(elapsed)
    summary["offered_per_s"] = round(rate, 2)
    return summary


async def reference_pass(url: str, sentences: list[str], timeout: float) -> list[str]:
    """Each sentence alone, one request at a time."""
    out = []
    async with http_client(1, timeout) as client:
        for sentence in sentences:
            response = await client.post(url + "/translate", json={"text": [sentence]})
            if response.status_code != 200:
                raise UserError(f"reference pass: HTTP {response.status_code}: "
                                f"{response.text[:200]}")
            out.append(response.json()["translations"][0])
    return out


# -- the benchmark -------------------------------------------------------------------------------


def machine() -> str:
    from user_plugin.measurement.cpu import cpu_name

    return f"{cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def throughput(url: str, sentences: list[str], clients: int, args, reference: dict,
               timeout: float) -> dict:
    """A closed-loop throughput run, by wrk or by the Python client (``--load-generator``)."""
    if args.load_generator == "wrk":
        return wrk_closed_loop(url, sentences, clients, args.seconds, args.workdir)
    return asyncio.run(closed_loop(url, sentences, clients, args.requests, args.seconds,
                                   reference, timeout))


def benchmark_backend(backend: str, model_dir: str, extra: list[str], args, sentences,
                      reference_text) -> dict:
    common = ["--threads", str(args.threads), "--max-queue", str(args.max_queue),
              "--deadline", str(args.deadline), *extra]
    timeout = args.deadline + 30
    result: dict = {"backend": backend, "model_dir": model_dir, "threads": args.threads}
    say = print
    batched = Server(model_dir, backend, common)
    try:
        say(f"[{backend}] reference pass: {len(sentences)} sentences one at a time")
        outputs = asyncio.run(reference_pass(batched.url, sentences, timeout))
        reference = dict(zip(sentences, outputs))
        if reference_text is not None:
            import sacrebleu

            result["sacrebleu"] = round(sacrebleu.corpus_bleu(
                outputs, [reference_text[:len(outputs)]]).score, 2)
        result["load_generator"] = args.load_generator
        result["batched"] = {}
        for clients in args.clients:
            say(f"[{backend}] batched, {clients} clients ({args.load_generator})")
            result["batched"][clients] = throughput(batched.url, sentences, clients, args,
                                                    reference, timeout)
        best = max(run["sentences_per_s"] or 0 for run in result["batched"].values())
        result["sustainable_per_s"] = best
        result["overload"] = {}
        for factor in (1.0, args.overload_factor):
            say(f"[{backend}] open loop at {factor:g} x {best} sentences/s")
            result["overload"][f"{factor:g}x"] = asyncio.run(open_loop(
                batched.url, sentences, max(best, 1.0) * factor, args.overload_seconds,
                reference, timeout))
        say(f"[{backend}] soak, 8 clients, {args.soak_seconds:g} s")
        warm_up = 8 if args.quick else 8 * 16  # requests before the first memory reading
        asyncio.run(closed_loop(batched.url, sentences, 8, warm_up, 60, reference, timeout))
        start_kib = batched.rss_kib()
        soak = asyncio.run(closed_loop(batched.url, sentences, 8, 10 ** 9, args.soak_seconds,
                                       None, timeout, SOAK_LENPENS))
        end_kib = batched.rss_kib()
        soak.update(rss_start_kib=start_kib, rss_end_kib=end_kib,
                    rss_growth_percent=round(100 * (end_kib - start_kib) / start_kib, 2))
        result["soak"] = soak
    finally:
        result["batched_exit_status"] = batched.stop()
    alone = Server(model_dir, backend, [*common, "--max-batch", "1", "--batch-wait-ms", "0"])
    try:
        result["one_at_a_time"] = {}
        for clients in args.clients:
            say(f"[{backend}] one request at a time, {clients} clients")
            result["one_at_a_time"][clients] = throughput(alone.url, sentences, clients, args,
                                                          reference, timeout)
    finally:
        result["one_at_a_time_exit_status"] = alone.stop()
    return result


def table(results: list[dict]) -> str:
    rows = ["| backend | clients | batched sent/s | p50 ms | p99 ms | one-at-a-time sent/s "
            "| p50 ms | p99 ms | speed-up |", "|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for clients, run in result["batched"].items():
            alone = result["one_at_a_time"][clients]
            ratio = (run["sentences_per_s"] / alone["sentences_per_s"]
                     if run["sentences_per_s"] and alone["sentences_per_s"] else float("nan"))
            rows.append(f"| {result['backend']} | {clients} | {run['sentences_per_s']} | "
                        f"{run['p50_ms']} | {run['p99_ms']} | {alone['sentences_per_s']} | "
                        f"{alone['p50_ms']} | {alone['p99_ms']} | {ratio:.2f}x |")
    rows += ["", "| backend | offered | answered | 503 | lost | differ | p99 ms |",
             "|---|---|---|---|---|---|---|"]
    for result in results:
        for name, run in result["overload"].items():
            rows.append(f"| {result['backend']} | {name} ({run['offered_per_s']}/s) | "
                        f"{run['answered_share']} | {run['refused_share']} | {run['lost']} | "
                        f"{run['differ']} | {run['p99_ms']} |")
    rows += ["", "| backend | soak s | requests | lost | RSS start MiB | RSS end MiB | growth |",
             "|---|---|---|---|---|---|---|"]
    for result in results:
        soak = result["soak"]
        rows.append(f"| {result['backend']} | {soak['seconds']} | {soak['requests']} | "
                    f"{soak['lost']} | {soak['rss_start_kib'] / 1024:.1f} | "
                    f"{soak['rss_end_kib'] / 1024:.1f} | {soak['rss_growth_percent']} % |")
    return "\n".join(rows)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--fairseq", help="a model directory (the exact decoder)")
    parser.add_argument("--fairseq-args", default="",
                        help="more vaswani-serve options for it, e.g. '--source-lang en "
                        "--target-lang de'")
    parser.add_argument("--ctranslate2", help="a CTranslate2 export directory")
    parser.add_argument("--ctranslate2-args", default="")
    parser.add_argument("--sentences", required=True, help="raw source sentences, one a line")
    parser.add_argument("--reference", help="their reference translations (sacreBLEU)")
    parser.add_argument("--limit", type=int, default=1000, help="sentences of the file used")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clients", default="1,8,64")
    parser.add_argument("--requests", type=int, default=2000, help="per throughput run")
    parser.add_argument("--seconds", type=float, default=120, help="per throughput run, at most")
    parser.add_argument("--max-queue", type=int, default=256,
                        help="the servers' --max-queue (sentences)")
    parser.add_argument("--deadline", type=float, default=30.0)
    parser.add_argument("--overload-factor", type=float, default=4.0)
    parser.add_argument("--overload-seconds", type=float, default=30.0)
    parser.add_argument("--soak-seconds", type=float, default=600.0)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, to check that it works (figures mean nothing)")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--load-generator", choices=("wrk", "python"),
                        help="what drives the throughput runs (default: wrk where installed)")
    args = parser.parse_args(argv)
    if args.load_generator is None:
        args.load_generator = "wrk" if shutil.which("wrk") else "python"
    elif args.load_generator == "wrk" and not shutil.which("wrk"):
        parser.error("--load-generator wrk: wrk is not installed (apt-get install wrk)")
    if not args.fairseq and not args.ctranslate2:
        parser.error("give --fairseq MODEL_DIR, --ctranslate2 EXPORT_DIR or both")
    if args.quick:
        args.limit, args.clients, args.requests, args.seconds = 6, "1,4", 8, 20
        if args.load_generator == "wrk":
            args.seconds = 2
        args.overload_seconds, args.soak_seconds = 0.5, 2.0
    try:
        args.clients = [int(c) for c in args.clients.split(",")]
    except ValueError:
        parser.error(f"--clients: a comma-separated list of integers, got {args.clients!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise UserError("needs httpx: pip install -e '.[test]'") from None
    sentences = [line for line in iter_lines(args.sentences) if line.strip()][:args.limit]
    if not sentences:
        raise UserError(f"{args.sentences}: no sentences")
    reference_text = (None if args.reference is None
                      else list(iter_lines(args.reference))[:len(sentences)])
    print(f"machine: {machine()}")
    if args.load_generator == "python":
        print("note: wrk is not installed: the Python client drives the throughput runs, on "
              "the cores it measures")
    results = []
    workdir = tempfile.TemporaryDirectory(prefix="benchmark_serving.")
    args.workdir = Path(workdir.name)
    for backend, directory, extra in (("fairseq", args.fairseq, args.fairseq_args),
                                      ("ctranslate2", args.ctranslate2, args.ctranslate2_args)):
        if directory:
            results.append(benchmark_backend(backend, directory, shlex.split(extra), args,
                                             sentences, reference_text))
            if args.json_out:  # each backend's figures kept as soon as they are measured
                atomic_write_text(args.json_out, json.dumps(
                    {"machine": machine(), "quick": args.quick, "results": results},
                    indent=1) + "\n")
    print(table(results))
    for result in results:
        if "sacrebleu" in result:
            print(f"{result['backend']}: sacreBLEU {result['sacrebleu']}")
    best = {r["backend"]: max(run["sentences_per_s"] or 0 for run in r["batched"].values())
            for r in results}
    if best.get("fairseq") and "ctranslate2" in best:
        print(f"ctranslate2 / fairseq, best batched sentences/s: "
              f"{best['ctranslate2'] / best['fairseq']:.2f}x")
    report = {"machine": machine(), "quick": args.quick, "results": results}
    if args.json_out:
        atomic_write_text(args.json_out, json.dumps(report, indent=1) + "\n")
    failed = [f"{r['backend']} ({name})" for r in results
              for name in ("batched_exit_status", "one_at_a_time_exit_status") if r[name] != 0]
    if failed:
        raise UserError(f"a server did not exit 0 after SIGTERM: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, PROG))
