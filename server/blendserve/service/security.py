"""Bearer API keys: every route but ``/health`` (and ``/metrics`` unless configured).

Also who a request's client is (:class:`ClientIds`), for what a ``/v1``
online pool keeps per client.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from blendserve.scheduler.pool import SHARED_CLIENT
from blendserve.service.errors import send_error

__all__ = ["ApiKeyAuth", "ClientIds"]

_OPEN = frozenset({"/health"})


class ApiKeyAuth:
    """Refuses requests without one of ``keys`` as ``Authorization: Bearer <key>`` (none: all open).

    The refusal is OpenAI's 401 (``invalid_api_key``), so the ``openai`` client
    raises ``AuthenticationError``; more than one ``Authorization`` header is a
    400. ``protect_metrics`` asks for a key on ``/metrics`` too.
    """

    def __init__(self, app: ASGIApp, keys: frozenset[str], protect_metrics: bool = False) -> None:
        self.app = app
        self.keys = [key.encode() for key in keys]
        self.open = _OPEN if protect_metrics else _OPEN | {"/metrics"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open:
            await self.app(scope, receive, send)
            return
        values = [value for name, value in scope["headers"] if name == b"authorization"]
        if len(values) > 1:
            # Which one would count? The key check and the client id must read the same.
            await send_error(
                send,
                400,
                f"more than one Authorization header ({len(values)}): send one, "
                "Authorization: Bearer <key>",
            )
            return
        if values and self._authorised(values[0]):
            await self.app(scope, receive, send)
            return
        await send_error(
            send,
            401,
            "missing or invalid API key (Authorization: Bearer <key>)",
            code="invalid_api_key",
            headers=[(b"www-authenticate", b"Bearer")],
        )

    def _authorised(self, header: bytes) -> bool:
        token = _bearer(header)
        if not token:
            return False
        # Compared with every key, in constant time each.
        matches = [hmac.compare_digest(token, key) for key in self.keys]
        return any(matches)


def _bearer(header: bytes) -> bytes:
    """The token of ``Authorization: Bearer <token>`` (empty: none)."""
    scheme, _, token = header.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


class ClientIds:
    """Who a request's client is: an opaque short id, never the key or the header itself.

    With API keys (``keyed``), the key the request authenticated with; on an open
    service, the value of ``header`` when configured and sent; else the one shared
    client. Ids are keyed hashes under a secret of this process: stable while it
    runs, telling nothing of the key. For what a pool keeps per client, never for
    a metric label.
    """

    def __init__(self, keyed: bool, header: str | None = None) -> None:
        self.keyed = keyed
        self.header = header.lower() if header else None
        self._secret = os.urandom(16)

    def of(self, headers: Headers) -> str:
        """The client id of a request's (already authenticated) headers.

        Only a header sent once names a client: :class:`ApiKeyAuth` refuses a
        second ``Authorization``, and a client header sent twice is the shared client.
        """
        if self.keyed:
            value = _bearer(_once(headers, "authorization").encode("latin-1"))
            kind = "key"
        else:
            value = _once(headers, self.header).encode("latin-1") if self.header else b""
            kind = "header"
        if not value:
            return SHARED_CLIENT
        digest = hashlib.blake2b(value, digest_size=8, key=self._secret).hexdigest()
        return f"{kind}:{digest}"


def _once(headers: Headers, name: str) -> str:
    """The value of header ``name`` when it was sent exactly once (else empty)."""
    values = headers.getlist(name)
    return values[0] if len(values) == 1 else ""
