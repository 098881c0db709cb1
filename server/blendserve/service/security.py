"""Bearer API keys: every route but ``/health`` (and ``/metrics`` unless configured).

Also who a request's client is (:class:`ClientIds`), for what a ``/v1``
online pool keeps per client.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from blendserve.scheduler.pool import SHARED_CLIENT
from blendserve.service.errors import send_error

__all__ = ["ApiKeyAuth", "ClientIds"]

_OPEN = frozenset({"/health"})


class ApiKeyAuth:
    """Refuses requests without one of ``keys`` as ``Authorization: Bearer <key>``.

    The refusal is OpenAI's 401 (``invalid_api_key``), so the ``openai``
    client raises ``AuthenticationError``. No keys: everything is open.

    Args:
        app: the application.
        keys: accepted keys.
        protect_metrics: ask for a key on ``/metrics`` too.
    """

    def __init__(self, app: ASGIApp, keys: frozenset[str], protect_metrics: bool = False) -> None:
        self.app = app
        self.keys = [key.encode() for key in keys]
        self.open = _OPEN if protect_metrics else _OPEN | {"/metrics"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open:
            await self.app(scope, receive, send)
            return
        if self._authorised(dict(scope["headers"]).get(b"authorization", b"")):
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

    With API keys, the key the request authenticated with; on an open service,
    the value of ``header`` when configured and sent; else the one shared
    client. Ids are keyed hashes under a secret of this process, so they stay
    the same for a client while the process runs and tell nothing of the key.
    They are for what a pool keeps per client, never for a metric label.

    Args:
        keyed: the service asks for API keys.
        header: on an open service, the header naming the client (None: none).
    """

    def __init__(self, keyed: bool, header: str | None = None) -> None:
        self.keyed = keyed
        self.header = header.lower() if header else None
        self._secret = os.urandom(16)

    def of(self, headers: Mapping[str, str]) -> str:
        """The client id of a request's (already authenticated) headers."""
        if self.keyed:
            value = _bearer(headers.get("authorization", "").encode("latin-1"))
            kind = "key"
        else:
            value = headers.get(self.header, "").encode("latin-1") if self.header else b""
            kind = "header"
        if not value:
            return SHARED_CLIENT
        digest = hashlib.blake2b(value, digest_size=8, key=self._secret).hexdigest()
        return f"{kind}:{digest}"
