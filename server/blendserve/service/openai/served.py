"""The model a ``/v1`` request may name: one the engine serves, or any with aliases allowed."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from blendserve.engines.base import Engine
from blendserve.errors import BlendserveError, ModelNotFound

__all__ = ["LIST_TTL_S", "MISS_TTL_S", "ServedModels"]

#: Seconds the engine's model list is kept (an upstream's list costs a request).
LIST_TTL_S = 30.0
#: A name missing from a list at least this old asks again (a model loaded since).
MISS_TTL_S = 1.0


class ServedModels:
    """The engine's model names, kept a while, and the rule a request's ``model`` follows.

    No name, or an engine that lists none (or whose list cannot be had now), goes
    on as it is, and so does a name the engine lists. Any other name is a 404
    (:class:`~blendserve.errors.ModelNotFound`) unless ``allow_aliases``: then it
    stands for ``default`` (None: the engine's first). ``clock`` gives the list's age.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        allow_aliases: bool = False,
        default: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.allow_aliases = allow_aliases
        self.default = default
        self._clock = clock
        self._names: list[str] = []
        self._listed_at = -math.inf
        self._retry_at = -math.inf  # after a failed listing, not before this
        self._lock = asyncio.Lock()

    async def names(self, max_age: float = LIST_TTL_S) -> list[str]:
        """The engine's model names, asked again when the kept list is older than ``max_age``.

        Empty when the engine lists none, or its list could never be had. A list that
        cannot be had now leaves the last one in place (a name it lacks is still a 404)
        and is asked for again after :data:`MISS_TTL_S`, not :data:`LIST_TTL_S`.
        """
        async with self._lock:  # one request for the list at a time
            now = self._clock()
            if now - self._listed_at >= max_age and now >= self._retry_at:
                try:
                    self._names = list(await self.engine.models())
                    self._listed_at = self._clock()
                except BlendserveError:
                    self._retry_at = self._clock() + MISS_TTL_S
            return self._names

    def known(self) -> set[str]:
        """The names the operator's side gave: the default model and the engine's last list."""
        names = set(self._names)
        if self.default is not None:
            names.add(self.default)
        return names

    async def resolve(self, asked: str | None) -> str | None:
        """The model a request naming ``asked`` runs on (None: the engine's default).

        Raises:
            ModelNotFound: the engine lists its models, ``asked`` is not one
                of them and aliases are not allowed.
        """
        if asked is None:
            return None
        names = await self.names()
        if names and asked not in names:
            names = await self.names(MISS_TTL_S)
        if not names or asked in names:
            return asked
        if self.allow_aliases:
            return self.default or names[0]
        raise ModelNotFound(asked, names)
