"""An OpenAI engine's replicas: connections, probes, pass-through, prompt token counts.

Balancing, affinity and the circuit breaker rules live in
:mod:`blendserve.engines._replicas`; this module does the I/O around them. A
replica whose breaker is open (or half-open with its trials in flight) is
probed with ``GET {url}/models`` every ``health.probe_interval`` seconds by a
background task that runs only while some breaker is not closed; a 200
half-opens it (or admits one more trial).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx2

from blendserve._byte_lru import ByteLRU
from blendserve.engines._http_pool import HttpPool
from blendserve.engines._replicas import Replica, ReplicaSet
from blendserve.engines.base import EngineHealth, UpstreamReply
from blendserve.engines.config import Health, Limits, Timeouts
from blendserve.engines.openai_wire import (
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

__all__ = ["PROMPT_COUNT_BYTES", "SIDE_TIMEOUT", "Upstreams"]

_log = logging.getLogger(__name__)

SIDE_TIMEOUT = 5.0  # GET /models (models(), probes) and tokenizer endpoints
#: Bytes of prompt token counts kept for upstreams without stream usage (about 250 each).
PROMPT_COUNT_BYTES = 1 << 20


class Upstreams:
    """The replicas of one engine, the pool that reaches them and their probes.

    Args:
        urls: base URLs of the replicas (see :func:`split_credentials`).
        api_key: sent as ``Authorization: Bearer`` (see :class:`HttpPool`).
        timeouts: connects and stalls; a forwarded reply may stay silent for the
            stall timeout, else for a call's.
        limits: connections per replica and the largest response body.
        health: when a replica's breaker opens and how often it is probed.
        transport: custom httpx2 transport (tests, ASGI apps).
        sink: where the replicas' configuration and states are reported.
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
        self.pool = HttpPool(
            [r.url for r in self.replicas.replicas],
            limits.connections,
            api_key=api_key,
            connect_timeout=timeouts.connect,
            stall_timeout=timeouts.stall,
            transport=transport,
            credentials={base: auth for base, auth in bases if auth},
            max_response_bytes=limits.response_bytes,
        )
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
        except (httpx2.HTTPError, ValueError, KeyError, TypeError, AttributeError):
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
        except (httpx2.HTTPError, ValueError, EngineProtocolError) as exc:
            _log.debug("upstream %s: no prompt token count: %s", replica.url, exc)
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
        raise EngineUnavailable(f"no upstream could take the request: {last}") from last

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
            raise EngineUnavailable(f"{url}: {exc}") from exc
        return UpstreamReply(
            raw.status_code, raw.headers.get("content-type", "application/json"), once(raw.content)
        )

    async def aclose(self) -> None:
        """Stops the probe task and closes the connection pool."""
        self.closed = True
        task, self._probe_task = self._probe_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        await self.pool.aclose()
