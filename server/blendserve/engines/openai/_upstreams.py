"""An OpenAI engine's replicas: connections, probes, load, pass-through, prompt token counts.

The I/O around :mod:`~blendserve.engines.openai._replicas`' rules: a background
task, running only while some breaker is not closed, probes those replicas
with ``GET {url}/models``; a replica's load and step-cost series are read from
vLLM's ``/metrics`` at its server root, bounded and parsed off the event loop
(docs/engines.md, "Engine load").
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx2

from blendserve.engines.base import EngineHealth, UpstreamReply
from blendserve.engines.config import Health, Limits, Timeouts
from blendserve.engines.engine_cost import COST_SERIES, cost_counters
from blendserve.engines.openai._http_pool import HttpPool
from blendserve.engines.openai._replicas import Replica, ReplicaSet
from blendserve.engines.openai.wire import (
    CHAT,
    COMPLETIONS,
    TOKENIZER_PATHS,
    encode,
    once,
    parse_samples,
    split_credentials,
)
from blendserve.errors import EngineProtocolError, EngineUnavailable, InvalidRequest
from blendserve.stats import NO_STATS, Stats
from blendserve.util.byte_lru import ByteLRU
from blendserve.util.cancel import DeadlinePassed, within

__all__ = [
    "MAX_LABEL_SETS",
    "METRICS_BYTES",
    "METRICS_RETRY_S",
    "PROMPT_COUNT_BYTES",
    "RUNNING",
    "SIDE_TIMEOUT",
    "WAITING",
    "Upstreams",
    "parse_cost",
    "parse_queue",
]

_log = logging.getLogger(__name__)

SIDE_TIMEOUT = 5.0  # GET /models (models(), probes), tokenizer endpoints, GET /metrics
#: Bytes of prompt token counts kept for upstreams without stream usage (about 250 each).
PROMPT_COUNT_BYTES = 1 << 20
#: The largest ``/metrics`` body read: a generous multiple of vLLM's.
METRICS_BYTES = 4 << 20
#: Seconds a replica without vLLM's load gauges is left alone before it is asked again.
METRICS_RETRY_S = 60.0
#: Label sets of the series read beyond which a reading is not vLLM's (it has one per
#: engine core and model): parsing 100,000 of them takes seconds.
MAX_LABEL_SETS = 4096
#: vLLM's gauges of the requests it runs and of those queued behind them.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def parse_queue(text: str) -> tuple[int, int] | None:
    """Running and waiting requests in vLLM's Prometheus ``text``, each summed over label sets.

    Only the two gauges' lines are parsed (a whole ``/metrics`` costs far more).
    None: there is no running gauge (not vLLM, or not Prometheus text at all).

    Raises:
        ValueError: a gauge's line or value is malformed or not finite, or there
            are more than :data:`MAX_LABEL_SETS` of their lines.
    """
    # Imported here: a process that reads no load (and has no metrics sink) loads no Prometheus.
    from prometheus_client.parser import text_string_to_metric_families

    wanted = _lines(text, (RUNNING, WAITING))
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            if sample.name in (RUNNING, WAITING):
                if not math.isfinite(sample.value):
                    raise ValueError(f"{sample.name} is {sample.value}")
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    if RUNNING not in totals:
        return None
    return max(0, round(totals[RUNNING])), max(0, round(totals.get(WAITING, 0.0)))


def parse_cost(text: str) -> dict[str, float]:
    """vLLM's step-cost series in Prometheus ``text`` (``engine_cost.COST_SERIES``).

    Only their lines are parsed; none (an empty reading) where one is malformed
    or there are more than :data:`MAX_LABEL_SETS` of them.
    """
    from prometheus_client.parser import text_string_to_metric_families

    try:
        wanted = _lines(text, _COST_PREFIXES)
        return cost_counters(
            (s.name, s.value) for f in text_string_to_metric_families(wanted) for s in f.samples
        )
    except ValueError:
        return {}


_COST_PREFIXES = tuple(f"{name}{end}" for name in COST_SERIES for end in ("{", " "))


def _lines(text: str, prefixes: tuple[str, ...]) -> str:
    """The lines of ``text`` that start with one of ``prefixes``.

    Raises:
        ValueError: more than :data:`MAX_LABEL_SETS` of them.
    """
    lines = [line for line in text.splitlines() if line.startswith(prefixes)]
    if len(lines) > MAX_LABEL_SETS:
        names = sorted({p.rstrip("{ ") for p in prefixes})
        raise ValueError(
            f"{len(lines):,} label sets of {', '.join(names)}, more than {MAX_LABEL_SETS:,}: "
            "not vLLM's"
        )
    return "\n".join(lines)


def _read_metrics(body: bytes) -> tuple[tuple[int, int] | None, dict[str, float]]:
    """The load gauges and step-cost series of a ``/metrics`` body (run in a worker thread).

    Raises:
        ValueError: as :func:`parse_queue`.
    """
    text = body.decode("utf-8", errors="replace")
    queue = parse_queue(text)
    return queue, {} if queue is None else parse_cost(text)


def _described(exc: BaseException | None) -> str:
    """What went wrong, never empty: httpx's timeouts carry no message of their own."""
    if exc is None:
        return "none answered"
    text = str(exc)
    if isinstance(exc, httpx2.TimeoutException):
        return f"no answer in time ({type(exc).__name__}{': ' + text if text else ''})"
    return text or type(exc).__name__


class Upstreams:
    """The replicas of one engine, the pool that reaches them and their probes.

    ``urls`` may carry credentials (:func:`split_credentials`); a forwarded reply
    may stay silent for ``timeouts``' stall timeout, else for a call's;
    ``transport`` replaces the network (tests, ASGI apps); ``sink`` hears of the
    replicas and their states.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        api_key: str | None,
        timeouts: Timeouts,
        limits: Limits,
        health: Health,
        transport: httpx2.AsyncBaseTransport | None,
        sink: Stats = NO_STATS,
    ) -> None:
        bases = [split_credentials(u) for u in urls]
        self.replicas = ReplicaSet(
            [base for base, _ in bases],
            failure_threshold=health.failure_threshold,
            affinity_slack=health.affinity_slack,
        )
        self.report_to(sink)
        urls = [r.url for r in self.replicas.replicas]
        credentials = {base: auth for base, auth in bases if auth}
        self.pool = HttpPool(
            urls,
            limits.connections,
            api_key=api_key,
            connect_timeout=timeouts.connect,
            stall_timeout=timeouts.stall,
            transport=transport,
            credentials=credentials,
            max_response_bytes=limits.response_bytes,
        )
        # GET /metrics goes over one connection of its own per replica, made when first read.
        self._metrics: HttpPool | None = None

        def metrics_pool() -> HttpPool:
            return HttpPool(
                urls,
                1,
                api_key=api_key,
                connect_timeout=timeouts.connect,
                transport=transport,
                credentials=credentials,
                max_response_bytes=METRICS_BYTES,
            )

        self._metrics_pool = metrics_pool
        self._shared_transport = transport is not None  # self.pool closes it
        self._no_metrics_until: dict[str, float] = {}
        #: Each replica's last reading of vLLM's step-cost series, until taken: the series,
        #: when they came (monotonic seconds) and since when the replica had been busy then.
        self.cost_readings: dict[str, tuple[dict[str, float], float, float | None]] = {}
        self._no_metrics_logged: set[str] = set()
        # prompt digest -> its token count, for upstreams whose streams carry no usage
        self._prompt_counts: ByteLRU[bytes, int] = ByteLRU(PROMPT_COUNT_BYTES)
        self.closed = False
        self._probe_interval = health.probe_interval
        self._forward_timeout = timeouts.stall or timeouts.call
        self._probe_task: asyncio.Task[None] | None = None

    def report_to(self, sink: Stats) -> None:
        """Announces every replica to ``sink`` and reports their states there from now on."""
        for replica in self.replicas.replicas:
            sink.upstream_configured(replica.url)
        self.replicas.report_to(sink)

    def failed(self, replica: Replica) -> None:
        """Counts a failure of ``replica``; an opened breaker starts the probes."""
        if self.replicas.record_failure(replica):
            _log.warning(
                "upstream %s: circuit breaker open after %d failures", replica.url, replica.failures
            )
            if not self.closed and (self._probe_task is None or self._probe_task.done()):
                self._probe_task = asyncio.get_running_loop().create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        while self.replicas.recovering():
            await asyncio.sleep(self._probe_interval)
            await asyncio.gather(*(self._probe(r) for r in self.replicas.to_probe()))

    async def _probe(self, replica: Replica) -> None:
        try:
            response = await self.pool.get(replica.url, "/models", SIDE_TIMEOUT)
        except httpx2.HTTPError:
            return
        if response.status_code == 200 and self.replicas.record_probe(replica):
            _log.info("upstream %s answers probes: circuit breaker half-open", replica.url)

    async def queue(self, replica: Replica) -> tuple[int, int] | None:
        """``replica``'s running and waiting requests, from vLLM's gauges at its ``/metrics``.

        None, without I/O, while the replica is left alone; None too when it answers
        no vLLM gauges within the bounds: it is then left alone for
        :data:`METRICS_RETRY_S` (logged at info level the first time, debug after).
        """
        loop = asyncio.get_running_loop()
        if self.closed or self._no_metrics_until.get(replica.url, -math.inf) > loop.time():
            return None
        if self._metrics is None:
            self._metrics = self._metrics_pool()
        url = replica.url.removesuffix("/v1") + "/metrics"
        reason: object = "no vLLM gauges"
        try:
            get = self._metrics.side(replica.url, url, None, SIDE_TIMEOUT)
            response = await within(get, SIDE_TIMEOUT)  # a body that trickles in, too
            read_at, busy_since = time.monotonic(), replica.busy.since
            response.raise_for_status()
            # Parsed off the loop: a body of many label sets takes a while even within its cap.
            queue, cost = await asyncio.to_thread(_read_metrics, response.content)
            if queue is not None:
                self.cost_readings[replica.url] = (cost, read_at, busy_since)
        except (httpx2.HTTPError, DeadlinePassed, ValueError) as exc:
            queue, reason = None, exc
        if queue is not None:
            return queue
        self._no_metrics_until[replica.url] = loop.time() + METRICS_RETRY_S
        level = logging.DEBUG if replica.url in self._no_metrics_logged else logging.INFO
        self._no_metrics_logged.add(replica.url)
        _log.log(
            level,
            "upstream %s: no load at %s (%s); counted as this process's own, asked again in %g s",
            replica.url,
            url,
            reason,
            METRICS_RETRY_S,
        )
        return None

    def health(self) -> EngineHealth:
        """Per-replica health from the last outcomes and probes; no I/O."""
        upstreams = self.replicas.snapshot()
        if self.closed:
            upstreams = dict.fromkeys(upstreams, False)
        return EngineHealth(healthy=any(upstreams.values()), upstreams=upstreams)

    async def models(self) -> list[str]:
        """Union of the ``GET /models`` ids of all replicas, in first-seen order.

        Raises:
            EngineUnavailable: no replica listed its models within 5 s.
        """
        listed = await asyncio.gather(*(self._list_models(r) for r in self.replicas.replicas))
        if all(ids is None for ids in listed):
            raise EngineUnavailable("no upstream listed its models")
        return list(dict.fromkeys(i for ids in listed if ids for i in ids))

    async def _list_models(self, replica: Replica) -> list[str] | None:
        try:
            response = await self.pool.get(replica.url, "/models", SIDE_TIMEOUT)
            response.raise_for_status()
            data = response.json()["data"]
            return [m["id"] for m in data if isinstance(m.get("id"), str)]
        except (httpx2.HTTPError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return None

    async def prompt_tokens(self, path: str, body: dict[str, Any], key: str | None) -> int | None:
        """The token count of ``body``'s prompt, from a one-token non-streamed request.

        An upstream whose streams carry no usage (llama.cpp's server ignores
        ``stream_options``) reports prompt tokens only unstreamed; the count is
        asked once per prompt. None: it could not be had (accounting never
        fails a call).
        """
        probe = encode({**body, "max_tokens": 1})
        digest = hashlib.blake2b(probe, digest_size=16).digest()
        count = self._prompt_counts.get(digest)
        if count is not None:
            return count
        replica = self.replicas.pick(key, rotate=False)
        if replica is None:
            return None
        try:
            response = await self.pool.post(replica.url, path, probe)
            response.raise_for_status()
            count = parse_samples(response.json(), path == CHAT, replica.url)[0].prompt_tokens
        except (httpx2.HTTPError, ValueError, EngineProtocolError, RecursionError) as exc:
            _log.debug("upstream %s: no prompt token count: %s", replica.url, type(exc).__name__)
            return None
        self._prompt_counts.put(digest, count)
        return count

    async def forward(self, path: str, body: Mapping[str, Any]) -> UpstreamReply:
        """Sends ``body`` to one replica's ``path`` as is and passes its reply on.

        A replica that cannot be reached is failed over before any byte comes
        back; the reply itself, errors included, is the upstream's.

        Raises:
            EngineUnavailable: no replica could be reached.
            InvalidRequest: ``path`` is not a completions path.
        """
        if path not in (CHAT, COMPLETIONS):
            raise InvalidRequest(f"cannot forward {path!r}", param="path")
        if self.closed:
            raise EngineUnavailable("the engine is closed")
        encoded = encode(dict(body))
        tried: list[Replica] = []
        last: Exception | None = None
        while (replica := self.replicas.acquire(None, 1, tried)) is not None:
            if replica in tried:
                self.replicas.release(replica)
                break
            tried.append(replica)
            try:
                raw, shard = await self.pool.open(replica.url, path, encoded, self._forward_timeout)
            except httpx2.HTTPError as exc:
                self.replicas.release(replica)
                if not isinstance(exc, httpx2.PoolTimeout):  # our pool's fault, not the replica's
                    self.failed(replica)
                last = exc
                continue
            if raw.status_code >= 500:
                self.failed(replica)
            else:
                self.replicas.record_success(replica)
            return UpstreamReply(
                raw.status_code,
                raw.headers.get("content-type", "application/json"),
                self._relay(raw, replica, shard),
            )
        raise EngineUnavailable(f"no upstream could take the request: {_described(last)}") from last

    async def _relay(
        self, raw: httpx2.Response, replica: Replica, shard: int
    ) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.pool.capped(raw.aiter_raw(), raw.request):
                yield chunk
        finally:
            await raw.aclose()
            self.pool.done(replica.url, shard)
            self.replicas.release(replica)

    async def tokenizer(self, path: str, body: Mapping[str, Any] | None) -> UpstreamReply:
        """vLLM's tokenizer endpoint ``path`` at a healthy replica's root, its reply as is.

        Raises:
            EngineUnavailable: no replica could be reached.
            InvalidRequest: ``path`` is not a tokenizer endpoint.
        """
        if path not in TOKENIZER_PATHS:
            raise InvalidRequest(f"cannot forward {path!r}", param="path")
        replica = self.replicas.pick(None)
        if replica is None or self.closed:
            raise EngineUnavailable("no upstream can take the request")
        url = replica.url.removesuffix("/v1") + path
        content = None if body is None else encode(dict(body))
        try:
            raw = await self.pool.side(replica.url, url, content, SIDE_TIMEOUT)
        except httpx2.HTTPError as exc:
            raise EngineUnavailable(f"{url}: {_described(exc)}") from exc
        return UpstreamReply(
            raw.status_code, raw.headers.get("content-type", "application/json"), once(raw.content)
        )

    async def aclose(self) -> None:
        """Stops the probe task and closes the connection pools."""
        self.closed = True
        task, self._probe_task = self._probe_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        metrics, self._metrics = self._metrics, None
        if metrics is not None and not self._shared_transport:
            await metrics.aclose()
        await self.pool.aclose()
