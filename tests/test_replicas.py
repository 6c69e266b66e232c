"""``vaswani-serve`` replicas behind a real load balancer (nginx, Debian's package), configured
by ``examples/serving/nginx.conf``: a rolling restart of one replica in the middle of a burst
loses no request, every answer is the right translation, given once, and every answer names
the same model fingerprint. Skipped, with the reason, where nginx is not installed
(scripts/run_tests.sh installs it where it can)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import MULTI30K, REPO, require_data
from serving import hub_model_dir, request, start_server

TEMPLATE = REPO / "examples" / "serving" / "nginx.conf"
LANGS = ["--source-lang", "en", "--target-lang", "de"]
#: Requests of the burst, and the clients sending them.
REQUESTS, CLIENTS = 48, 6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def nginx_config(prefix, listen: int, replicas: list[int]) -> str:
    """The example configuration with its placeholders filled for loopback replicas."""
    servers = "\n        ".join(f"server 127.0.0.1:{port} max_fails=1 fail_timeout=2s;"
                                for port in replicas)
    text = TEMPLATE.read_text(encoding="utf-8")
    text = text.replace("@PREFIX@", str(prefix)).replace("@LISTEN@", str(listen))
    text = text.replace("@SERVERS@", servers)
    # as root, nginx's workers would run as nobody, who cannot write in this test's directory
    return ("user root;\n" if os.geteuid() == 0 else "") + text


@pytest.fixture(scope="module")
def nginx():
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.skip("nginx is not installed (apt-get install nginx; scripts/run_tests.sh tries)")
    return found


def test_a_rolling_restart_behind_nginx_loses_nothing(nginx, trained_multi30k, tmp_path):
    require_data(MULTI30K)
    model_dir = hub_model_dir(trained_multi30k, tmp_path / "modèle")
    sentences = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").split("\n")
    bodies = [{"text": sentences[2 * i:2 * i + 2]} for i in range(REQUESTS)]
    ports = [free_port(), free_port()]
    replicas = [start_server(model_dir, *LANGS, "--port", str(port)) for port in ports]
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    listen = free_port()
    (prefix / "nginx.conf").write_text(nginx_config(prefix, listen, ports), encoding="utf-8")
    balancer = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    address = ("127.0.0.1", listen)
    answered = []
    restarted = threading.Event()
    try:
        for _ in range(200):
            try:
                if request(address, "GET", "/health", timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        assert balancer.poll() is None, balancer.stderr.read()
        # the answers each request must get: a replica alone, before the burst
        expected = [request(replicas[1].address, "POST", "/translate", body).json
                    for body in bodies]

        def send(index: int):
            answer = request(address, "POST", "/translate", bodies[index], timeout=120)
            answered.append(index)
            return answer

        def roll() -> None:
            while len(answered) < REQUESTS // 4:
                time.sleep(0.01)
            replicas[0].process.send_signal(signal.SIGTERM)
            assert replicas[0].process.wait(timeout=120) == 0, "\n".join(replicas[0].stderr)
            replicas[0] = start_server(model_dir, *LANGS, "--port", str(ports[0]))
            restarted.set()

        roller = threading.Thread(target=roll)
        roller.start()
        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(pool.map(send, range(REQUESTS)))
        roller.join(timeout=300)
    finally:
        balancer.terminate()
        balancer.wait(timeout=60)
        for replica in replicas:
            replica.stop()
    assert restarted.is_set(), "the replica was not restarted during the burst"
    assert sorted(answered) == list(range(REQUESTS))  # each request answered, once
    for answer, want in zip(answers, expected):
        assert answer.status == 200, answer.body
        assert answer.json == want
    fingerprints = {answer.headers["x-model-fingerprint"] for answer in answers}
    assert fingerprints == {expected[0]["model"]}
