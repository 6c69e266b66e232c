"""Running the application under uvicorn: the listening socket, the model loaded in the
background, and a shutdown that loses nothing.

The socket is bound before anything else, so that a port in use is one error line and
``--port 0`` can print the port it got. uvicorn then serves at once: ``GET /health`` says
``loading`` (503) until the worker thread has loaded the model, then ``ready``. A model that
cannot be loaded stops the server; the command then exits 1 with the hub's line.

**SIGTERM** (or Ctrl-C) makes uvicorn close the listening socket (no new connection is
accepted) and wait for every request it has accepted to be answered, with no time limit but
each request's own deadline; the worker then stops and the process exits 0. A second Ctrl-C
forces the exit. (uvicorn re-raises the signal after a graceful shutdown, which would end the
process by that signal; the handlers installed here take it instead, so the exit status is 0.)
"""

from __future__ import annotations

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


def run(build_app: Callable[[Callable[[str], None]], object], sock: socket.socket,
        access_log: bool = False) -> None:
    """Serve the application that ``build_app(on_fatal)`` returns on ``sock`` until a stop
    signal, or until the application calls ``on_fatal(line)`` (the model cannot be loaded),
    which is then raised as a :class:`UserError` once the server has stopped."""
    import uvicorn

    fatal: list[str] = []
    server: uvicorn.Server | None = None

    def on_fatal(line: str) -> None:
        fatal.append(line)
        if server is not None:
            server.should_exit = True

    def on_stop_signal(signum, frame) -> None:
        if server is not None:
            server.should_exit = True

    config = uvicorn.Config(build_app(on_fatal), http="h11", loop="asyncio", lifespan="on",
                            log_level="warning", access_log=access_log,
                            timeout_graceful_shutdown=None)
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
