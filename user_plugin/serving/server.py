"""Running the application under uvicorn: the listening socket, the model loaded in the
background, and a shutdown that loses nothing.

The socket is bound before anything else, so that a port in use is one error line and
``--port 0`` can print the port it got. uvicorn then serves at once: ``GET /health`` says
``loading`` (503) until the worker thread has loaded the model, then ``ready``. A model that
cannot be loaded stops the server; the command then exits 1 with the hub's line.

**Connections** are bounded: past ``max_connections`` open at once (requests being read or
answered included), uvicorn answers 503 at once, ``/health`` too, rather than letting the
flood stall everyone. A client must send a request's whole header block within
``header_timeout`` seconds of connecting (or of its previous answer): a connection that
sends nothing, or half a header block, is closed then (uvicorn alone waits for ever).

**SIGTERM** (or Ctrl-C) makes uvicorn close the listening socket (no new connection is
accepted) and wait for every request it has accepted to be answered, with no time limit but
each request's own deadline; the worker then stops and the process exits 0. A second SIGTERM
or Ctrl-C forces the exit at once, with one line, and status 128 + the signal's number.
(uvicorn re-raises the signal after a graceful shutdown, which would end the
process by that signal; the handlers installed here take it instead, so the exit status is 0.)
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable

from ..files.errors import UserError

#: The signals that stop the server gracefully.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port); a :class:`UserError`
    naming the address when it cannot be had."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as error:
        raise UserError(f"--host {host}: not an address of this machine ({error.strerror})") \
            from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({error.strerror or error})") \
            from None
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://host:port/`` of a listening socket."""
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's HTTP/1.1 protocol (h11), closing a connection whose client has not sent a
    whole request header block ``seconds`` after it connected or got its last answer."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        header_timeout = seconds
        _header_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._watch_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_headers()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch_headers()

        def connection_lost(self, exc) -> None:
            self._stop_watching()
            super().connection_lost(exc)

        def _watch_headers(self) -> None:
            """Arm the timer while the client owes a request's headers; stop it once read."""
            if self.conn.their_state is h11.IDLE:
                if self._header_timer is None:
                    self._header_timer = self.loop.call_later(self.header_timeout,
                                                              self._headers_too_slow)
            else:
                self._stop_watching()

        def _stop_watching(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol


def uvicorn_config(app, access_log: bool = False, max_connections: int = 512,
                   header_timeout: float = 10.0):
    """uvicorn's configuration of a server of ``app``: HTTP/1.1 with the header timeout, at
    most ``max_connections`` at once, no time limit on a graceful shutdown."""
    import uvicorn

    return uvicorn.Config(app, http=header_timeout_protocol(header_timeout), loop="asyncio",
                          lifespan="on", log_level="warning", access_log=access_log,
                          timeout_graceful_shutdown=None, limit_concurrency=max_connections)


def run(build_app: Callable[[Callable[[str], None]], object], sock: socket.socket,
        access_log: bool = False, max_connections: int = 512,
        header_timeout: float = 10.0) -> None:
    """Serve the application that ``build_app(on_fatal)`` returns on ``sock`` until a stop
    signal, or until the application calls ``on_fatal(line)`` (the model cannot be loaded),
    which is then raised as a :class:`UserError` once the server has stopped; at most
    ``max_connections`` at once, each owing its headers for at most ``header_timeout``
    seconds."""
    import uvicorn

    fatal: list[str] = []
    server: uvicorn.Server | None = None

    def on_fatal(line: str) -> None:
        fatal.append(line)
        if server is not None:
            server.should_exit = True

    signals: list[int] = []

    def on_stop_signal(signum, frame) -> None:
        signals.append(signum)
        if len(signals) > 1:  # the second: end now, as a killed process ends
            say("forced to stop: requests still queued or being decoded get no answer")
            os._exit(128 + signum)
        if server is not None:
            server.should_exit = True

    config = uvicorn_config(build_app(on_fatal), access_log, max_connections, header_timeout)
    server = uvicorn.Server(config)
    previous = {sig: signal.signal(sig, on_stop_signal) for sig in STOP_SIGNALS}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if fatal:
        raise UserError(fatal[0])


def say(message: str) -> None:
    """One line of the server's own, on stderr."""
    print(f"vaswani-serve: {message}", file=sys.stderr, flush=True)
