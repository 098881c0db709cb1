"""Engine over OpenAI-compatible HTTP upstreams (vLLM, SGLang, llama.cpp, ...).

One :class:`OpenAIEngine` talks to one or more data-parallel replicas of the
same model over pooled keep-alive connections (httpx transports, at most
``max_connections`` per replica; :class:`_Pool` says why not one
``httpx.AsyncClient``). A request with ``messages`` goes to
``{url}/chat/completions``, one with ``prompt`` to ``{url}/completions``;
``mode`` only tells callers which kind to build. Base URLs are normalised to
end in ``/v1``: ``http://host:8000``, ``http://host:8000/`` and
``http://host:8000/v1`` are the same upstream. ``model=None`` leaves the
``model`` field out (vLLM and llama.cpp then use the model they serve).

Contract, beyond :class:`~blendserve.engines.base.Engine`:

* ``n`` samples come from one request with ``n`` where the upstream honours
  it. An upstream that returns fewer choices than asked (llama.cpp ignores
  ``n``) is remembered as not honouring ``n``; the missing samples are topped
  up with single requests, and later calls to it send ``n`` single requests.
  Single requests carry distinct seeds: ``seed + i`` for the ``i``-th sample
  when a seed was given, else random distinct seeds. A call returns exactly
  ``n`` samples or raises; samples of a failed call are dropped, never reused.
* Samples carry the upstream's usage. With ``stream``, an upstream whose
  streams carry no usage (llama.cpp's server) is asked for a prompt's token
  count once, by a one-token non-streamed request, and the count is kept.
* 429, 5xx and transport errors are retried at most ``max_retries`` times. A
  retry goes at once to a healthy replica this call has not tried, if any;
  otherwise it waits a jittered exponential backoff, or ``Retry-After`` when
  given (capped at 30 s); a ``Retry-After`` longer than ``max_retry_after``
  ends the call at once instead. Other statuses are not retried.
* A response body over ``max_response_bytes`` (an upstream that never stops
  streaming, a runaway completion) fails the attempt as unusable; a forwarded
  reply is cut off there.
* Credentials in a base URL (``http://user:password@host/v1``) are sent as
  HTTP basic auth to that replica and never shown: replicas are named by
  their URL without them (``/health``, metrics labels, error messages).
* Errors: :class:`~blendserve.errors.EngineTimeout` when the call's deadline
  (``request.timeout`` or the engine's ``timeout``, covering retries) passes;
  :class:`~blendserve.errors.EngineUnavailable` when retries are exhausted or
  every replica is out; :class:`~blendserve.errors.EngineProtocolError` for
  other statuses and unusable bodies. The httpx error is the ``__cause__``.
* Replicas: see :mod:`blendserve.engines._replicas` for the balancing,
  affinity and circuit breaker rules. A replica whose breaker is open (or
  half-open with its trials in flight) is probed with ``GET {url}/models``
  every ``probe_interval`` seconds by a background task that runs only while
  some breaker is not closed; a 200 half-opens it (or admits one more trial),
  and a trial request closes or reopens it.
  While no replica is available a call fails at once with
  :class:`~blendserve.errors.EngineUnavailable`, without waiting a backoff.
* Cancelling ``generate`` closes its in-flight HTTP requests.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import email.utils
import hashlib
import json
import logging
import math
import random
import time
import urllib.parse
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

import httpx

from blendserve import metrics
from blendserve.engines._replicas import Replica, ReplicaSet
from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample, UpstreamReply
from blendserve.errors import (
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    RequestValidationError,
)

__all__ = ["OpenAIEngine", "normalise_base_url", "split_credentials"]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

_CHAT = "/chat/completions"
_COMPLETIONS = "/completions"
_MAX_BACKOFF = 10.0
_MAX_RETRY_AFTER = 30.0
_TOKENIZER_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")  # vLLM's, at the root
_SIDE_TIMEOUT = 5.0  # GET /models (models(), probes) and tokenizer endpoints
_SHARD_CONNECTIONS = 2  # measured: 1-4 alike, 8 costs 1.4x CPU, 16 costs 3x
_SEED_SPACE = 2**31 - 1
# The engine sets these itself: an override would break sample accounting.
_ENGINE_OWNED = frozenset({"n", "seed", "stream"})
_PROMPT_COUNTS = 1024  # prompt token counts kept for upstreams without stream usage


def normalise_base_url(url: str) -> str:
    """Returns ``url`` without a trailing slash and ending in ``/v1``.

    Raises:
        ValueError: not an absolute http(s) URL.
    """
    base = url.strip().rstrip("/")
    try:
        parsed = httpx.URL(base)
    except httpx.InvalidURL as exc:
        raise ValueError(f"not an http(s) base URL: {_without_userinfo(url)!r}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"not an http(s) base URL: {_without_userinfo(url)!r}")
    return base if base.endswith("/v1") else base + "/v1"


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}" if sep else url


def split_credentials(url: str) -> tuple[str, str | None]:
    """``url`` normalised and without its userinfo, and the ``Authorization`` it stands for.

    ``http://user:pw@host:8000`` gives ``("http://host:8000/v1", "Basic dXNlcjpwdw==")``;
    a URL without userinfo gives None.

    Raises:
        ValueError: not an absolute http(s) URL.
    """
    base = normalise_base_url(url)
    parsed = httpx.URL(base)
    if not parsed.userinfo:
        return base, None
    user = urllib.parse.unquote(parsed.username)
    secret = f"{user}:{urllib.parse.unquote(parsed.password or '')}".encode()
    return str(parsed.copy_with(username=None, password=None)), (
        "Basic " + base64.b64encode(secret).decode()
    )


class OpenAIEngine(Engine):
    """Samples from OpenAI-compatible upstreams serving the same model.

    Args:
        urls: base URLs of data-parallel replicas, with or without ``/v1``.
        model: default ``model`` field (None: omitted, the upstream's default).
        api_key: sent as ``Authorization: Bearer``.
        mode: ``chat`` or ``completions``, the request kind callers should
            build by default; both kinds are always served.
        timeout: default deadline of a ``generate`` call, retries included.
        connect_timeout: TCP connect timeout of one attempt.
        max_retries: retries after the first attempt.
        backoff_base: first backoff in seconds, doubled per retry (capped at
            10 s) with jitter.
        max_connections: keep-alive connections per replica.
        n_support: ``auto`` detects per replica whether ``n`` is honoured;
            ``yes`` always sends ``n``; ``no`` always sends ``n`` single requests.
        transport: custom httpx transport (tests, ASGI apps).
        failure_threshold: consecutive failures that open a replica's breaker.
        probe_interval: seconds between probes of replicas whose breaker is open.
        affinity_slack: outstanding sequences a question's home replica may
            carry over the least-loaded one and still be chosen.
        stream: request streamed responses, so a cancelled call stops generating.
        stall_timeout: with ``stream``, an attempt whose upstream sends nothing
            for this many seconds fails (a hung upstream) and is retried
            elsewhere; None: only the call's deadline bounds it.
        session_header: a header carrying the question id on every request, for
            a router in front of several replicas that routes on it (vLLM
            production-stack's session routing).
        max_response_bytes: the largest upstream response body read.
        max_retry_after: the longest ``Retry-After`` waited for; an upstream
            asking for longer fails the call at once (a job's own failure
            timeout then decides, not the upstream).
    """

    name = "openai"

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        mode: Literal["chat", "completions"] = "chat",
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        max_retries: int = 3,
        backoff_base: float = 0.2,
        max_connections: int = 256,
        n_support: Literal["auto", "yes", "no"] = "auto",
        transport: httpx.AsyncBaseTransport | None = None,
        failure_threshold: int = 3,
        probe_interval: float = 2.0,
        affinity_slack: int = 4,
        stream: bool = False,
        stall_timeout: float | None = None,
        session_header: str | None = None,
        max_response_bytes: int = 64 << 20,
        max_retry_after: float = _MAX_RETRY_AFTER,
    ) -> None:
        if isinstance(urls, str):
            raise TypeError("urls must be a sequence of URLs, not one string")
        if mode not in ("chat", "completions"):
            raise ValueError(f"mode must be 'chat' or 'completions', got {mode!r}")
        if n_support not in ("auto", "yes", "no"):
            raise ValueError(f"n_support must be 'auto', 'yes' or 'no', got {n_support!r}")
        for label, value in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
            ("probe_interval", probe_interval),
        ):
            if not value > 0:
                raise ValueError(f"{label} must be positive, got {value}")
        if stall_timeout is not None and not (stream and stall_timeout > 0):
            raise ValueError(f"stall_timeout needs stream=True and > 0, got {stall_timeout}")
        if max_retries < 0 or backoff_base < 0 or max_connections < 1:
            raise ValueError("max_retries and backoff_base must be >= 0, max_connections >= 1")
        if max_response_bytes < 1 or max_retry_after < 0:
            raise ValueError("max_response_bytes must be >= 1, max_retry_after >= 0")
        bases = [split_credentials(u) for u in urls]
        self._replicas = ReplicaSet(
            [base for base, _ in bases],
            failure_threshold=failure_threshold,
            affinity_slack=affinity_slack,
        )
        for replica in self._replicas.replicas:
            metrics.upstream_configured(replica.url)
        self._model = model
        self._mode: Literal["chat", "completions"] = mode
        self._timeout = timeout
        self._max_retries = max_retries
        self._backoff_base = backoff_base
        self._n_support = n_support
        self._stream = stream
        self._session_header = session_header
        self._probe_interval = probe_interval
        self._max_retry_after = max_retry_after
        self._forward_timeout = stall_timeout or timeout
        self._rng = random.Random()
        # prompt digest -> its token count, for upstreams whose streams carry no usage
        self._prompt_counts: dict[bytes, int] = {}
        self._probe_task: asyncio.Task[None] | None = None
        self._closed = False
        self._pool = _Pool(
            [r.url for r in self._replicas.replicas],
            max_connections,
            api_key=api_key,
            connect_timeout=connect_timeout,
            stall_timeout=stall_timeout,
            transport=transport,
            credentials={base: auth for base, auth in bases if auth},
            max_response_bytes=max_response_bytes,
        )

    @property
    def mode(self) -> Literal["chat", "completions"]:
        """The request kind callers should build by default."""
        return self._mode

    @property
    def urls(self) -> list[str]:
        """Normalised replica base URLs, in configuration order."""
        return [r.url for r in self._replicas.replicas]

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
        """Returns exactly ``request.n`` samples; see the module docstring.

        Raises:
            EngineTimeout: the deadline passed.
            EngineUnavailable: no replica could serve, or the engine is closed.
            EngineProtocolError: an upstream answered unusably.
            RequestValidationError: ``params.extra`` sets ``n``, ``seed`` or
                ``stream``.
        """
        if self._closed:
            raise EngineUnavailable("the engine is closed")
        body = self._body(request)
        timeout = self._timeout if request.timeout is None else request.timeout
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            return await _within(self._generate(request, body, deadline), timeout)
        except _DeadlinePassed as exc:
            raise EngineTimeout(f"no {request.n} samples within {timeout:g} s") from exc

    def _body(self, request: GenerateRequest) -> dict[str, Any]:
        params = request.params
        body: dict[str, Any] = {}
        model = self._model if request.model is None else request.model
        if model is not None:
            body["model"] = model
        if request.messages is not None:
            body["messages"] = [dict(m) for m in request.messages]
        else:
            body["prompt"] = request.prompt
        for key, value in (
            ("temperature", params.temperature),
            ("top_p", params.top_p),
            ("max_tokens", params.max_tokens),
            ("top_k", params.top_k),
            ("min_p", params.min_p),
        ):
            if value is not None:
                body[key] = value
        if params.stop is not None:
            body["stop"] = list(params.stop)
        owned = sorted(_ENGINE_OWNED.intersection(params.extra))
        if owned:
            raise RequestValidationError(
                f"params.extra may not set {owned[0]!r}: use GenerateRequest.n / params.seed",
                param=f"params.extra.{owned[0]}",
            )
        body.update(params.extra)
        return body

    async def _generate(
        self, request: GenerateRequest, body: dict[str, Any], deadline: float
    ) -> list[Sample]:
        n = request.n
        path = _CHAT if request.messages is not None else _COMPLETIONS
        key = request.question_id
        seed = request.params.seed
        if n > 1 and self._send_singles(key):
            samples = await self._fan_out(path, body, key, self._seeds(seed, 0, n), deadline)
        else:
            samples = await self._fetch(path, body, n, seed, key, deadline)
            if len(samples) < n:
                seeds = self._seeds(seed, len(samples), n - len(samples))
                samples += await self._fan_out(path, body, key, seeds, deadline)
        if self._stream and not all(s.prompt_tokens for s in samples):
            samples = await self._with_prompt_tokens(path, body, key, samples)
        return samples

    async def _with_prompt_tokens(
        self, path: str, body: dict[str, Any], key: str | None, samples: list[Sample]
    ) -> list[Sample]:
        """``samples`` with their prompt's token count, from a one-token non-streamed request.

        An upstream whose streams carry no usage (llama.cpp's server ignores
        ``stream_options``) reports prompt tokens only unstreamed; the count is
        asked once per prompt. A failed count leaves the samples as they are:
        accounting never fails a call.
        """
        probe = _encode({**body, "max_tokens": 1})
        digest = hashlib.blake2b(probe, digest_size=16).digest()
        count = self._prompt_counts.get(digest)
        if count is None:
            replica = self._replicas.pick(key, rotate=False)
            if replica is None:
                return samples
            try:
                response = await self._pool.post(replica.url, path, probe)
                response.raise_for_status()
                count = _samples(response.json(), path == _CHAT, replica.url)[0].prompt_tokens
            except (httpx.HTTPError, ValueError, EngineProtocolError) as exc:
                _log.debug("upstream %s: no prompt token count: %s", replica.url, exc)
                return samples
            if len(self._prompt_counts) >= _PROMPT_COUNTS:
                del self._prompt_counts[next(iter(self._prompt_counts))]  # the oldest
            self._prompt_counts[digest] = count
        return [
            s if s.prompt_tokens else dataclasses.replace(s, prompt_tokens=count) for s in samples
        ]

    def _send_singles(self, key: str | None) -> bool:
        if self._n_support != "auto":
            return self._n_support == "no"
        home = self._replicas.pick(key, rotate=False)
        return home is not None and home.n_honoured is False

    def _seeds(self, seed: int | None, start: int, count: int) -> list[int]:
        if seed is not None:
            return [seed + start + i for i in range(count)]
        return self._rng.sample(range(_SEED_SPACE), count)

    async def _fan_out(
        self, path: str, body: dict[str, Any], key: str | None, seeds: list[int], deadline: float
    ) -> list[Sample]:
        results = await _all_or_cancel(
            [self._fetch(path, body, 1, seed, key, deadline) for seed in seeds]
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
    ) -> list[Sample]:
        """One logical request for ``want`` samples, retried; 1..want samples back."""
        payload = dict(body)
        if want > 1:
            payload["n"] = want
        if seed is not None:
            payload["seed"] = seed
        if self._stream:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
        encoded = _encode(payload)
        session = ((self._session_header, key),) if self._session_header and key else ()
        loop = asyncio.get_running_loop()
        tried: list[Replica] = []
        last: Exception | None = None
        for attempt in range(self._max_retries + 1):
            replica = self._replicas.acquire(key, want, tried)
            if replica is None:
                raise EngineUnavailable(
                    "every upstream is marked unhealthy (circuit breaker open)"
                ) from last
            wait: float | None = None
            if attempt:
                metrics.UPSTREAM_RETRIES.labels(replica.url).inc()
            metrics.UPSTREAM_SAMPLES.labels(replica.url, "dispatched").inc(want)
            sent = time.monotonic()
            try:
                try:
                    response = await self._pool.post(
                        replica.url, path, encoded, self._stream, session
                    )
                finally:
                    self._replicas.release(replica, want)
            except httpx.TransportError as exc:
                metrics.UPSTREAM_SAMPLES.labels(replica.url, "failed").inc(want)
                self._failed(replica)
                last = exc
            except httpx.RequestError as exc:
                metrics.UPSTREAM_SAMPLES.labels(replica.url, "failed").inc(want)
                raise EngineProtocolError(f"{replica.url}: unusable response: {exc}") from exc
            except BaseException:  # cancelled: not the upstream's failure
                metrics.UPSTREAM_SAMPLES.labels(replica.url, "cancelled").inc(want)
                raise
            else:
                status = response.status_code
                if 200 <= status < 300:
                    self._replicas.record_success(replica)
                    samples = self._parse(response, path == _CHAT, want, replica)
                    metrics.UPSTREAM_SAMPLES.labels(replica.url, "completed").inc(len(samples))
                    metrics.UPSTREAM_LATENCY.labels(replica.url).observe(time.monotonic() - sent)
                    return samples
                last = httpx.HTTPStatusError(
                    f"{replica.url}{path} answered {status}: {_error_message(response)}",
                    request=response.request,
                    response=response,
                )
                metrics.UPSTREAM_SAMPLES.labels(replica.url, "failed").inc(want)
                if status != 429 and status < 500:
                    self._replicas.record_success(replica)
                    raise EngineProtocolError(str(last)) from last
                if status >= 500:
                    self._failed(replica)
                wait = _retry_after(response)
            tried.append(replica)
            if attempt == self._max_retries:
                break
            if self._replicas.has_untried(tried):
                continue
            if self._replicas.pick(key, rotate=False) is None:
                continue  # every breaker is open: the next acquire fails now, no backoff
            if wait is not None and wait > self._max_retry_after:
                break  # the upstream asks for longer than a retry may wait
            delay = self._backoff(attempt) if wait is None else wait
            if loop.time() + delay >= deadline:
                break
            await asyncio.sleep(delay)
        raise _exhausted(last, len(tried)) from last

    def _backoff(self, attempt: int) -> float:
        ceiling = min(_MAX_BACKOFF, self._backoff_base * 2.0**attempt)
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def _parse(
        self, response: httpx.Response, chat: bool, want: int, replica: Replica
    ) -> list[Sample]:
        try:
            payload = response.json()
        except ValueError as exc:
            raise EngineProtocolError(
                f"{replica.url}: response is not JSON: {response.text[:200]!r}"
            ) from exc
        samples = _samples(payload, chat, replica.url)
        if len(samples) > want:
            raise EngineProtocolError(f"{replica.url}: {len(samples)} choices for n={want}")
        if want > 1 and self._n_support == "auto":
            replica.n_honoured = len(samples) == want
        return samples

    # -- passthrough -------------------------------------------------------------

    async def forward(self, path: str, body: Mapping[str, Any]) -> UpstreamReply:
        """Sends ``body`` to one replica's ``path`` as is and passes its reply on.

        A replica that cannot be reached is failed over before any byte comes
        back; the reply itself, errors included, is the upstream's.

        Raises:
            EngineUnavailable: no replica could be reached.
            RequestValidationError: ``path`` is not a completions path.
        """
        if path not in (_CHAT, _COMPLETIONS):
            raise RequestValidationError(f"cannot forward {path!r}", param="path")
        if self._closed:
            raise EngineUnavailable("the engine is closed")
        encoded = _encode(dict(body))
        tried: list[Replica] = []
        last: Exception | None = None
        while (replica := self._replicas.acquire(None, 1, tried)) is not None:
            if replica in tried:
                self._replicas.release(replica)
                break
            tried.append(replica)
            try:
                raw, shard = await self._pool.open(
                    replica.url, path, encoded, self._forward_timeout
                )
            except httpx.HTTPError as exc:
                self._replicas.release(replica)
                self._failed(replica)
                last = exc
                continue
            if raw.status_code >= 500:
                self._failed(replica)
            else:
                self._replicas.record_success(replica)
            return UpstreamReply(
                raw.status_code,
                raw.headers.get("content-type", "application/json"),
                self._relay(raw, replica, shard),
            )
        raise EngineUnavailable(f"no upstream could take the request: {last}") from last

    async def _relay(
        self, raw: httpx.Response, replica: Replica, shard: int
    ) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._pool.capped(raw.aiter_raw(), raw.request):
                yield chunk
        finally:
            await raw.aclose()
            self._pool.done(replica.url, shard)
            self._replicas.release(replica)

    async def tokenizer(self, path: str, body: Mapping[str, Any] | None) -> UpstreamReply:
        """vLLM's tokenizer endpoint ``path`` at a healthy replica's root, its reply as is.

        Raises:
            EngineUnavailable: no replica could be reached.
            RequestValidationError: ``path`` is not a tokenizer endpoint.
        """
        if path not in _TOKENIZER_PATHS:
            raise RequestValidationError(f"cannot forward {path!r}", param="path")
        replica = self._replicas.pick(None)
        if replica is None or self._closed:
            raise EngineUnavailable("no upstream can take the request")
        url = replica.url.removesuffix("/v1") + path
        content = None if body is None else _encode(dict(body))
        try:
            raw = await self._pool.side(replica.url, url, content, _SIDE_TIMEOUT)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{url}: {exc}") from exc
        return UpstreamReply(
            raw.status_code, raw.headers.get("content-type", "application/json"), _once(raw.content)
        )

    # -- health ------------------------------------------------------------------

    def _failed(self, replica: Replica) -> None:
        if self._replicas.record_failure(replica):
            _log.warning(
                "upstream %s: circuit breaker open after %d failures", replica.url, replica.failures
            )
            if not self._closed and (self._probe_task is None or self._probe_task.done()):
                self._probe_task = asyncio.get_running_loop().create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        while self._replicas.recovering():
            await asyncio.sleep(self._probe_interval)
            await asyncio.gather(*(self._probe(r) for r in self._replicas.to_probe()))

    async def _probe(self, replica: Replica) -> None:
        try:
            response = await self._pool.get(replica.url, "/models", _SIDE_TIMEOUT)
        except httpx.HTTPError:
            return
        if response.status_code == 200 and self._replicas.record_probe(replica):
            _log.info("upstream %s answers probes: circuit breaker half-open", replica.url)

    async def health(self) -> EngineHealth:
        """Per-replica health from the last outcomes and probes; no I/O."""
        upstreams = self._replicas.snapshot()
        if self._closed:
            upstreams = dict.fromkeys(upstreams, False)
        return EngineHealth(healthy=any(upstreams.values()), upstreams=upstreams)

    async def models(self) -> list[str]:
        """Union of the ``GET /models`` ids of all replicas, in first-seen order.

        Raises:
            EngineUnavailable: no replica listed its models within 5 s.
        """
        listed = await asyncio.gather(*(self._list_models(r) for r in self._replicas.replicas))
        if all(ids is None for ids in listed):
            raise EngineUnavailable("no upstream listed its models")
        return list(dict.fromkeys(i for ids in listed if ids for i in ids))

    async def _list_models(self, replica: Replica) -> list[str] | None:
        try:
            response = await self._pool.get(replica.url, "/models", _SIDE_TIMEOUT)
            response.raise_for_status()
            data = response.json()["data"]
            return [m["id"] for m in data if isinstance(m.get("id"), str)]
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return None

    async def aclose(self) -> None:
        """Stops the probe task and closes the connection pool."""
        self._closed = True
        task, self._probe_task = self._probe_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        await self._pool.aclose()


class _Pool:
    """Keep-alive connections to each replica, at most ``max_connections`` per replica.

    Two measured costs shape this. httpcore's pool does work (a socket poll
    included) for every connection it holds each time a request starts or
    ends, so one pool of hundreds of connections spends more CPU per request
    than the exchange itself: each replica's connections are split into
    pools of ``_SHARD_CONNECTIONS`` and a request takes the least busy pool of
    its replica (per replica, so that no pool closes a connection to one
    replica to open one to another). And ``httpx.AsyncClient`` (URL merging,
    cookies, auth and redirect handling) adds about as much CPU per request
    again: requests go to the transports directly, each URL parsed once.
    httpx still maps errors, and cancelling a request closes its connection.
    A custom transport is used as it is, for every replica.
    """

    def __init__(
        self,
        bases: Sequence[str],
        max_connections: int,
        *,
        api_key: str | None,
        connect_timeout: float,
        transport: httpx.AsyncBaseTransport | None,
        stall_timeout: float | None = None,
        credentials: Mapping[str, str] | None = None,
        max_response_bytes: int = 64 << 20,
    ) -> None:
        self._owned: list[httpx.AsyncBaseTransport]
        if transport is not None:
            self._owned = [transport]
            self._shards = {base: [transport] for base in bases}
        else:
            count = -(-max_connections // _SHARD_CONNECTIONS)
            size = -(-max_connections // count)
            limits = httpx.Limits(
                max_connections=size, max_keepalive_connections=size, keepalive_expiry=30.0
            )
            ssl_context = httpx.create_ssl_context()  # loaded once, not once per pool
            self._shards = {
                base: [
                    httpx.AsyncHTTPTransport(verify=ssl_context, limits=limits)
                    for _ in range(count)
                ]
                for base in bases
            }
            self._owned = [t for shards in self._shards.values() for t in shards]
        self._busy = {base: [0] * len(shards) for base, shards in self._shards.items()}
        self._max_response_bytes = max_response_bytes
        # Per base: a URL's own credentials win over the engine's bearer key.
        self._get_headers: dict[str, list[tuple[str, str]]] = {}
        self._post_headers: dict[str, list[tuple[str, str]]] = {}
        for base in bases:
            auth = (credentials or {}).get(base) or (f"Bearer {api_key}" if api_key else None)
            get = [("user-agent", "blendserve")]
            if auth:
                get.append(("authorization", auth))
            self._get_headers[base] = get
            self._post_headers[base] = [*get, ("content-type", "application/json")]
        # The call deadline bounds reads, writes and pool waits; connects get their own.
        self._timeout = {"timeout": httpx.Timeout(None, connect=connect_timeout).as_dict()}
        # Streamed samples arrive token by token: a silence longer than this is a hang.
        streamed = httpx.Timeout(None, connect=connect_timeout, read=stall_timeout)
        self._streamed_timeout = {"timeout": streamed.as_dict()}
        self._urls: dict[str, httpx.URL] = {}

    def _url(self, url: str) -> httpx.URL:
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx.URL(url)
        return parsed

    async def post(
        self,
        base: str,
        path: str,
        body: bytes,
        collect_stream: bool = False,
        headers: Sequence[tuple[str, str]] = (),
    ) -> httpx.Response:
        """POSTs a JSON body to ``base + path``; the response is read in full.

        With ``collect_stream``, a 2xx event stream is read chunk by chunk and
        returned as the equivalent non-streamed JSON response. ``headers`` are
        sent besides the pool's own.
        """
        request = httpx.Request(
            "POST",
            self._url(base + path),
            content=body,
            headers=[*self._post_headers[base], *headers] if headers else self._post_headers[base],
            extensions=self._streamed_timeout if collect_stream else self._timeout,
        )
        return await self._send(base, request, collect_stream)

    async def open(
        self, base: str, path: str, body: bytes, read_timeout: float
    ) -> tuple[httpx.Response, int]:
        """POSTs; returns the response unread and the shard to give to :meth:`done`.

        The upstream may stay silent ``read_timeout`` seconds at most, first byte included.
        """
        timeout = httpx.Timeout(None, connect=self._timeout["timeout"]["connect"])
        request = httpx.Request(
            "POST",
            self._url(base + path),
            content=body,
            headers=self._post_headers[base],
            extensions={"timeout": {**timeout.as_dict(), "read": read_timeout}},
        )
        busy = self._busy[base]
        shard = min(range(len(busy)), key=busy.__getitem__)
        busy[shard] += 1
        try:
            response = await self._shards[base][shard].handle_async_request(request)
        except BaseException:
            busy[shard] -= 1
            raise
        response.request = request
        return response, shard

    def done(self, base: str, shard: int) -> None:
        """Ends what :meth:`open` started, once its response is closed."""
        self._busy[base][shard] -= 1

    async def get(self, base: str, path: str, timeout: float) -> httpx.Response:
        """GETs with ``timeout`` on every phase; the response is read in full."""
        return await self.side(base, base + path, None, timeout)

    async def side(self, base: str, url: str, body: bytes | None, timeout: float) -> httpx.Response:
        """A GET (``body`` None) or JSON POST to any ``url`` of replica ``base``, read in full."""
        extensions = {"timeout": httpx.Timeout(timeout).as_dict()}
        method, headers = (
            ("GET", self._get_headers[base]) if body is None else ("POST", self._post_headers[base])
        )
        request = httpx.Request(
            method, self._url(url), content=body, headers=headers, extensions=extensions
        )
        return await self._send(base, request)

    async def _send(
        self, base: str, request: httpx.Request, collect_stream: bool = False
    ) -> httpx.Response:
        busy = self._busy[base]
        shard = min(range(len(busy)), key=busy.__getitem__)
        busy[shard] += 1
        try:
            raw = await self._shards[base][shard].handle_async_request(request)
            try:
                if collect_stream and raw.is_success:
                    # Closing mid-stream (cancellation) makes the upstream stop generating.
                    lines = _lines(self.capped(raw.aiter_bytes(), request))
                    response = httpx.Response(200, json=await _collect_events(lines))
                else:
                    content = b"".join([c async for c in self.capped(raw.aiter_bytes(), request)])
                    headers = [
                        (name, value)
                        for name, value in raw.headers.multi_items()
                        if name not in ("content-encoding", "content-length")  # decoded here
                    ]
                    response = httpx.Response(raw.status_code, headers=headers, content=content)
            finally:
                await raw.aclose()
        finally:
            busy[shard] -= 1
        response.request = request
        return response

    async def capped(
        self, chunks: AsyncIterator[bytes], request: httpx.Request
    ) -> AsyncIterator[bytes]:
        """``chunks`` while their total stays within the response size limit.

        Raises:
            httpx.DecodingError: the limit was passed (an unusable response).
        """
        received = 0
        async for chunk in chunks:
            received += len(chunk)
            if received > self._max_response_bytes:
                raise httpx.DecodingError(
                    f"response over {self._max_response_bytes} bytes", request=request
                )
            yield chunk

    async def aclose(self) -> None:
        for transport in self._owned:
            await transport.aclose()


class _DeadlinePassed(Exception):
    """The deadline of :func:`_within` passed."""


async def _within(coro: Coroutine[Any, Any, _T], timeout: float) -> _T:
    """Awaits ``coro`` for at most ``timeout`` seconds, then cancels it.

    Raises:
        _DeadlinePassed: the deadline passed first.
    """
    # Not asyncio.wait_for: on Python 3.10 and 3.11 it returns the result instead of
    # raising CancelledError when a cancellation races with completion, and the
    # caller's task then runs on as if never cancelled.
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout)
    except BaseException:
        await _cancel_all([task])
        raise
    if not done:
        await _cancel_all([task])
        if task.cancelled():
            raise _DeadlinePassed(f"{timeout:g} s")
    return task.result()


async def _cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancels ``tasks`` and waits until they are done (their finally blocks ran)."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: it is superseded by the error being raised


async def _all_or_cancel(coros: Sequence[Coroutine[Any, Any, _T]]) -> list[_T]:
    """Awaits all; on the first error or on cancellation, cancels and awaits the rest."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # Siblings' finally blocks release outstanding counters before we re-raise.
        await _cancel_all(tasks)
        raise


def _samples(payload: Any, chat: bool, upstream: str) -> list[Sample]:
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices:
        raise EngineProtocolError(f"{upstream}: response has no choices")
    if not all(isinstance(c, dict) for c in choices):
        raise EngineProtocolError(f"{upstream}: a choice is not an object")
    if all(isinstance(c.get("index"), int) for c in choices):
        choices = sorted(choices, key=lambda c: c["index"])
    usage = payload.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    prompt_tokens = _count(usage.get("prompt_tokens"))
    own = [_choice_tokens(c) for c in choices]
    if all(t is not None for t in own):
        tokens = [t or 0 for t in own]
    else:
        share, rest = divmod(_count(usage.get("completion_tokens")), len(choices))
        tokens = [share + (i < rest) for i in range(len(choices))]
    samples = []
    for choice, completion_tokens in zip(choices, tokens, strict=True):
        if chat:
            message = choice.get("message")
            if not isinstance(message, dict):
                raise EngineProtocolError(f"{upstream}: a chat choice has no message")
            # content is null when a reasoning parser kept everything in reasoning_content
            text = message.get("content") or ""
        else:
            text = choice.get("text")
        if not isinstance(text, str):
            raise EngineProtocolError(f"{upstream}: a choice has no text")
        finish = choice.get("finish_reason")
        samples.append(
            Sample(
                text=text,
                finish_reason=finish if isinstance(finish, str) else None,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                upstream=upstream,
            )
        )
    return samples


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The UTF-8 text lines of a byte stream (``chunks`` bound how much one line holds)."""
    pending = bytearray()
    async for chunk in chunks:
        pending += chunk
        if b"\n" in chunk:
            *complete, rest = bytes(pending).split(b"\n")
            pending = bytearray(rest)
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.decode("utf-8", "replace")


async def _collect_events(lines: AsyncIterator[str]) -> dict[str, Any]:
    """Assembles a streamed completion (server-sent lines) into the non-streamed shape."""
    texts: dict[int, list[str]] = {}
    finish: dict[int, Any] = {}
    usage: Any = None
    num_chunks = 0
    chat = False
    async for line in lines:
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        try:
            chunk = json.loads(line[5:])
        except ValueError as exc:
            raise EngineProtocolError(f"stream chunk is not JSON: {line[:200]!r}") from exc
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            index = choice.get("index", 0)
            delta = choice.get("delta")
            chat = chat or isinstance(delta, dict)
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if piece:
                texts.setdefault(index, []).append(piece)
                num_chunks += 1
            else:
                texts.setdefault(index, [])
            if choice.get("finish_reason") is not None:
                finish[index] = choice["finish_reason"]
    choices = []
    for index in sorted(texts):
        text = "".join(texts[index])
        body: dict[str, Any] = {"message": {"content": text}} if chat else {"text": text}
        choices.append({"index": index, "finish_reason": finish.get(index), **body})
    # An upstream without stream usage: a content chunk is about one token.
    return {"choices": choices, "usage": usage or {"completion_tokens": num_chunks}}


async def _once(content: bytes) -> AsyncIterator[bytes]:
    yield content


def _encode(payload: dict[str, Any]) -> bytes:
    try:
        return json.dumps(
            payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
    except (TypeError, ValueError) as exc:
        raise RequestValidationError(f"the request is not valid JSON: {exc}") from exc


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _choice_tokens(choice: dict[str, Any]) -> int | None:
    usage = choice.get("usage")
    value = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if value is None:
        value = choice.get("completion_tokens")
    return _count(value) if value is not None else None


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for value in (error, data.get("message"), data.get("detail")):
            if isinstance(value, str):
                return value
    return response.text.strip()[:500] or response.reason_phrase


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER)


def _exhausted(last: Exception | None, attempts: int) -> Exception:
    detail = f"after {attempts} attempt(s): {last!r}"
    if isinstance(last, httpx.TimeoutException) and not isinstance(
        last, (httpx.ConnectTimeout, httpx.PoolTimeout)
    ):
        return EngineTimeout(f"upstream timed out {detail}")
    return EngineUnavailable(f"no upstream could serve {detail}")
