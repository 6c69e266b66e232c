"""vaswani-serve (user_plugin/serving, commands/serve.py) on a model trained by the real
fairseq-train (``trained_multi30k``): the same outputs as vaswani-translate over the Multi30k
test set on both backends, dynamic batching that gives each client exactly its own answers,
the limits and their answers, a shutdown that loses no accepted request, and the page in a real
headless Chromium."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import forked_cli
import pytest
from browser import Chromium
from cli import REPO, fairseq_env
from conftest import MULTI30K, require_data
from serving import ctranslate2_export, hub_model_dir, request, start_server

from user_plugin.serving.limits import Limits

#: Raw Multi30k test sentences compared with vaswani-translate (of 1000; the tiny model decodes
#: about as fast as the CI allows).
SENTENCES = 150
#: Lines as a text stream may hold them: empty, blank, NUL, CR, U+2028, a byte-order mark inside.
ODD_LINES = ["", "   ", "A dog\x00 runs on the beach.", "A man\rrides a horse.",
             "Two women\u2028talk in a park.", "A girl \ufeffplays with a ball."]
LANGS = ["--source-lang", "en", "--target-lang", "de"]


@pytest.fixture(scope="module")
def model_dir(trained_multi30k, tmp_path_factory):
    """A hub model directory at a path with a space and a non-ASCII letter."""
    return hub_model_dir(trained_multi30k, tmp_path_factory.mktemp("serve") / "modèle servi")


@pytest.fixture(scope="module")
def raw_lines() -> list[str]:
    raw = (require_data(MULTI30K) / "test_2016_flickr.en").read_text(encoding="utf-8")
    return raw.split("\n")[:SENTENCES] + ODD_LINES


@pytest.fixture(scope="module")
def server(model_dir):
    """One vaswani-serve process for the module (the idle decoder waits 50 ms for a batch)."""
    process = start_server(model_dir, *LANGS, "--batch-wait-ms", "50")
    yield process
    assert process.stop() == 0, "\n".join(process.stderr)


def translate_command(model_dir, lines: list[str], *args: str) -> list[str]:
    """vaswani-translate's output lines for ``lines`` on standard input."""
    proc = forked_cli.run(
        [sys.executable, "-m", "user_plugin.hub", str(model_dir), *args],
        input="\n".join(lines).encode("utf-8") + b"\n", capture_output=True, timeout=900,
        env={**fairseq_env(), "PYTHONPATH": str(REPO)}, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return proc.stdout.decode("utf-8").split("\n")[:-1]


def served(server, lines: list[str], **options) -> list:
    """The server's translations of ``lines``, sent in requests of at most 256 sentences."""
    out = []
    for start in range(0, len(lines), Limits().max_sentences):
        answer = server.request("POST", "/translate",
                                {"text": lines[start:start + 256], **options})
        assert answer.status == 200, answer.body
        assert answer.headers["x-model-fingerprint"] == answer.json["model"]
        out.extend(answer.json["translations"])
    return out


# -- the same outputs as vaswani-translate -------------------------------------------------------


def test_same_outputs_as_vaswani_translate(server, model_dir, raw_lines):
    expected = translate_command(model_dir, raw_lines, *LANGS)
    assert len(expected) == len(raw_lines)
    assert served(server, raw_lines) == expected
    assert sum(bool(line) for line in expected) >= SENTENCES  # real translations, not blanks

    best = translate_command(model_dir, raw_lines[:12], *LANGS, "--nbest", "3", "--beam", "5")
    lists = served(server, raw_lines[:12], nbest=3, beam=5)
    assert [text for per_line in lists for text in per_line] == best
    assert all(len(per_line) == 3 for per_line in lists)


@pytest.fixture(scope="module")
def ct2_export(trained_multi30k, tmp_path_factory):
    pytest.importorskip("ctranslate2",
                        reason="ctranslate2 is not installed (the test extra has it)")
    return ctranslate2_export(trained_multi30k, tmp_path_factory.mktemp("serve_ct2") / "ct2 export")


def test_ctranslate2_backend_same_outputs_as_vaswani_translate(ct2_export, raw_lines):
    lines = raw_lines[:100] + ODD_LINES
    expected = translate_command(ct2_export, lines, "--backend", "ctranslate2")
    process = start_server(ct2_export, "--backend", "ctranslate2", "--threads", "1")
    try:
        assert served(process, lines) == expected
        model = process.request("GET", "/model").json
        assert model["backend"] == "ctranslate2" and model["attention"] is False
        refused = process.request("POST", "/attention", {"text": "A dog runs."})
        assert refused.status == 501 and "--backend fairseq" in refused.json["error"]
    finally:
        assert process.stop() == 0, "\n".join(process.stderr)


def test_model_fingerprint_is_the_content(server, model_dir):
    from user_plugin.serving.served_model import ModelSettings, ServedModel

    described = server.request("GET", "/model")
    model = described.json
    assert described.headers["x-model-fingerprint"] == model["fingerprint"]
    assert (model["source_lang"], model["target_lang"], model["backend"]) == ("en", "de",
                                                                              "fairseq")
    identity = model["identity"]
    assert identity["checkpoints"] == [
        hashlib.sha256((model_dir / "model.pt").read_bytes()).hexdigest()]
    canonical = json.dumps(identity, sort_keys=True, ensure_ascii=False).encode("utf-8")
    assert model["fingerprint"] == hashlib.sha256(canonical).hexdigest()
    # a copy under another name is the same model; another checkpoint is not
    copy = model_dir.parent / "copy"
    shutil.copytree(model_dir, copy)
    settings = ModelSettings(copy, source_lang="en", target_lang="de")
    assert ServedModel.load(settings).fingerprint == model["fingerprint"]
    (copy / "model.pt").unlink()
    earlier = sorted((model_dir / "model.pt").resolve().parent.glob("checkpoint_*_*.pt"))[0]
    shutil.copy(earlier, copy / "model.pt")
    assert ServedModel.load(settings).fingerprint != model["fingerprint"]


# -- dynamic batching ---------------------------------------------------------------------------


def test_concurrent_requests_are_batched_and_each_gets_its_own_answers(server, raw_lines):
    requests = []
    for i in range(24):
        start = (i * 5) % SENTENCES
        body = {"text": raw_lines[start:start + 1 + i % 4]}
        if i % 3 == 0:
            body["nbest"] = 2
        if i % 5 == 0:
            body["beam"] = 3
        requests.append(body)
    alone = [server.request("POST", "/translate", body).json["translations"]
             for body in requests]
    before = server.request("GET", "/health").json
    answers: list = [None] * len(requests)
    barrier = threading.Barrier(len(requests))

    def client(index: int) -> None:
        barrier.wait()
        answers[index] = server.request("POST", "/translate", requests[index])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert all(answer.status == 200 for answer in answers)
    assert [answer.json["translations"] for answer in answers] == alone
    after = server.request("GET", "/health").json
    assert after["requests"] - before["requests"] == len(requests)
    assert after["batches"] - before["batches"] < len(requests)  # some decoded together
    assert after["largest_batch"] > 1


# -- bad input and limits -----------------------------------------------------------------------


@pytest.mark.parametrize("body, status, says", [
    (b'{"text": ["A dog \xff runs."]}', 422, "body: not valid UTF-8 text (byte 17)"),
    (b'{"text": ["A dog runs."]', 422, "body: not JSON"),
    (b'', 422, "body: not JSON"),
    (b'["A dog runs."]', 422, "body: expected a JSON object, got a list"),
    (b'{"sentences": ["A dog runs."]}', 422, "sentences: unknown field"),
    (b'{"beam": 4}', 422, "text: missing"),
    (b'{"text": "A dog runs."}', 422, "text: expected a list of strings, got a string"),
    (b'{"text": ["A dog runs.", 7]}', 422, "text[1]: expected a string, got a number"),
    (b'{"text": ["\\ud800 A dog runs."]}', 422, "text[0]: not valid Unicode text"),
    (b'{"text": ["A dog runs."], "beam": "4"}', 422, "beam: expected an integer, got a string"),
    (b'{"text": ["A dog runs."], "beam": 0}', 422, "beam: must be between 1 and 16, got 0"),
    (b'{"text": ["A dog runs."], "beam": 17}', 422, "beam: must be between 1 and 16, got 17"),
    (b'{"text": ["A dog runs."], "beam": 2.5}', 422, "beam: expected an integer"),
    (b'{"text": ["A dog runs."], "beam": true}', 422, "beam: expected an integer, got a boolean"),
    (b'{"text": ["A dog runs."], "nbest": 5}', 422, "nbest: must be between 1 and 4, got 5"),
    (b'{"text": ["A dog runs."], "lenpen": NaN}', 422, "body: not JSON (NaN is not a JSON"),
    (b'{"text": ["A dog runs."], "lenpen": 1e999}', 422, "lenpen: must be a number from 0 to 10"),
    (b'{"text": ["A dog runs."], "lenpen": 1000}', 422, "lenpen: must be a number from 0 to 10"),
    (b'{"text": ["A dog runs."], "lenpen": -0.5}', 422, "lenpen: must be a number from 0 to 10"),
    (b'{"text": ["A dog runs."], "lenpen": null}', 422, "lenpen: expected a number, got null"),
    (json.dumps({"text": ["x"] * 257}).encode(), 413, "text: 257 sentences, more than the 256"),
    (b'{"text": ["A dog runs."], "beam": ' + b"9" * 5000 + b"}", 422,
     "body: an integer of 5000 digits"),
    (b'{"text": ["A dog runs."], "x": ' + b"[" * 100000 + b"]" * 100000 + b"}", 422,
     "body: JSON nested too deeply"),
    (b'{"text": ["' + b"a" * (1 << 20) + b'"]}', 413, "body: "),
    (b'{"text": ["A dog runs."], "text": ["A cat."]}', 422,
     "text: given twice in one object (each field once)"),
])
def test_bad_requests_get_one_line_naming_the_field(server, body, status, says):
    answer = server.request("POST", "/translate", body)
    assert answer.status == status, answer.body
    error = answer.json["error"]
    assert error.startswith(says) and "\n" not in error


def test_utf8_byte_order_mark_nul_and_empty_list(server):
    plain = server.request("POST", "/translate", {"text": ["A dog runs."]}).json
    marked = server.request("POST", "/translate", b"\xef\xbb\xbf" + json.dumps(
        {"text": ["A dog runs."]}).encode())
    assert marked.status == 200 and marked.json == plain
    empty = server.request("POST", "/translate", {"text": []})
    assert empty.status == 200 and empty.json["translations"] == []


def test_routes_and_methods(server):
    assert server.request("GET", "/translate").status == 405
    assert server.request("GET", "/nowhere").status == 404
    health = server.request("GET", "/health")
    assert health.status == 200 and health.json["status"] == "ready"
    page = server.request("GET", "/")
    assert page.status == 200 and b"<canvas" in page.body
    assert server.request("GET", "/static/page.js").status == 200


def test_attention_rows_are_distributions(server):
    answer = server.request("POST", "/attention", {"text": "A dog runs on the beach."})
    assert answer.status == 200, answer.body
    result = answer.json
    assert result["source_tokens"][-1] == "</s>" and result["target_tokens"][-1] == "</s>"
    assert (result["layers"], result["heads"]) == (2, 4)  # TINY_MODEL_ARGS
    translation = server.request("POST", "/translate", {"text": ["A dog runs on the beach."]})
    assert result["translation"] == translation.json["translations"][0]
    for layer in result["weights"]:
        for head in layer:
            assert len(head) == len(result["target_tokens"])
            for row in head:
                assert len(row) == len(result["source_tokens"])
                assert sum(row) == pytest.approx(1.0, abs=1e-3)
    refused = server.request("POST", "/attention", {"text": "   "})
    assert refused.status == 422 and refused.json["error"].startswith("text: empty")
    from user_plugin.modules.attention_maps import MAX_DRAWN_TOKENS

    # every layer's and head's map of a long sentence would be tens of megabytes of JSON
    long = " ".join(["dog"] * MAX_DRAWN_TOKENS)
    refused = server.request("POST", "/attention", {"text": long})
    assert refused.status == 422, refused.body
    error = refused.json["error"]
    tokens = int(error.split()[1])  # "dog" may be more than one subword
    assert tokens > MAX_DRAWN_TOKENS and error == (
        f"text: {tokens} model tokens (with EOS), more than the {MAX_DRAWN_TOKENS} whose "
        "attention is drawn: give a shorter sentence (POST /translate takes it)")


# -- limits that need a busy or slow decoder: a real model, in-process servers -------------------


@pytest.fixture(scope="module")
def loaded_model(model_dir):
    from user_plugin.serving.served_model import ModelSettings, ServedModel

    return ServedModel.load(ModelSettings(model_dir, source_lang="en", target_lang="de"))


@contextlib.contextmanager
def in_process_server(model, connections: dict | None = None, **limits):
    """uvicorn serving ``model`` with ``limits`` in a thread of this process, configured as
    ``vaswani-serve`` configures it (``connections``: its ``max_connections`` and
    ``header_timeout``)."""
    import uvicorn

    from user_plugin.serving.app import Service, create_app
    from user_plugin.serving.served_model import DecodingOptions
    from user_plugin.serving.server import bind, uvicorn_config

    sock = bind("127.0.0.1", 0)
    address = sock.getsockname()[:2]
    service = Service(lambda: model, Limits(**limits), DecodingOptions())
    server = uvicorn.Server(uvicorn_config(create_app(service), **(connections or {})))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(600):
            with contextlib.suppress(OSError):
                if request(address, "GET", "/health", timeout=5).status == 200:
                    break
            time.sleep(0.05)
        yield address, service
    finally:
        server.should_exit = True
        thread.join(timeout=120)


def wait_until(condition, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_full_queue_answers_503_with_retry_after_at_once(loaded_model):
    four = {"text": ["A dog runs.", "A cat sleeps.", "Two men talk.", "A girl sings."]}
    with in_process_server(loaded_model, max_queue=4, max_sentences=4,
                           batch_wait=2.0) as (address, service):
        first: dict = {}
        waiting = threading.Thread(target=lambda: first.update(
            answer=request(address, "POST", "/translate", four)))
        waiting.start()
        wait_until(lambda: service.batcher.queued_sentences == 4, "the first request queued")
        refused = request(address, "POST", "/translate", {"text": ["One more."]})
        assert refused.status == 503
        assert "queue is full" in refused.json["error"]
        assert int(refused.headers["retry-after"]) >= 1
        assert "answer" not in first  # refused while the first still waits: never a hang
        waiting.join(timeout=120)
        assert first["answer"].status == 200
        assert first["answer"].json["translations"] == loaded_model.translate(
            four["text"], service.defaults)


def test_a_request_expected_past_half_its_deadline_is_refused_at_once(loaded_model):
    """The queue is measured in seconds of work: at a measured rate of 1 sentence/s and a
    deadline of 4 s, a request of 3 sentences would take 3 s, more than the 2 s it may wait:
    503 at once with Retry-After; at a rate that allows it, it is answered."""
    three = {"text": ["A dog runs.", "A cat sleeps.", "Two men talk."]}
    with in_process_server(loaded_model, deadline=4.0) as (address, service):
        service.batcher.stats.rate = 1.0  # as if measured
        started = time.monotonic()
        refused = request(address, "POST", "/translate", three)
        assert refused.status == 503 and time.monotonic() - started < 1.5
        assert refused.json["error"] == (
            "the server is busy: this request would be answered in about 3.0 s, more than "
            "the 2 s a request may wait (half its deadline): retry later")
        assert refused.headers["retry-after"] == "1"
        assert service.batcher.stats.requests == 0
        service.batcher.stats.rate = 100.0
        assert request(address, "POST", "/translate", three).status == 200


def test_deadline_answers_504_and_frees_the_queue(loaded_model):
    with in_process_server(loaded_model, deadline=0.001, batch_wait=0.5) as (address, service):
        answer = request(address, "POST", "/translate", {"text": ["A dog runs."]})
        assert answer.status == 504 and "deadline of 0.001 s" in answer.json["error"]
        assert service.batcher.queued_sentences == 0


def test_a_body_that_never_arrives_is_408_at_the_deadline(loaded_model):
    with in_process_server(loaded_model, deadline=0.5) as (address, service):
        with socket.create_connection(address, timeout=60) as client:
            client.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                           b"\r\n{\"text\": [")
            answer = b""
            while b'"}' not in answer:
                chunk = client.recv(65536)
                assert chunk, answer
                answer += chunk
            answer = answer.decode()
        assert answer.startswith("HTTP/1.1 408")
        assert "body: not received within the deadline of 0.5 s" in answer


def test_a_connection_flood_gets_503_at_once_and_a_stalled_header_is_closed(loaded_model):
    """Past ``max_connections`` open at once, uvicorn answers 503 at once (``/health`` too)
    instead of letting the flood stall everyone; a client that sends half a header block (or
    nothing) is closed after ``header_timeout`` (before: still open after 45 s)."""
    with in_process_server(loaded_model, {"max_connections": 3, "header_timeout": 0.5}) \
            as (address, service):
        flood = []
        try:
            for _ in range(2):  # with the next connection, 3 are open
                flood.append(socket.create_connection(address, timeout=30))
                flood[-1].sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                  b"50\r\n\r\n{")  # a body that never ends: holds its slot
                time.sleep(0.2)
            wait_until(lambda: request(address, "GET", "/health", timeout=5).status == 503,
                       "the flood to fill the connections", timeout=30)
            started = time.monotonic()
            answer = request(address, "GET", "/health", timeout=5)
            assert answer.status == 503 and time.monotonic() - started < 2
        finally:
            for client in flood:
                client.close()
        wait_until(lambda: request(address, "GET", "/health", timeout=5).status == 200,
                   "the connections freed", timeout=30)
        with socket.create_connection(address, timeout=30) as stalled:
            stalled.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: half
            started = time.monotonic()
            assert stalled.recv(1024) == b""  # closed by the server, without an answer
            assert 0.3 < time.monotonic() - started < 10


def test_a_client_that_disconnects_frees_its_slot(loaded_model):
    four = {"text": ["A dog runs.", "A cat sleeps.", "Two men talk.", "A girl sings."]}
    with in_process_server(loaded_model, max_queue=4, max_sentences=4,
                           batch_wait=3.0) as (address, service):
        body = json.dumps(four).encode()
        client = socket.create_connection(address, timeout=30)
        client.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                       b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_until(lambda: service.batcher.queued_sentences == 4, "the request queued")
        client.close()
        wait_until(lambda: service.batcher.queued_sentences == 0, "the slot freed")
        assert service.batcher.stats.requests == 0  # taken out before it was decoded
        again = request(address, "POST", "/translate", four)
        assert again.status == 200


def test_a_batch_stays_one_decode_whatever_lenpens_and_an_over_long_sentence(loaded_model):
    """Requests asking for many ``lenpen`` values, one holding a sentence longer than the
    model's positions: before, the over-long one sent the batch to one decode per request, and
    each lenpen was a decode of its own and a generator kept for ever. Now the over-long request
    alone is refused, the rest is one decode, each sentence with its own alpha (the same
    translations as decoded alone), and no generator is added per alpha."""
    from user_plugin.serving.served_model import DecodingOptions

    too_long = " ".join(["dog"] * 1100)
    texts = [["A dog runs.", "A man sits."], ["A cat sleeps."], ["Two men talk."],
             ["A girl sings.", "A boy runs."], ["Three dogs play."], ["A woman reads."]]
    bodies = [{"text": text, "lenpen": 0.1 + 0.37 * i} for i, text in enumerate(texts)]
    bodies.insert(2, {"text": ["A dog runs.", too_long], "lenpen": 1.5})
    kept = loaded_model.translator.generators_kept
    with in_process_server(loaded_model, batch_wait=2.0) as (address, service):
        answers: list = [None] * len(bodies)
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(
            i, request(address, "POST", "/translate", bodies[i]))) for i in range(len(bodies))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert answers[2].status == 422
        assert answers[2].json["error"].startswith("sentence 2 has 1101 tokens")
        stats = service.batcher.stats
        assert (stats.batches, stats.decodes, stats.largest_batch) == (1, 1, len(bodies))
    assert loaded_model.translator.generators_kept <= max(kept, 1)
    for answer, body in zip(answers, bodies):
        if body["text"][-1] != too_long:
            assert answer.status == 200
            assert answer.json["translations"] == loaded_model.translate(
                body["text"], DecodingOptions(lenpen=body["lenpen"]))
    assert loaded_model.translator.generators_kept <= max(kept, 1)


def test_per_sentence_alphas_score_as_each_alone(loaded_model):
    """One hub call with an alpha per sentence gives each sentence the hypotheses and scores of
    a call with its alpha alone (the GNMT penalty divides each finished hypothesis)."""
    translator = loaded_model.translator
    lines = translator.model_tokens(["A dog runs on the grass.", "Two men talk.", "A cat."])
    alphas = [0.0, 2.0, 0.6]
    together = translator.translate_tokens(lines, nbest=2, lenpen=alphas)
    for line, alpha, got in zip(lines, alphas, together):
        alone = translator.translate_tokens([line], nbest=2, lenpen=alpha)[0]
        assert [h["tokens"] for h in got] == [h["tokens"] for h in alone]
        assert [h["score"] for h in got] == pytest.approx([h["score"] for h in alone], abs=1e-5)
    assert together[0][0]["score"] != pytest.approx(
        translator.translate_tokens(lines[:1], lenpen=2.0)[0][0]["score"])


# -- shutdown -----------------------------------------------------------------------------------


def test_sigterm_answers_every_accepted_request_then_exits_0(model_dir, raw_lines):
    process = start_server(model_dir, *LANGS, "--batch-wait-ms", "5000")
    bodies = [{"text": raw_lines[i * 3:i * 3 + 3]} for i in range(12)]
    total = sum(len(body["text"]) for body in bodies)
    answers: list = [None] * len(bodies)

    def client(index: int) -> None:
        try:
            answers[index] = process.request("POST", "/translate", bodies[index])
        except OSError as error:
            answers[index] = error

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    try:
        for thread in threads:
            thread.start()

        def all_accepted() -> bool:
            health = process.request("GET", "/health").json
            return (health["queued_sentences"] + health["decoding_sentences"]
                    + health["sentences"]) == total

        wait_until(all_accepted, "the burst to be accepted")
        process.process.send_signal(signal.SIGTERM)

        def refused() -> bool:  # no new connection once the signal is handled
            try:
                socket.create_connection(process.address, timeout=5).close()
            except (ConnectionRefusedError, ConnectionResetError):
                # reset: the listening socket closed while this connection was in its backlog
                return True
            return False

        wait_until(refused, "new connections to be refused", timeout=60)
        assert any(answer is None for answer in answers)  # refused while the burst waits
        for thread in threads:
            thread.join(timeout=300)
        assert process.process.wait(timeout=120) == 0, "\n".join(process.stderr)
    finally:
        process.stop()
    for answer, body in zip(answers, bodies):
        assert not isinstance(answer, Exception), answer
        assert answer.status == 200 and len(answer.json["translations"]) == len(body["text"])
    expected = translate_command(model_dir, [line for body in bodies for line in body["text"]],
                                 *LANGS)
    assert [t for answer in answers for t in answer.json["translations"]] == expected
    assert process.stderr[-1] == "vaswani-serve: stopped: every accepted request was answered"


def test_a_second_stop_signal_ends_the_server_at_once_with_one_line(model_dir, raw_lines):
    """A request waits in the queue; Ctrl-C starts the graceful stop (which waits for it), a
    second Ctrl-C ends the process at once: one line and status 130, no traceback."""
    process = start_server(model_dir, *LANGS, "--batch-wait-ms", "20000")
    answers: list = []

    def client() -> None:
        try:
            answers.append(process.request("POST", "/translate", {"text": raw_lines[:3]}))
        except OSError as error:
            answers.append(error)

    thread = threading.Thread(target=client)
    try:
        thread.start()
        wait_until(lambda: process.request("GET", "/health").json["queued_sentences"] == 3,
                   "the request to queue")
        process.process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        process.process.send_signal(signal.SIGINT)
        assert process.process.wait(timeout=60) == 128 + signal.SIGINT
        thread.join(timeout=60)
        wait_until(lambda: any("forced to stop" in line for line in process.stderr),
                   "the line", timeout=10)
    finally:
        process.stop()
    assert process.stderr[-1] == ("vaswani-serve: forced to stop: requests still queued or "
                                  "being decoded get no answer")
    assert not any("Traceback" in line for line in process.stderr)
    assert answers and isinstance(answers[0], OSError)  # its connection ended unanswered


def test_command_errors_are_one_line(model_dir, tmp_path):
    from cli import command

    def run(*args: str) -> subprocess.CompletedProcess:
        return forked_cli.run([*command("serve"), *args], capture_output=True, text=True,
                              env=fairseq_env(), timeout=600, check=False)

    missing = run(str(tmp_path / "nowhere"), "--port", "0")
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        f"vaswani-serve: error: {tmp_path / 'nowhere'}: no such file or directory (a model "
        "package, a checkpoint with --data-dir, or a CTranslate2 export)"]
    # a model that cannot be loaded: the server stops, one line, status 1
    unusable = run(str(model_dir), "--port", "0")  # no --source-lang: two dictionaries
    assert unusable.returncode == 1
    last = unusable.stderr.strip().splitlines()[-1]
    assert last.startswith("vaswani-serve: error:") and "language pair" in last
    assert "Traceback" not in unusable.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = run(str(model_dir), "--port", str(taken.getsockname()[1]))
    assert busy.returncode == 1 and busy.stderr.strip().startswith(
        "vaswani-serve: error: cannot listen on 127.0.0.1:")
    bad_limits = run(str(model_dir), "--max-sentences", "2000")
    assert bad_limits.returncode == 1 and "max_queue" in bad_limits.stderr
    # options that contradict each other, and a device this machine lacks, name the options
    for args, says in ((("--batch-wait-ms", "5000", "--deadline", "2"),
                        "--batch-wait-ms 5000 is not shorter than --deadline 2 s"),
                       (("--max-batch", "256"), "--max-batch 256 is more than --batch-size 64"),
                       (("--device", "gpu"), "argument --device: expected cpu, cuda or cuda:N"),
                       (("--device", "cuda:7"), "argument --device: cuda:7: torch sees")):
        refused = run(str(model_dir), *args)
        assert refused.returncode == 2 and "listening" not in refused.stderr
        assert refused.stderr.strip().splitlines()[-1].startswith(
            f"vaswani-serve: error: {says}"), refused.stderr
    # refused before anything loads: a port a socket would take modulo 65536, more threads
    # than torch can start, a length penalty out of the decoding options' one range
    for option, value, says in (("--port", "99999", "must be from 0 to 65535"),
                                ("--threads", "100000", "must be from 0 to 1024"),
                                ("--lenpen", "11", "must be a number from 0 to 10")):
        refused = run(str(model_dir), option, value)
        assert refused.returncode == 2 and "listening" not in refused.stderr
        assert refused.stderr.strip().splitlines()[-1].startswith(
            f"vaswani-serve: error: argument {option}: {says}")


# -- the page in a real headless Chromium ---------------------------------------------------------


def viridis(value: float) -> list[int]:
    """The page's colour map (static/page.js), to check the pixels it drew."""
    stops = [[68, 1, 84], [71, 45, 123], [59, 82, 139], [44, 114, 142], [33, 145, 140],
             [40, 174, 128], [94, 201, 98], [173, 220, 48], [253, 231, 37]]
    x = min(1.0, max(0.0, value)) * (len(stops) - 1)
    i = min(len(stops) - 2, int(x))
    return [round(a + (x - i) * (b - a)) for a, b in zip(stops[i], stops[i + 1])]


@pytest.fixture(scope="module")
def chromium():
    executable = Chromium.find()
    if executable is None:
        pytest.skip("no Chromium (Debian's chromium package: scripts/run_tests.sh installs it "
                    "with apt-get where it can, or set VASWANI_CHROMIUM)")
    browser = Chromium(executable)
    yield browser
    browser.close()


def test_page_translates_and_draws_the_attention(server, chromium, tmp_path):
    sentences = ["A man in a red shirt is riding a bicycle down the street.",
                 "Two dogs are playing in the snow."]
    chromium.open(server.url)
    chromium.wait_for("document.body.dataset.state === 'ready'")
    chromium.type_into("#source", "\n".join(sentences))
    chromium.click("#run")
    chromium.wait_for("document.getElementById('heatmap').dataset.drawn === 'true'")
    shown = chromium.evaluate(
        "[...document.querySelectorAll('#translations li')].map(e => e.textContent)")
    expected = server.request("POST", "/translate", {"text": sentences}).json["translations"]
    assert shown == expected and all(shown)

    attention = server.request("POST", "/attention", {"text": sentences[0]}).json

    def check_drawn(layer: int, head: int) -> None:
        geometry = chromium.evaluate("Object.assign({}, document.getElementById('heatmap')"
                                     ".dataset)")
        assert (int(geometry["layer"]), int(geometry["head"])) == (layer, head)
        weights = attention["weights"][layer][head]
        assert int(geometry["rows"]) == len(attention["target_tokens"]) == len(weights)
        assert int(geometry["columns"]) == len(attention["source_tokens"])
        cell, left, top = (int(geometry[k]) for k in ("cell", "left", "top"))
        peak = max(max(row) for row in weights)
        cells = [(r, c) for r in range(len(weights)) for c in range(len(weights[0]))]
        pixels = chromium.evaluate(
            "(() => { const c = document.getElementById('heatmap').getContext('2d'); return "
            + json.dumps([[left + c * cell + cell // 2, top + r * cell + cell // 2]
                          for r, c in cells])
            + ".map(([x, y]) => Array.from(c.getImageData(x, y, 1, 1).data.slice(0, 3))); })()")
        for (r, c), pixel in zip(cells, pixels):
            want = viridis(weights[r][c] / peak)
            assert max(abs(a - b) for a, b in zip(pixel, want)) <= 2, (r, c, pixel, want)
        assert len({tuple(p) for p in pixels}) > 3  # a picture, not a flat colour

    check_drawn(attention["layers"] - 1, 0)  # the page starts on the top layer, head 1
    chromium.evaluate("(() => { const s = document.getElementById('head'); s.value = '2';"
                      " s.dispatchEvent(new Event('change')); })()")
    check_drawn(attention["layers"] - 1, 2)
    status = chromium.evaluate("document.getElementById('attention-status').textContent")
    assert "head 3" in status and expected[0] in status

    screenshot = chromium.screenshot()
    assert screenshot.startswith(b"\x89PNG\r\n\x1a\n") and len(screenshot) > 10_000
    (tmp_path / "serving_page.png").write_bytes(screenshot)
    keep = os.environ.get("VASWANI_SERVING_SCREENSHOT")
    if keep:  # docs/serving_page.png is made this way
        Path(keep).write_bytes(screenshot)
