"""Helpers of the tests of ``vaswani-serve``: a server process on a free loopback port, and
plain HTTP calls to it (the standard library's client, so that a test controls every byte and
every connection)."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cli import command, fairseq_env

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
