"""The HTTP application of ``vaswani-serve`` (Starlette): its routes, and how each request is
read, queued, waited for and answered.

======================  ====================================================================
route                   answer
======================  ====================================================================
``POST /translate``     ``{"text": [...], "beam"?, "lenpen"?, "nbest"?}`` ->
                        ``{"translations": [...], "model": FINGERPRINT}``
``POST /attention``     ``{"text": "one sentence", "beam"?, "lenpen"?}`` -> its translation
                        and encoder-decoder attention (every layer and head)
``GET /health``         200 ``{"status": "ready", ...}`` once the model is loaded, else 503
``GET /model``          what is served: fingerprint, languages, text pipeline, backend
``GET /``               the page to try it (``static/``)
======================  ====================================================================

Every answer about a model carries its fingerprint in the ``X-Model-Fingerprint`` header; every
refusal is ``{"error": "one line"}`` with its status (docs/serving.md lists them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .batcher import ATTENTION, TRANSLATE, Batcher, NotReady, Overloaded
from .limits import Limits
from .request_body import RequestError, attention_request, translate_request
from .served_model import DecodingOptions, ServedModel

#: The page's files, served as they are (no build step).
STATIC = Path(__file__).resolve().parent / "static"
#: The header naming the model an answer comes from.
FINGERPRINT_HEADER = "X-Model-Fingerprint"
#: Status of a request whose client went away (nobody reads it; nginx's convention).
CLIENT_GONE = 499


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


class Service:
    """One server's state: the batcher and its model, the limits and the default options."""

    def __init__(self, load: Callable[[], ServedModel], limits: Limits,
                 defaults: DecodingOptions,
                 on_load_error: Callable[[str], None] | None = None,
                 on_ready: Callable[[ServedModel], None] | None = None) -> None:
        self.limits = limits
        self.defaults = defaults
        self.stopping = False
        self._on_ready = on_ready
        self.batcher = Batcher(load, limits, on_ready=self._ready, on_load_error=on_load_error)

    def _ready(self) -> None:
        if self._on_ready is not None:
            self._on_ready(self.batcher.model)

    @property
    def model(self) -> ServedModel | None:
        return self.batcher.model if self.batcher.state == "ready" else None

    def headers(self) -> dict[str, str]:
        model = self.model
        return {} if model is None else {FINGERPRINT_HEADER: model.fingerprint}

    def refuse(self, status: int, message: str, retry_after: int | None = None) -> JSONResponse:
        headers = self.headers()
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    # -- reading and waiting ----------------------------------------------------------------

    async def read_body(self, request: Request) -> bytes:
        """The request's body; 413 past ``max_body_bytes`` (by its ``Content-Length`` before
        reading, or while reading a body without one)."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestError(413, f"body: {int(declared)} bytes, more than the {limit} "
                               "a request may have")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestError(413, f"body: more than the {limit} bytes a request "
                                       "may have")
                chunks.append(chunk)
        except ClientDisconnect:
            raise ClientGone() from None
        return b"".join(chunks)

    async def answer(self, kind: str, request: Request, body: object, started: float):
        """Queue ``body`` (a checked request) and wait for its result, at most until the
        deadline; a client that goes away meanwhile takes its request out of the queue."""
        job = self.batcher.submit(kind, body)
        gone = asyncio.ensure_future(_disconnected(request))
        remaining = started + self.limits.deadline - time.monotonic()
        try:
            done, _ = await asyncio.wait({job.future, gone}, timeout=max(remaining, 0),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if job.future in done:
            return job.future.result()
        self.batcher.abandon(job)
        if gone in done:
            raise ClientGone()
        raise RequestError(504, f"no answer within the deadline of {self.limits.deadline:g} s "
                           "(the server is busy): retry later")

    async def handle(self, kind: str, request: Request, parse) -> Response:
        """Read, check, queue and answer one ``POST``; every refusal as one line."""
        started = time.monotonic()
        try:
            if self.model is None or self.stopping:
                raise NotReady("the server is shutting down" if self.stopping
                               else "the model is still loading")
            try:
                data = await asyncio.wait_for(self.read_body(request), self.limits.deadline)
            except asyncio.TimeoutError:
                raise RequestError(408, "body: not received within the deadline of "
                                   f"{self.limits.deadline:g} s") from None
            body = parse(data, self.limits, self.defaults)
            if kind == TRANSLATE and not body.sentences:
                result = []
            else:
                result = await self.answer(kind, request, body, started)
        except RequestError as error:
            return self.refuse(error.status, str(error))
        except NotReady as error:
            return self.refuse(503, str(error), retry_after=1)
        except Overloaded as error:
            return self.refuse(503, str(error), retry_after=error.retry_after)
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
        fingerprint = self.model.fingerprint
        content = ({"translations": result} if kind == TRANSLATE else dict(result))
        content["model"] = fingerprint
        return JSONResponse(content, headers={FINGERPRINT_HEADER: fingerprint})

    # -- routes ------------------------------------------------------------------------------

    async def translate(self, request: Request) -> Response:
        return await self.handle(TRANSLATE, request, translate_request)

    async def attention(self, request: Request) -> Response:
        return await self.handle(ATTENTION, request, attention_request)

    async def health(self, request: Request) -> Response:
        batcher = self.batcher
        status = ("stopping" if self.stopping else
                  "ready" if batcher.state == "ready" else batcher.state)
        stats = batcher.stats
        content = {"status": status, "queued_sentences": batcher.queued_sentences,
                   "decoding_sentences": batcher.decoding_sentences,
                   "batches": stats.batches, "decodes": stats.decodes,
                   "requests": stats.requests,
                   "sentences": stats.sentences, "largest_batch": stats.largest_batch}
        return JSONResponse(content, status_code=200 if status == "ready" else 503,
                            headers=self.headers())

    async def describe(self, request: Request) -> Response:
        model = self.model
        if model is None:
            return self.refuse(503, "the model is still loading", retry_after=1)
        return JSONResponse({**model.describe(), "limits": {
            "max_body_bytes": self.limits.max_body_bytes,
            "max_sentences": self.limits.max_sentences, "max_queue": self.limits.max_queue,
            "deadline": self.limits.deadline, "max_beam": self.limits.max_beam,
        }}, headers=self.headers())

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette):
        """Start the worker (which loads the model) with the server; once the server has
        answered every accepted request, stop it."""
        self.batcher.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            self.stopping = True
            await asyncio.get_running_loop().run_in_executor(None, self.batcher.stop)


async def _disconnected(request: Request) -> None:
    """Return once the client has closed its connection (after its body was read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(service: Service) -> Starlette:
    """The Starlette application of ``service``."""
    routes = [
        Route("/", service.page, methods=["GET"]),
        Route("/translate", service.translate, methods=["POST"]),
        Route("/attention", service.attention, methods=["POST"]),
        Route("/health", service.health, methods=["GET"]),
        Route("/model", service.describe, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, lifespan=service.lifespan)
