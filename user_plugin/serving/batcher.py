"""Dynamic batching: the requests of many clients decoded together by one worker thread.

Requests are queued as :class:`Job` objects by the event loop (:meth:`Batcher.submit`); one
worker thread, which also loads the model, takes them in arrival order. When it finds the queue
empty it waits for the next request, then up to :attr:`~.limits.Limits.batch_wait` seconds
(a few milliseconds) for others to join it; when it was busy decoding, everything that queued
meanwhile is taken at once. Up to :attr:`~.limits.Limits.max_batch` sentences are decoded in one
call of the hub per ``beam`` and ``nbest`` (each sentence with its own request's ``lenpen``,
which the search applies per sentence), where they are sorted by length; each request then
gets back exactly its own sentences' translations, in its order.

A request whose sentence the model cannot take (longer than its positions) is refused alone
before its batch is decoded (the check is cheap: the text pipeline and a count). Should the hub
still refuse a batch, it is decoded again request by request, so only the request at fault gets
the error. Torch and CTranslate2 run only in the worker thread, never in the event loop, which
keeps answering health checks and refusing what the queue cannot hold.

The queue is bounded in seconds of work: once the decoder's rate is measured (sentences per
second, smoothed over its batches), a request is admitted only while the work ahead of it and
its own (the sentences queued, being decoded, and its own, over that rate) would take at most
:data:`ADMISSION_SHARE` of the deadline; and always at most :attr:`~.limits.Limits.max_queue`
sentences wait. A request that does not fit is refused at once (:class:`Overloaded`, answered
503 with ``Retry-After``), never left to wait for an answer it would get after its deadline.
A request whose client went away or whose deadline passed is taken out of the queue
(:meth:`Batcher.abandon`), so it costs nothing more; one already taken for a batch is left out
of it unless its decoding has begun, and then its answer is dropped. The worker thread never
reads a future: it reads the job's own flag, set under the queue's lock, and hands every
result to the event loop's thread, which alone settles futures.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..files.errors import UserError, first_line
from .limits import Limits
from .request_body import RequestError, TranslateRequest
from .served_model import NotSupported, ServedModel

logger = logging.getLogger(__name__)

#: The share of the deadline a request's expected work may take when it is admitted: the rest
#: absorbs the rate's variation (a batch of long sentences), reading and answering.
ADMISSION_SHARE = 0.5

#: What a job asks for: translations of its sentences, or the attention of its one sentence.
TRANSLATE, ATTENTION = "translate", "attention"


class Overloaded(Exception):
    """The queue cannot take a request now; ``retry_after`` is the estimated wait in whole
    seconds (at least 1)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotReady(Exception):
    """The model is not loaded yet, or the server is stopping."""


@dataclass(eq=False)
class Job:
    """One request in the queue: ``future`` gets its result (or a :class:`RequestError`) in
    the event loop's thread."""

    kind: str
    request: TranslateRequest
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)
    started: bool = False
    abandoned: bool = False

    @property
    def size(self) -> int:
        """The sentences it puts in the queue (an attention job counts as one)."""
        return max(1, len(self.request.sentences)) if self.kind == ATTENTION \
            else len(self.request.sentences)


@dataclass
class BatchStats:
    """What the worker has done: ``batches`` taken from the queue, ``decodes`` (calls of the
    hub for them: one per ``beam`` and ``nbest`` in a batch), ``requests`` and ``sentences`` in
    them, the most requests one batch held (``largest_batch``), and the decoding rate in
    sentences per second (an exponential average), for ``Retry-After``."""

    batches: int = 0
    decodes: int = 0
    requests: int = 0
    sentences: int = 0
    largest_batch: int = 0
    rate: float = 0.0


class Batcher:
    """The queue and its worker thread (see the module docstring).

    ``load`` builds the model in the worker thread; ``on_ready`` (no argument) and
    ``on_load_error`` (one line) are then called in the event loop's thread.
    """

    def __init__(self, load: Callable[[], ServedModel], limits: Limits,
                 on_ready: Callable[[], None] | None = None,
                 on_load_error: Callable[[str], None] | None = None) -> None:
        self.load = load
        self.limits = limits
        self.on_ready = on_ready
        self.on_load_error = on_load_error
        self.model: ServedModel | None = None
        self.state = "loading"
        self.stats = BatchStats()
        self._queue: deque[Job] = deque()
        self._queued = 0
        self._decoding = 0
        self._stopping = False
        self._lock = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- the event loop's side ----------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the worker thread (it loads the model first)."""
        self._loop = loop
        self._thread = threading.Thread(target=self._work, name="vaswani-serve-decoder",
                                        daemon=True)
        self._thread.start()

    @property
    def queued_sentences(self) -> int:
        """Sentences accepted and not yet being decoded."""
        return self._queued

    @property
    def decoding_sentences(self) -> int:
        """Sentences being decoded now."""
        return self._decoding

    def submit(self, kind: str, request: TranslateRequest) -> Job:
        """Queue a request; :class:`NotReady` while loading or stopping, :class:`Overloaded`
        when its sentences do not fit in the queue."""
        assert self._loop is not None, "start() first"
        job = Job(kind, request, self._loop.create_future())
        with self._lock:
            if self._stopping:
                raise NotReady("the server is shutting down")
            if self.state != "ready":
                raise NotReady("the model is still loading")
            if self._queued + job.size > self.limits.max_queue:
                raise Overloaded(
                    f"the queue is full ({self._queued} sentences waiting, at most "
                    f"{self.limits.max_queue}): retry later", self._retry_after())
            work = self._expected_work(job.size)
            bound = ADMISSION_SHARE * self.limits.deadline
            if work is not None and work > bound:
                raise Overloaded(
                    f"the server is busy: this request would be answered in about {work:.1f} "
                    f"s, more than the {bound:g} s a request may wait (half its deadline): "
                    "retry later", self._retry_after(work - bound))
            self._queue.append(job)
            self._queued += job.size
            self._lock.notify_all()
        return job

    def abandon(self, job: Job) -> bool:
        """Take ``job`` out of the queue (its client is gone or its deadline passed) and cancel
        its future (in the event loop's thread, which calls this); False when it was already
        taken for a batch (it is then left out unless being decoded, and its answer is
        dropped)."""
        with self._lock:
            job.abandoned = True
            queued = not job.started and job in self._queue
            if queued:
                self._queue.remove(job)
                self._queued -= job.size
        job.future.cancel()
        return queued

    def stop(self) -> None:
        """Let the worker finish what is queued, then end it (waits for it once loaded)."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None and self.state == "ready":
            self._thread.join()

    def _expected_work(self, sentences: int) -> float | None:
        """Seconds until a request of ``sentences`` would be answered: the sentences queued,
        being decoded and its own, over the measured rate; None before any batch is measured."""
        rate = self.stats.rate
        if rate <= 0:
            return None
        return (self._queued + self._decoding + sentences) / rate

    def _retry_after(self, wait: float | None = None) -> int:
        """Whole seconds, 1 to 60, after which a refused client may try again: ``wait``, else
        the time the queue takes to drain at the measured rate."""
        if wait is None:
            rate = self.stats.rate
            wait = self._queued / rate if rate > 0 else 1.0
        return int(min(60, max(1, math.ceil(wait))))

    def _settle(self, job: Job, result: object, error: BaseException | None) -> None:
        """Give ``job`` its result (in the event loop's thread)."""
        if job.future.done():  # abandoned: its client is gone or its deadline passed
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    # -- the worker thread --------------------------------------------------------------------

    def _call_in_loop(self, function: Callable, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _work(self) -> None:
        try:
            model = self.load()
        except (UserError, ValueError, OSError) as error:
            self.state = "failed"
            if self.on_load_error is not None:
                self._call_in_loop(self.on_load_error, first_line(error))
            return
        except Exception as error:  # noqa: BLE001 (a bug: said in one line, traceback logged)
            logger.exception("loading the model failed")
            self.state = "failed"
            if self.on_load_error is not None:
                self._call_in_loop(self.on_load_error, first_line(error, with_type=True))
            return
        with self._lock:
            self.model = model
            self.state = "ready"
        if self.on_ready is not None:
            self._call_in_loop(self.on_ready)
        while True:
            jobs = self._next_batch()
            if jobs is None:
                return
            with self._lock:  # counted before any answer goes out: /health never lags one
                self._count(jobs)
            started = time.monotonic()
            self._decode(jobs)
            with self._lock:
                self._measure(jobs, time.monotonic() - started)
                self._decoding = 0

    def _next_batch(self) -> list[Job] | None:
        """The next jobs to decode together (None once stopping with nothing queued)."""
        limits = self.limits
        with self._lock:
            while True:
                while not self._queue:
                    if self._stopping:
                        return None
                    self._lock.wait()
                until = self._queue[0].arrived + limits.batch_wait
                while (self._queue and self._queued < limits.max_batch
                       and not self._stopping):
                    remaining = until - time.monotonic()
                    if remaining <= 0:
                        break
                    self._lock.wait(remaining)
                if self._queue:  # (the first may have been abandoned meanwhile)
                    break
            if self._queue[0].kind == ATTENTION:
                jobs = [self._queue.popleft()]
            else:
                jobs, sentences = [], 0
                for job in list(self._queue):
                    if job.kind != TRANSLATE:
                        continue
                    if jobs and sentences + job.size > limits.max_batch:
                        break
                    jobs.append(job)
                    sentences += job.size
                for job in jobs:
                    self._queue.remove(job)
            for job in jobs:
                job.started = True
                self._queued -= job.size
                self._decoding += job.size
            return jobs

    def _count(self, jobs: list[Job]) -> None:
        stats = self.stats
        stats.batches += 1
        stats.requests += len(jobs)
        stats.sentences += sum(len(job.request.sentences) for job in jobs)
        stats.largest_batch = max(stats.largest_batch, len(jobs))

    def _measure(self, jobs: list[Job], seconds: float) -> None:
        """The decoder's rate (sentences per second, smoothed), from a batch decoded."""
        stats = self.stats
        sentences = sum(len(job.request.sentences) for job in jobs)
        if sentences and seconds > 0:
            rate = sentences / seconds
            stats.rate = rate if stats.rate == 0 else 0.8 * stats.rate + 0.2 * rate

    def _decode(self, jobs: list[Job]) -> None:
        """Decode ``jobs`` (one attention job, or translate jobs grouped by options) and hand
        each its result."""
        if jobs[0].kind == ATTENTION:
            for job in self._still_wanted(jobs):
                self._run(job, lambda job=job: self.model.attention(job.request.sentences[0],
                                                                    job.request.options))
            return
        groups: dict = {}
        for job in self._still_wanted(jobs):
            problem = self.model.length_problem(job.request.sentences)
            if problem is not None:  # this request alone: the batch goes on without it
                self._call_in_loop(self._settle, job, None, RequestError(422, problem))
                continue
            options = job.request.options
            groups.setdefault((options.beam, options.nbest), []).append(job)
        for group in groups.values():
            options = group[0].request.options
            sentences = [s for job in group for s in job.request.sentences]
            lenpens = [job.request.options.lenpen for job in group
                       for _ in job.request.sentences]
            try:
                self.stats.decodes += 1
                outputs = self.model.translate(sentences, options, lenpens)
            except (UserError, ValueError, RequestError) as refused:
                if len(group) == 1:  # the error is this request's: say it
                    self._call_in_loop(self._settle, group[0], None, refusal(refused))
                    continue
                for job in group:  # find whose it is: each request alone
                    self._run(job, lambda job=job: self.model.translate(
                        list(job.request.sentences), job.request.options))
                continue
            except Exception as error:  # noqa: BLE001 (a bug: every request of it gets 500)
                logger.exception("decoding a batch failed")
                for job in group:
                    self._call_in_loop(self._settle, job, None,
                                       RequestError(500, first_line(error, with_type=True)))
                continue
            start = 0
            for job in group:
                end = start + len(job.request.sentences)
                self._call_in_loop(self._settle, job, outputs[start:end], None)
                start = end

    def _still_wanted(self, jobs: list[Job]) -> list[Job]:
        """``jobs`` but those abandoned since they were taken, or whose deadline passed."""
        now = time.monotonic()
        with self._lock:
            return [job for job in jobs if not job.abandoned
                    and now - job.arrived < self.limits.deadline]

    def _run(self, job: Job, compute: Callable[[], object]) -> None:
        """``compute()`` as ``job``'s result; what it refuses becomes ``job``'s error."""
        self.stats.decodes += 1
        try:
            result, error = compute(), None
        except (RequestError, UserError, ValueError, NotSupported) as refused:
            result, error = None, refusal(refused)
        except Exception as failure:  # noqa: BLE001 (a bug: 500, traceback logged)
            logger.exception("decoding a request failed")
            result, error = None, RequestError(500, first_line(failure, with_type=True))
        self._call_in_loop(self._settle, job, result, error)


def refusal(error: Exception) -> RequestError:
    """What the model refused in a request as the request's error: 501 for what its backend
    cannot do (:class:`~.served_model.NotSupported`), else 422 (a sentence too long, an option
    the backend lacks), with the model's line."""
    if isinstance(error, RequestError):
        return error
    return RequestError(501 if isinstance(error, NotSupported) else 422, first_line(error))
