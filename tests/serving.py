"""Helpers of the tests of ``vaswani-serve``: a server process on a free loopback port, and
plain HTTP calls to it (the standard library's client, so that a test controls every byte and
every connection)."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import forked_cli
from cli import REPO, command, fairseq_env

LISTENING = re.compile(r"vaswani-serve: listening on (http://\S+)")


@dataclass
class Answer:
    status: int
    headers: dict
    body: bytes

    @property
    def json(self):
        return json.loads(self.body)


@dataclass
class ServerProcess:
    """A ``vaswani-serve`` process; ``stderr`` collects its lines as they come."""

    process: subprocess.Popen
    url: str = ""
    stderr: list = field(default_factory=list)

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname, parts.port

    def request(self, method: str, path: str, body=None, timeout: float = 300,
                headers: dict | None = None) -> Answer:
        return request(self.address, method, path, body, timeout, headers)

    def stop(self, timeout: float = 120) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(timeout=timeout)


def request(address: tuple[str, int], method: str, path: str, body=None, timeout: float = 300,
            headers: dict | None = None) -> Answer:
    """One HTTP request on a new connection; ``body`` is bytes, or JSON-encoded."""
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode("utf-8")
    connection = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers={
            "Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                      response.read())
    finally:
        connection.close()


def start_server(model_dir, *args: str, timeout: float = 600) -> ServerProcess:
    """``vaswani-serve MODEL_DIR --port 0 ARGS`` started and waited for until ready (its
    ``/health`` says so); an AssertionError with its output if it stops first."""
    process = subprocess.Popen(
        [*command("serve"), str(model_dir), "--host", "127.0.0.1", "--port", "0", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=fairseq_env())
    server = ServerProcess(process)
    found = threading.Event()

    def drain() -> None:
        for line in process.stderr:
            server.stderr.append(line.rstrip("\n"))
            match = LISTENING.search(line)
            if match and not server.url:
                server.url = match.group(1)
                found.set()
        found.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + timeout
    found.wait(timeout)
    while True:
        if process.poll() is not None or not server.url:
            process.wait(timeout=60)
            raise AssertionError(f"vaswani-serve stopped ({process.returncode}):\n"
                                 + "\n".join(server.stderr))
        try:
            if server.request("GET", "/health", timeout=10).status == 200:
                return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise AssertionError("vaswani-serve not ready in time:\n" + "\n".join(server.stderr))
        time.sleep(0.2)


def hub_model_dir(trained, directory):
    """``directory`` made a hub model directory (as tests/test_hub.py builds one) of the
    ``trained_multi30k`` model ``trained``: its last checkpoint and the two dictionaries."""
    directory.mkdir(parents=True)
    os.symlink(trained.checkpoint_dir / "checkpoint_last.pt", directory / "model.pt")
    for lang in ("en", "de"):
        os.symlink(trained.data_bin / f"dict.{lang}.txt", directory / f"dict.{lang}.txt")
    return directory


def ctranslate2_export(trained, output, *args: str):
    """The CTranslate2 export of ``trained``'s last checkpoint, written by the command line."""
    proc = forked_cli.run(
        [sys.executable, "-m", "user_plugin.export",
         str(trained.checkpoint_dir / "checkpoint_last.pt"), "--data-dir", str(trained.data_bin),
         "--to", "ctranslate2", "--output", str(output), *args],
        env={**fairseq_env(), "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return output
