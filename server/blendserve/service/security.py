"""Bearer API keys: every route but ``/health`` (and ``/metrics`` unless configured)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from blendserve.service.errors import send_error

__all__ = ["ApiKeyAuth"]

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
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return False
        # Compared with every key, in constant time each.
        matches = [hmac.compare_digest(token.strip(), key) for key in self.keys]
        return any(matches)
