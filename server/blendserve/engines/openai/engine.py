"""Engine over OpenAI-compatible HTTP upstreams (vLLM, SGLang, llama.cpp, ...).

One :class:`OpenAIEngine` talks to data-parallel replicas of one model over pooled
keep-alive connections (:mod:`~blendserve.engines.openai._http_pool`). A request with
``messages`` goes to ``{url}/chat/completions``, one with ``prompt`` to
``{url}/completions``; base URLs are normalised to end in ``/v1``. ``n`` samples go as
one request where a replica honours ``n``, else as seeded single requests (the samples
a short answer lacks count ``cancelled`` there, and are asked for anew);
:meth:`~OpenAIEngine.stream` sends singles, each handed over as it returns. Retries,
failover, breakers, credentials, size limits and the load read from vLLM's gauges are
on docs/engines.md ("OpenAI-compatible upstreams", "Engine load") and
docs/operations.md ("Upstream faults"); the replica rules live in
:mod:`~blendserve.engines.openai._replicas` and :mod:`~blendserve.engines.openai._upstreams`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import random
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

import httpx2

from blendserve.core.signals import ConfidenceSpec
from blendserve.engines._retry import RetryPolicy, Throttles, exhausted
from blendserve.engines.base import (
    Engine,
    EngineHealth,
    EngineLoad,
    GenerateRequest,
    Sample,
    UpstreamReply,
    shift_seed,
)
from blendserve.engines.config import Health, Limits, Timeouts
from blendserve.engines.openai._replicas import Replica
from blendserve.engines.openai._upstreams import Upstreams
from blendserve.engines.openai.wire import (
    CHAT,
    COMPLETIONS,
    CutBar,
    error_message,
    normalise_base_url,
    parse_response,
    piece_limit,
    request_body,
    retry_after,
    sampling_body,
    split_credentials,
)
from blendserve.engines.passthrough import PassThrough
from blendserve.errors import (
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    UpstreamRejected,
)
from blendserve.stats import NO_STATS, Stats
from blendserve.util.cancel import DeadlinePassed, all_or_cancel, cancel_all, within

__all__ = ["OpenAIEngine", "normalise_base_url", "split_credentials"]

_log = logging.getLogger(__name__)

_SEED_SPACE = 2**31 - 1


class OpenAIEngine(Engine, PassThrough):
    """Samples from OpenAI-compatible upstreams serving the same model.

    ``urls`` are the replicas' base URLs, with or without ``/v1``; ``model=None``
    leaves the field out (the upstream's default); ``mode`` is the request kind
    callers build by default (both are served). ``n_support``: ``auto`` detects per
    replica whether ``n`` is honoured, ``yes`` always sends it, ``no`` always sends
    single requests. ``stream`` asks for streamed responses, so that a cancelled call
    stops generating (a stall timeout needs it). ``session_header`` carries the
    question id on every request, for a router's session routing. An upstream asking
    to retry after more than ``retry.max_retry_after`` fails the call at once (the
    job's own failure timeout decides, not the upstream). ``load_interval`` is the
    seconds between readings of the replicas' load, taken once ``capacity`` is set.
    """

    name = "openai"

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        mode: Literal["chat", "completions"] = "chat",
        n_support: Literal["auto", "yes", "no"] = "auto",
        stream: bool = False,
        session_header: str | None = None,
        timeouts: Timeouts = Timeouts(),
        limits: Limits = Limits(),
        health: Health = Health(),
        retry: RetryPolicy = RetryPolicy(),
        transport: httpx2.AsyncBaseTransport | None = None,
        sink: Stats = NO_STATS,
        load_interval: float = 0.5,
    ) -> None:
        if isinstance(urls, str):
            raise TypeError("urls must be a sequence of URLs, not one string")
        if mode not in ("chat", "completions"):
            raise ValueError(f"mode must be 'chat' or 'completions', got {mode!r}")
        if n_support not in ("auto", "yes", "no"):
            raise ValueError(f"n_support must be 'auto', 'yes' or 'no', got {n_support!r}")
        if timeouts.stall is not None and not stream:
            raise ValueError("a stall timeout needs stream=True")
        if not load_interval > 0:
            raise ValueError(f"load_interval must be positive, got {load_interval}")
        self._upstreams = Upstreams(
            urls,
            api_key=api_key,
            timeouts=timeouts,
            limits=limits,
            health=health,
            transport=transport,
            sink=sink,
        )
        self.sink = sink
        self._replicas = self._upstreams.replicas
        self._pool = self._upstreams.pool
        self._model = model
        self._mode: Literal["chat", "completions"] = mode
        self._timeout = timeouts.call
        self._retry = retry
        self._throttles = Throttles()
        self._n_support = n_support
        # stream() splits a request of n into singles, each handed over as it returns,
        # unless told the upstream takes n: then one request, its samples together.
        self.delivers_each = n_support != "yes"
        self._stream = stream
        self._session_header = session_header
        self._rng = random.Random()
        # Set (and replaced) whenever an attempt ends: what waits on a trial wakes on.
        self._attempt_ended = asyncio.Event()
        self._load_interval = load_interval
        self._load_task: asyncio.Task[None] | None = None
        self._closing = False
        # The last reading: replica URL -> (running, waiting), for those that told.
        self._queues: dict[str, tuple[int, int]] = {}
        self._in_flight_at_reading = 0  # sequences_in_flight when it was taken
        self._read_at = -math.inf  # the loop's time when it was kept

    def report_to(self, sink: Stats) -> None:
        """Reports to ``sink`` from now on, starting with every replica and its health."""
        super().report_to(sink)
        self._upstreams.report_to(sink)

    @property
    def mode(self) -> Literal["chat", "completions"]:
        """The request kind callers should build by default."""
        return self._mode

    @property
    def urls(self) -> list[str]:
        """Normalised replica base URLs, in configuration order."""
        return [r.url for r in self._replicas.replicas]

    @property
    def ignores_n(self) -> bool:
        """Whether ``n`` samples go out as ``n`` single requests: set so, or a replica was seen
        to answer a request for ``n`` with fewer (llama.cpp's server)."""
        if self._n_support != "auto":
            return self._n_support == "no"
        return any(r.n_honoured is False for r in self._replicas.replicas)

    async def __aenter__(self) -> OpenAIEngine:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- generate ----------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        """Exactly ``request.n`` samples (those of a failed call are dropped, never reused).

        Raises:
            EngineTimeout: ``request.timeout`` (else ``timeouts.call``) passed, retries included.
            EngineUnavailable: retries exhausted, every replica out, or the engine closed.
            EngineProtocolError: the last attempt answered unusably.
            UpstreamRejected: a status that is not retried (a 4xx other than 429).
            InvalidRequest: ``params.extra`` sets ``n``, ``seed`` or ``stream``.

        ``request.cut_below`` is honoured on streamed single requests (``stream=True``; a
        request of ``n`` sent as singles, as :meth:`stream` sends it, included): a sample
        whose window confidence falls below it stops being read, its response is closed
        (the upstream aborts it), and it comes back with finish reason
        :data:`~blendserve.core.traces.LOW_CONFIDENCE`, the text read, the tokens read as
        its ``completion_tokens`` and its confidence so far. A request whose ``n``
        choices share one stream is not cut (closing it would end them all), nor is an
        unstreamed one (its answer comes whole), nor one whose stream carries no logprobs:
        their samples run to their end. A cut stream sends no usage: its prompt tokens are
        counted by the one-token probe an upstream without stream usage gets.
        """
        return await self._call(request)

    async def _call(
        self, request: GenerateRequest, orphaned: Callable[[list[Sample]], object] | None = None
    ) -> list[Sample]:
        """:meth:`generate`; ``orphaned`` gets the samples of a call cancelled as they came."""
        if self._upstreams.closed:
            raise EngineUnavailable("the engine is closed")
        if self.capacity is not None or self.cost is not None:
            self._poll_load()
        body = request_body(request, self._model)
        timeout = self._timeout if request.timeout is None else request.timeout
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            return await within(self._generate(request, body, deadline), timeout, orphaned)
        except DeadlinePassed as exc:
            raise EngineTimeout(f"no {request.n} samples within {timeout:g} s") from exc

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Sample, None]:
        """The request's samples as each ends: ``n`` single requests, handed over as each
        returns; closing the iterator early cancels the rest (the upstream aborts them).

        The singles carry the seeds an ``n`` request's samples get (``seed + i``,
        as vLLM seeds them, or random distinct ones) and the question's replica
        affinity, so that they share its prompt cache. With ``n_support="yes"`` it is one
        request of ``n``, whose samples come together. Raises as :meth:`generate`.
        """
        if request.n == 1 or self._n_support == "yes":
            together = collections.deque(await self.generate(request))
            try:
                while together:
                    yield together.popleft()
            finally:
                self._never_handed(together)
            return

        def single(request: GenerateRequest, seed: int) -> GenerateRequest:
            params = dataclasses.replace(request.params, seed=seed)
            return dataclasses.replace(request, n=1, params=params)

        # A single cancelled in the step its samples came still made them: they are counted.
        tasks = [
            asyncio.ensure_future(self._call(single(request, seed), self._never_handed))
            for seed in self._seeds(request.params.seed, 0, request.n)
        ]
        handed: list[list[Sample]] = []
        samples: collections.deque[Sample] = collections.deque()
        try:
            for ended in asyncio.as_completed(tasks):
                handed.append(await ended)
                samples.extend(handed[-1])
                while samples:
                    yield samples.popleft()
        finally:
            await cancel_all(tasks)
            for task in tasks:
                made = task.done() and not task.cancelled() and task.exception() is None
                if made and not any(task.result() is taken for taken in handed):
                    samples.extend(task.result())
            self._never_handed(samples)

    def _never_handed(self, samples: Iterable[Sample]) -> None:
        """Reports the tokens of samples the upstream made that the caller closed the
        stream before taking: the scheduler counts those it takes, and these were billed."""
        for sample in samples:
            self.sink.tokens(sample.prompt_tokens, sample.completion_tokens)

    async def _generate(
        self, request: GenerateRequest, body: dict[str, Any], deadline: float
    ) -> list[Sample]:
        n = request.n
        path = CHAT if request.messages is not None else COMPLETIONS
        key = request.question_id
        seed = request.params.seed
        spec = request.confidence
        bar = request.cut_below
        if n > 1 and self._send_singles(key):
            seeds = self._seeds(seed, 0, n)
            samples = await self._fan_out(path, body, key, seeds, deadline, spec, bar)
        else:
            samples = await self._fetch(path, body, n, seed, key, deadline, spec, bar)
            if len(samples) < n:
                seeds = self._seeds(seed, len(samples), n - len(samples))
                samples += await self._fan_out(path, body, key, seeds, deadline, spec, bar)
        if self._stream and not all(s.prompt_tokens for s in samples):
            count = await self._upstreams.prompt_tokens(path, body, key)
            if count is not None:
                samples = [
                    s if s.prompt_tokens else dataclasses.replace(s, prompt_tokens=count)
                    for s in samples
                ]
        return samples

    def _send_singles(self, key: str | None) -> bool:
        if self._n_support != "auto":
            return self._n_support == "no"
        home = self._replicas.pick(key, rotate=False)
        return home is not None and home.n_honoured is False

    def _seeds(self, seed: int | None, start: int, count: int) -> list[int]:
        if seed is not None:
            return [shift_seed(seed, start + i) for i in range(count)]
        return self._rng.sample(range(_SEED_SPACE), count)

    async def _fan_out(
        self,
        path: str,
        body: dict[str, Any],
        key: str | None,
        seeds: list[int],
        deadline: float,
        spec: ConfidenceSpec | None,
        bar: float | None = None,
    ) -> list[Sample]:
        results = await all_or_cancel(
            [self._fetch(path, body, 1, seed, key, deadline, spec, bar) for seed in seeds]
        )
        return [sample for result in results for sample in result]

    async def _fetch(
        self,
        path: str,
        body: dict[str, Any],
        want: int,
        seed: int | None,
        key: str | None,
        deadline: float,
        spec: ConfidenceSpec | None,
        bar: float | None = None,
    ) -> list[Sample]:
        """One logical request for ``want`` samples, retried; 1..want samples back, their
        confidence read as ``spec`` says; a streamed single cut once its window confidence
        falls below ``bar`` (see :meth:`generate`)."""
        encoded = sampling_body(body, want, seed, self._stream)
        pieces = piece_limit(body, want) if self._stream else None
        cut = None
        if self._stream and want == 1 and spec is not None and bar is not None:
            cut = CutBar(spec, bar)
        session = ((self._session_header, key),) if self._session_header and key else ()
        loop = asyncio.get_running_loop()
        tried: list[Replica] = []
        last: Exception | None = None
        for attempt in range(self._retry.attempts):
            replica = self._replicas.acquire(key, want, tried)
            while replica is None and self._replicas.on_trial():
                # A half-open breaker's trial is in flight (e.g. the first of the single
                # requests an upstream that ignores n is sent): its outcome decides.
                await self._attempt_ended.wait()  # bounded by the call's deadline (within)
                replica = self._replicas.acquire(key, want, tried)
            if replica is None:
                if isinstance(last, EngineProtocolError):  # say what the answers were, not 503
                    raise exhausted(last, len(tried)) from last
                raise EngineUnavailable(
                    "every upstream is marked unhealthy (circuit breaker open)"
                ) from last
            outcome = await self._attempt(
                replica, path, encoded, want, pieces, session, attempt > 0, spec, cut
            )
            if isinstance(outcome, list):
                return outcome
            last, wait = outcome
            tried.append(replica)
            if attempt == self._retry.max_retries:
                break
            if self._replicas.has_untried(tried) or self._replicas.pick(key, rotate=False) is None:
                continue  # another replica now; or every breaker is open: the next acquire fails
            wait = self._throttles.honour(replica.url, wait, loop.time())
            delay = self._retry.delay(attempt, wait, loop.time(), deadline, self._rng)
            if delay is None:
                break
            await asyncio.sleep(delay)
        raise exhausted(last, len(tried)) from last

    def _ended(self) -> None:
        self._attempt_ended.set()
        self._attempt_ended = asyncio.Event()

    async def _attempt(
        self,
        replica: Replica,
        path: str,
        encoded: bytes,
        want: int,
        pieces: int | None,
        session: Sequence[tuple[str, str]],
        retry: bool,
        spec: ConfidenceSpec | None,
        cut: CutBar | None = None,
    ) -> list[Sample] | tuple[Exception, float | None]:
        """One attempt at ``replica``: its samples, or a retryable error and its Retry-After.

        An unusable answer (a 2xx body or stream that is no completion, one over
        the size limit) is the replica's failure and retryable, as a 5xx is:
        another replica may answer, and the breaker takes out one that never does.

        Raises:
            UpstreamRejected: a 4xx other than 429, not worth retrying.
        """
        url = replica.url
        if retry:
            self.sink.upstream_retry(url)
        sent = math.nan

        def sending() -> None:  # a connection took the request: its samples go out
            nonlocal sent
            if math.isnan(sent):
                self.sink.upstream_samples(url, "dispatched", want)
                sent = time.monotonic()

        try:
            try:
                response = await self._pool.post(
                    url,
                    path,
                    encoded,
                    self._stream,
                    session,
                    sending,
                    pieces,
                    None if spec is None else spec.top_logprobs,
                    cut,
                )
            finally:
                self._replicas.release(replica, want)
                self._ended()
        except httpx2.PoolTimeout as exc:  # our pool's fault, not the replica's
            if not math.isnan(sent):  # a connection turned it away, then none came: never made
                self.sink.upstream_samples(url, "cancelled", want)
            return exc, None
        except httpx2.TransportError as exc:
            sending()  # counted sent, if no connection had it yet: it fails as one that went
            self.sink.upstream_samples(url, "failed", want)
            self._upstreams.failed(replica)
            return exc, None
        except httpx2.RequestError as exc:  # a body over the size limit, a bad encoding
            error = EngineProtocolError(f"{url}: unusable response: {exc}")
            return self._unusable(replica, want, error, exc)
        except EngineProtocolError as exc:  # an unusable stream
            return self._unusable(replica, want, EngineProtocolError(f"{url}: {exc}"), exc)
        except BaseException:  # cancelled: not the upstream's failure
            if not math.isnan(sent):
                self.sink.upstream_samples(url, "cancelled", want)
            raise
        return self._judged(replica, response, path, want, sent, spec)

    def _judged(
        self,
        replica: Replica,
        response: httpx2.Response,
        path: str,
        want: int,
        sent: float,
        spec: ConfidenceSpec | None,
    ) -> list[Sample] | tuple[Exception, float | None]:
        """What an attempt's response makes of it: see :meth:`_attempt`."""
        url = replica.url
        status = response.status_code
        if 200 <= status < 300:
            self._throttles.answered(url)
            try:
                samples = self._answered(replica, response, path == CHAT, want, sent, spec)
            except EngineProtocolError as exc:
                return self._unusable(replica, want, exc, exc.__cause__)
            self._replicas.record_success(replica)
            return samples
        error = httpx2.HTTPStatusError(
            f"{url}{path} answered {status}: {error_message(response)}",
            request=response.request,
            response=response,
        )
        self.sink.upstream_samples(url, "failed", want)
        if status != 429 and status < 500:
            self._replicas.record_success(replica)
            raise UpstreamRejected(str(error), status) from error
        if status >= 500:
            self._upstreams.failed(replica)
        return error, retry_after(response)

    def _unusable(
        self, replica: Replica, want: int, error: EngineProtocolError, cause: BaseException | None
    ) -> tuple[Exception, None]:
        """An attempt answered unusably: the replica's failure, retried like one (elsewhere)."""
        self.sink.upstream_samples(replica.url, "failed", want)
        self._upstreams.failed(replica)
        error.__cause__ = cause
        return error, None

    def _answered(
        self,
        replica: Replica,
        response: httpx2.Response,
        chat: bool,
        want: int,
        sent: float,
        spec: ConfidenceSpec | None,
    ) -> list[Sample]:
        """The samples of a 2xx answer; each of the ``want`` asked for gets its outcome.

        Those it lacks (llama.cpp ignores ``n``) count as cancelled: never made,
        and asked for anew by :meth:`_generate`.

        Raises:
            EngineProtocolError: an unusable body (counted by the caller).
        """
        url = replica.url
        samples = parse_response(response, chat, want, url, spec)
        if want > 1 and self._n_support == "auto":
            replica.n_honoured = len(samples) == want
        self.sink.upstream_samples(url, "completed", len(samples))
        if len(samples) < want:
            self.sink.upstream_samples(url, "cancelled", want - len(samples))
        self.sink.upstream_latency(url, time.monotonic() - sent)
        return samples

    # -- load --------------------------------------------------------------------

    def load(self) -> EngineLoad:
        """How full the replicas are, from the last reading; no I/O.

        Without ``capacity``, this process's own sequences in flight. With it, the
        replicas' running and waiting sequences out of ``capacity`` per replica
        (docs/engines.md, "Engine load"); starts the readings if this runs in a loop.
        """
        if self.capacity is None:
            return super().load()
        self._poll_load()
        own = self.sequences_in_flight
        capacity = self.capacity * len(self._replicas.replicas)
        queues = self._queues
        if not queues:
            return EngineLoad(capacity, own)
        running = waiting = 0
        for replica in self._replicas.replicas:
            queue = queues.get(replica.url)
            if queue is None:  # no gauges there: what this process has in flight there
                running += replica.outstanding
            else:
                running += queue[0]
                waiting += queue[1]
        # Sent since the reading (a burst counts at once), less what ended since (a job
        # that shares the engine must not take its own last wave for others' load).
        running = max(0, running + own - self._in_flight_at_reading)
        return EngineLoad(capacity, max(running, own - waiting), waiting)

    async def refresh_load(self) -> None:
        """Reads every replica's running and waiting requests once (what the poller repeats).

        A replica without vLLM's gauges is left out of the reading and is not
        asked again for a while (:meth:`Upstreams.queue`). The poller's next
        reading comes ``load_interval`` after this one.
        """
        own = self.sequences_in_flight  # before: sequences sent meanwhile count twice, not never
        replicas = self._replicas.replicas
        queues = await asyncio.gather(*(self._upstreams.queue(r) for r in replicas))
        self._queues = {r.url: q for r, q in zip(replicas, queues, strict=True) if q is not None}
        readings, self._upstreams.cost_readings = self._upstreams.cost_readings, {}
        if self.cost is not None:
            for url, (counters, at, busy_since) in readings.items():
                self.cost.observe(url, counters, at, busy_since)
        self._in_flight_at_reading = own
        self._read_at = asyncio.get_running_loop().time()

    def _poll_load(self) -> None:
        """Starts the readings, unless they run, the engine is closing or no loop runs."""
        if self._closing or (self._load_task is not None and not self._load_task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._load_task = loop.create_task(self._load_loop(), name="blendserve-engine-load")

    async def _load_loop(self) -> None:
        """Reads the load once the last reading (the loop's own or not) is ``load_interval`` old."""
        loop = asyncio.get_running_loop()
        while True:
            wait = self._read_at + self._load_interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            try:
                await self.refresh_load()
            except Exception:  # a bug in a reading: keep the last one, try again later
                _log.exception("reading the upstreams' load failed")
                self._read_at = loop.time()

    # -- pass-through, health ----------------------------------------------------

    async def forward(self, path: str, body: Mapping[str, Any]) -> UpstreamReply:
        """Sends ``body`` as is to one replica; see :meth:`Upstreams.forward`."""
        return await self._upstreams.forward(path, body)

    async def tokenizer(self, path: str, body: Mapping[str, Any] | None) -> UpstreamReply:
        """Asks a replica's tokenizer endpoint; see :meth:`Upstreams.tokenizer`."""
        return await self._upstreams.tokenizer(path, body)

    async def health(self) -> EngineHealth:
        """Per-replica health from the last outcomes and probes; no I/O."""
        return self._upstreams.health()

    async def models(self) -> list[str]:
        """The replicas' models; see :meth:`Upstreams.models`."""
        return await self._upstreams.models()

    async def aclose(self) -> None:
        """Stops the load readings and the probe task, and closes the connection pools."""
        self._closing = True
        task, self._load_task = self._load_task, None
        if task is not None:
            await cancel_all([task])
        await self._upstreams.aclose()
