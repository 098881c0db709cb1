"""Pass-through: engines with an OpenAI upstream that takes requests unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from blendserve.engines.base import UpstreamReply

__all__ = ["PassThrough"]


@runtime_checkable
class PassThrough(Protocol):
    """An engine that can send OpenAI requests to its upstream as they are.

    The service forwards requests that turn self-consistency off, and vLLM's
    tokenizer endpoints, to an engine that is a ``PassThrough``; it answers
    the others from :meth:`~blendserve.engines.base.Engine.generate`.
    """

    async def forward(self, path: str, body: Mapping[str, Any]) -> UpstreamReply | None:
        """Sends an OpenAI request body to ``{upstream}/v1{path}`` unchanged.

        None: not this request (the service then answers it from ``generate``).
        """
        ...

    async def tokenizer(self, path: str, body: Mapping[str, Any] | None) -> UpstreamReply | None:
        """Calls vLLM's tokenizer endpoint ``path`` at the upstream's root, reply unchanged.

        ``path`` is ``/tokenize``, ``/detokenize`` (``body`` POSTed) or
        ``/tokenizer_info`` (``body`` None: a GET). None: no upstream to ask.
        """
        ...
