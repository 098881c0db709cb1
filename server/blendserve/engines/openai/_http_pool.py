"""Keep-alive connections to an engine's replicas, sharded per replica (see :class:`HttpPool`)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Mapping,
    Sequence,
)
from typing import Any

import httpcore2
import httpx2

from blendserve.engines.openai.wire import CutBar, collect_events, server_events
from blendserve.util.cancel import DeadlinePassed, within

__all__ = ["HttpPool"]

# Connections a shard holds: small, as a pool's CPU per request grows with its
# connections (docs/benchmarks.md, "Figures behind constants").
_SHARD_CONNECTIONS = 2
_KEEPALIVE_S = 30.0
#: The request extension holding what :meth:`HttpPool.post` calls once a connection takes it.
_SENDING = "blendserve.sending"


class _Connection(httpcore2.AsyncConnectionInterface):
    """An HTTP/1.1 connection of a pool, dropped once no request can end it.

    A request cancelled at the wrong moment can leave a connection that counts
    against the pool's limit but that no request will ever use or end. This one
    reads as closed, so that the pool drops it, when no request started on it
    within ``give_up_s`` of the pool handing it out, or when the request on it
    ended and left it neither idle nor closed (it is closed here).
    """

    def __init__(self, inner: httpcore2.AsyncConnectionInterface, give_up_s: float) -> None:
        self._inner = inner
        self._give_up_at = time.monotonic() + give_up_s
        self._started = False
        self._stuck = False

    def abandoned(self) -> bool:
        """True once ``give_up_s`` passed with no request started on the connection."""
        return not self._started and time.monotonic() > self._give_up_at

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        """Sends ``request`` on the inner connection, unless this one was given up."""
        if self.abandoned() or self._stuck:
            raise httpcore2.ConnectionNotAvailable()  # the pool finds the request another
        self._started = True
        sending = request.extensions.get(_SENDING)
        if sending is not None:
            sending()
        try:
            response = await self._inner.handle_async_request(request)
        except httpcore2.ConnectionNotAvailable:
            raise  # busy with another request: not this one's to end
        except BaseException:
            await self.ended()
            raise
        stream = response.stream
        assert isinstance(stream, AsyncIterable)
        return httpcore2.Response(
            status=response.status,
            headers=response.headers,
            content=_Body(stream, self),
            extensions=response.extensions,
        )

    async def ended(self) -> None:
        """Closes the connection if the request that ended left it neither idle nor closed."""
        if not (self._inner.is_idle() or self._inner.is_closed()):
            self._stuck = True
            await asyncio.shield(self._inner.aclose())  # closed even if cancelled again

    async def aclose(self) -> None:
        """Closes the inner connection."""
        await self._inner.aclose()

    def info(self) -> str:
        """The inner connection's state, for ``repr``."""
        return self._inner.info()

    def can_handle_request(self, origin: httpcore2.Origin) -> bool:
        """Whether the connection goes to ``origin``."""
        return self._inner.can_handle_request(origin)

    def is_connected(self) -> bool:
        """Whether the socket is established."""
        return self._inner.is_connected()

    def is_available(self) -> bool:
        """Whether the pool may hand the connection to another request."""
        return not self.is_closed() and self._inner.is_available()

    def has_expired(self) -> bool:
        """Whether the pool should close the connection."""
        return self._inner.has_expired()

    def is_idle(self) -> bool:
        """Whether the connection is kept alive with no request on it."""
        return self._inner.is_idle()

    def can_multiplex(self) -> bool:
        """Whether several requests may share the connection (HTTP/2)."""
        return self._inner.can_multiplex()

    def is_closed(self) -> bool:
        """Whether the pool should drop the connection: closed, or given up."""
        return self._stuck or self.abandoned() or self._inner.is_closed()

    def __repr__(self) -> str:
        return f"<_Connection [{self.info()}]>"


class _Body:
    """A response body that has its connection checked once it is closed."""

    def __init__(self, stream: AsyncIterable[bytes], connection: _Connection) -> None:
        self._stream = stream
        self._connection = connection

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._stream.__aiter__()  # the inner body's own: nothing added per chunk

    async def aclose(self) -> None:
        """Closes the inner body, then has the connection checked."""
        try:
            close = getattr(self._stream, "aclose", None)
            if close is not None:
                await close()
        finally:
            await self._connection.ended()


class _Pool(httpcore2.AsyncConnectionPool):
    """An httpcore2 pool whose new connections are each a :class:`_Connection`."""

    def __init__(self, *, give_up_s: float, **options: Any) -> None:
        super().__init__(**options)
        self._give_up_s = give_up_s

    def create_connection(self, origin: httpcore2.Origin) -> httpcore2.AsyncConnectionInterface:
        """A new connection to ``origin``, given up if no request starts on it in time."""
        return _Connection(super().create_connection(origin), self._give_up_s)


class _Transport(httpx2.AsyncHTTPTransport):
    """httpx2's transport (request building, error mapping) over a :class:`_Pool`."""

    def __init__(self, ssl_context: ssl.SSLContext, size: int, give_up_s: float) -> None:
        super().__init__(verify=ssl_context)
        # httpx2 sends through the httpcore2 pool it keeps here (as httpx has since 0.18).
        self._pool = _Pool(
            give_up_s=give_up_s,
            ssl_context=ssl_context,
            max_connections=size,
            max_keepalive_connections=size,
            keepalive_expiry=_KEEPALIVE_S,
        )


class HttpPool:
    """Keep-alive connections to each replica, at most ``max_connections`` per replica.

    httpcore's pool works per connection it holds whenever a request starts or
    ends, so each replica's connections are split into pools of
    ``_SHARD_CONNECTIONS`` and a request takes its replica's least busy one.
    Requests go to the transports directly, not through ``httpx2.AsyncClient``,
    whose per-request work would cost as much CPU again. A request that finds
    every shard full waits its turn, first come first served; one that waits
    ``connect_timeout`` fails with ``httpx2.PoolTimeout`` (retryable, and not the
    replica's fault). A custom transport is used as it is, for every replica.
    """

    def __init__(
        self,
        bases: Sequence[str],
        max_connections: int,
        *,
        api_key: str | None,
        connect_timeout: float,
        transport: httpx2.AsyncBaseTransport | None,
        stall_timeout: float | None = None,
        credentials: Mapping[str, str] | None = None,
        max_response_bytes: int = 64 << 20,
    ) -> None:
        self._owned: list[httpx2.AsyncBaseTransport]
        self._custom = transport is not None
        if transport is not None:
            self._owned = [transport]
            self._shards = {base: [transport] for base in bases}
            self._size = max_connections
        else:
            count = -(-max_connections // _SHARD_CONNECTIONS)
            self._size = -(-max_connections // count)
            ssl_context = httpx2.create_ssl_context()  # loaded once, not once per pool
            self._shards = {
                base: [_Transport(ssl_context, self._size, connect_timeout) for _ in range(count)]
                for base in bases
            }
            self._owned = [t for shards in self._shards.values() for t in shards]
        self._busy = {base: [0] * len(shards) for base, shards in self._shards.items()}
        # Per base: requests waiting for a shard with room, each handed its shard.
        self._waiting: dict[str, deque[asyncio.Future[int]]] = {b: deque() for b in self._shards}
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
        # The call deadline bounds reads and writes; connects and pool waits get their own.
        limits = {"connect": connect_timeout, "pool": connect_timeout}
        self._timeout = {"timeout": httpx2.Timeout(None, **limits).as_dict()}
        # Streamed samples arrive token by token: a silence longer than this is a hang.
        streamed = httpx2.Timeout(None, **limits, read=stall_timeout)
        self._streamed_timeout = {"timeout": streamed.as_dict()}
        self._urls: dict[str, httpx2.URL] = {}

    def _url(self, url: str) -> httpx2.URL:
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx2.URL(url)
        return parsed

    async def post(
        self,
        base: str,
        path: str,
        body: bytes,
        collect_stream: bool = False,
        headers: Sequence[tuple[str, str]] = (),
        sending: Callable[[], None] | None = None,
        max_pieces: int | None = None,
        top_logprobs: int | None = None,
        cut: CutBar | None = None,
    ) -> httpx2.Response:
        """POSTs a JSON body to ``base + path``, with ``headers`` besides the pool's; read in full.

        With ``collect_stream``, a 2xx event stream is read event by event into the
        equivalent non-streamed response, failed past ``max_pieces`` pieces of text, its
        tokens' confidences read from their ``top_logprobs``, and cut where ``cut`` says
        (see ``collect_events``): the response is closed there, before its end, which
        releases the upstream request.
        ``sending`` is called once a connection takes the request (never on a pool
        timeout; maybe more than once, when a connection turns it away).

        Raises:
            EngineProtocolError: the 2xx event stream is not a usable completion.
        """
        extensions: dict[str, Any] = self._streamed_timeout if collect_stream else self._timeout
        if sending is not None:
            extensions = {**extensions, _SENDING: sending}
        request = httpx2.Request(
            "POST",
            self._url(base + path),
            content=body,
            headers=[*self._post_headers[base], *headers] if headers else self._post_headers[base],
            extensions=extensions,
        )
        return await self._send(base, request, collect_stream, None, max_pieces, top_logprobs, cut)

    async def open(
        self, base: str, path: str, body: bytes, read_timeout: float
    ) -> tuple[httpx2.Response, int]:
        """POSTs; returns the response unread and the shard to give to :meth:`done`.

        The upstream may stay silent ``read_timeout`` seconds at most, first byte included.
        """
        request = httpx2.Request(
            "POST",
            self._url(base + path),
            content=body,
            headers=self._post_headers[base],
            extensions={"timeout": {**self._timeout["timeout"], "read": read_timeout}},
        )
        shard = await self._take(base, request)
        try:
            response = await self._shards[base][shard].handle_async_request(request)
        except BaseException:
            self.done(base, shard)
            raise
        response.request = request
        return response, shard

    async def _take(self, base: str, request: httpx2.Request, patience: float | None = None) -> int:
        """The least busy shard of replica ``base``, counted busy until :meth:`done`.

        When every shard is full, waits for a free one, after those that came
        first; ``patience`` bounds the wait (None: the caller's deadline does).

        Raises:
            httpx2.PoolTimeout: no shard was free within ``patience``.
        """
        busy = self._busy[base]
        shard = min(range(len(busy)), key=busy.__getitem__)
        waiting = self._waiting[base]
        if busy[shard] < self._size and not waiting:
            busy[shard] += 1
            return shard
        turn: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        waiting.append(turn)
        try:
            # Not asyncio.wait_for: see blendserve.util.cancel.within.
            return await (turn if patience is None else within(_result(turn), patience))
        except BaseException as exc:
            if turn.done() and not turn.cancelled():
                self.done(base, turn.result())  # handed a shard too late: the next one gets it
            with contextlib.suppress(ValueError):
                waiting.remove(turn)
            if isinstance(exc, DeadlinePassed):
                message = f"no connection within {patience} s"
                raise httpx2.PoolTimeout(message, request=request) from None
            raise

    def done(self, base: str, shard: int) -> None:
        """Ends what :meth:`open` started, once its response is closed."""
        waiting = self._waiting[base]
        while waiting:
            turn = waiting.popleft()
            if not turn.done():
                turn.set_result(shard)  # the shard stays busy, with the next request
                return
        self._busy[base][shard] -= 1

    async def get(self, base: str, path: str, timeout: float) -> httpx2.Response:
        """GETs with ``timeout`` on every phase; the response is read in full."""
        return await self.side(base, base + path, None, timeout)

    async def side(
        self, base: str, url: str, body: bytes | None, timeout: float
    ) -> httpx2.Response:
        """A GET (``body`` None) or JSON POST to any ``url`` of replica ``base``, read in full."""
        extensions = {"timeout": httpx2.Timeout(timeout).as_dict()}
        method, headers = (
            ("GET", self._get_headers[base]) if body is None else ("POST", self._post_headers[base])
        )
        request = httpx2.Request(
            method, self._url(url), content=body, headers=headers, extensions=extensions
        )
        return await self._send(base, request, patience=timeout)

    async def _send(
        self,
        base: str,
        request: httpx2.Request,
        collect_stream: bool = False,
        patience: float | None = None,
        max_pieces: int | None = None,
        top_logprobs: int | None = None,
        cut: CutBar | None = None,
    ) -> httpx2.Response:
        shard = await self._take(base, request, patience)
        try:
            sending = request.extensions.get(_SENDING)
            if sending is not None and self._custom:  # no connection of ours to call it
                sending()
            raw = await self._shards[base][shard].handle_async_request(request)
            try:
                # Each layer closed here, outermost first, whatever ends the read: a layer
                # left to the garbage collector is closed later, on another task.
                async with (
                    contextlib.aclosing(raw.aiter_bytes()) as decoded,
                    contextlib.aclosing(self.capped(decoded, request)) as chunks,
                ):
                    if collect_stream and raw.is_success:
                        # Closing mid-stream (cancellation, a cut) makes the upstream stop
                        # generating.
                        async with contextlib.aclosing(server_events(chunks)) as events:
                            payload = await collect_events(events, max_pieces, top_logprobs, cut)
                        response = httpx2.Response(200, json=payload)
                    else:
                        content = b"".join([c async for c in chunks])
                        headers = [
                            (name, value)
                            for name, value in raw.headers.multi_items()
                            if name not in ("content-encoding", "content-length")  # decoded here
                        ]
                        response = httpx2.Response(
                            raw.status_code, headers=headers, content=content
                        )
            finally:
                await raw.aclose()
        finally:
            self.done(base, shard)
        response.request = request
        return response

    async def capped(
        self, chunks: AsyncIterator[bytes], request: httpx2.Request
    ) -> AsyncGenerator[bytes, None]:
        """``chunks`` while their total stays within the response size limit.

        Raises:
            httpx2.DecodingError: the limit was passed (an unusable response).
        """
        received = 0
        async for chunk in chunks:
            received += len(chunk)
            if received > self._max_response_bytes:
                raise httpx2.DecodingError(
                    f"response over {self._max_response_bytes} bytes", request=request
                )
            yield chunk

    async def aclose(self) -> None:
        """Closes the transports the pool made (a custom one is closed too)."""
        for transport in self._owned:
            await transport.aclose()


async def _result(turn: asyncio.Future[int]) -> int:
    return await turn
