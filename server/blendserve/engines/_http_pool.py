"""Keep-alive connections to an engine's replicas, sharded per replica.

Why sharded, and why not ``httpx.AsyncClient``, is :class:`HttpPool`'s
docstring; a request takes its replica's least busy shard.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

import httpx

from blendserve.engines.openai_wire import collect_events, lines

__all__ = ["HttpPool"]

_SHARD_CONNECTIONS = 2  # measured: 1-4 alike, 8 costs 1.4x CPU, 16 costs 3x


class HttpPool:
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
        shard = self._take(base)
        try:
            response = await self._shards[base][shard].handle_async_request(request)
        except BaseException:
            self.done(base, shard)
            raise
        response.request = request
        return response, shard

    def _take(self, base: str) -> int:
        """The least busy shard of replica ``base``, counted busy until :meth:`done`."""
        busy = self._busy[base]
        shard = min(range(len(busy)), key=busy.__getitem__)
        busy[shard] += 1
        return shard

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
        shard = self._take(base)
        try:
            raw = await self._shards[base][shard].handle_async_request(request)
            try:
                if collect_stream and raw.is_success:
                    # Closing mid-stream (cancellation) makes the upstream stop generating.
                    events = lines(self.capped(raw.aiter_bytes(), request))
                    response = httpx.Response(200, json=await collect_events(events))
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
            self.done(base, shard)
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
        """Closes the transports the pool made (a custom one is closed too)."""
        for transport in self._owned:
            await transport.aclose()
