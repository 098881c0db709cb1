"""``Client`` and ``AsyncClient`` for a blendserve service."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import Unpack

import httpx

from blendserve_client._request import SSEParser, headers, raise_for_error
from blendserve_client.models import Answer, Progress, SolveResult, StreamCollector, parse_event
from blendserve_client.options import QuestionLike, SolveFields, SolveOptions, solve_options

__all__ = ["AsyncClient", "Client", "StreamEvent"]

StreamEvent = Answer | Progress | SolveResult
DEFAULT_URL = "http://127.0.0.1:8000"


class Client:
    """Synchronous client.

    Args:
        base_url: the service, e.g. ``http://127.0.0.1:8000``.
        api_key: bearer key, if the service requires one.
        timeout: seconds to wait for a whole job (``solve``) or between events.
        transport: an httpx transport (tests, proxies).

    Example:
        >>> with Client() as client:  # doctest: +SKIP
        ...     result = client.solve(["What is 6 * 7?"], budget=16, answer="number")
        ...     print(result.answers[0].answer)
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=headers(api_key), timeout=timeout, transport=transport
        )

    def solve(
        self,
        questions: Sequence[QuestionLike],
        options: SolveOptions | None = None,
        **fields: Unpack[SolveFields],
    ) -> SolveResult:
        """Runs a job and returns every answer.

        Args:
            questions: prompts, or ``{"id", "prompt" | "messages"}`` objects.
            options: the job's options (:class:`SolveOptions`).
            **fields: options by name (``budget=16, answer="number"``), over ``options``.

        Raises:
            pydantic.ValidationError: an unknown option, or a value of the wrong type.
            APIError: the service refused the job.
        """
        body = solve_options(options, fields).body(questions, stream=False)
        response = self._http.post("/solve", json=body)
        raise_for_error(response)
        return SolveResult.model_validate(response.json())

    def stream(
        self,
        questions: Sequence[QuestionLike],
        options: SolveOptions | None = None,
        **fields: Unpack[SolveFields],
    ) -> Iterator[StreamEvent]:
        """Runs a job and yields each answer as it settles, progress, then the summary.

        Closing the iterator early disconnects, which cancels the job's samples.
        """
        body = solve_options(options, fields).body(questions, stream=True)
        with self._http.stream("POST", "/solve", json=body) as response:
            if not response.is_success:
                response.read()
                raise_for_error(response)
            parser, collector = SSEParser(), StreamCollector()
            for line in response.iter_lines():
                for name, data in parser.feed([line]):
                    yield collector.add(parse_event(name, data))

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient:
    """Asynchronous client; the same calls as :class:`Client`, awaited.

    Args:
        base_url: the service.
        api_key: bearer key, if the service requires one.
        timeout: seconds to wait for a whole job or between events.
        transport: an httpx async transport (tests, proxies).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=headers(api_key), timeout=timeout, transport=transport
        )

    async def solve(
        self,
        questions: Sequence[QuestionLike],
        options: SolveOptions | None = None,
        **fields: Unpack[SolveFields],
    ) -> SolveResult:
        """Runs a job and returns every answer (see :meth:`Client.solve`)."""
        body = solve_options(options, fields).body(questions, stream=False)
        response = await self._http.post("/solve", json=body)
        raise_for_error(response)
        return SolveResult.model_validate(response.json())

    async def stream(
        self,
        questions: Sequence[QuestionLike],
        options: SolveOptions | None = None,
        **fields: Unpack[SolveFields],
    ) -> AsyncIterator[StreamEvent]:
        """Yields answers as they settle, progress, then the summary (see :meth:`Client.stream`)."""
        body = solve_options(options, fields).body(questions, stream=True)
        async with self._http.stream("POST", "/solve", json=body) as response:
            if not response.is_success:
                await response.aread()
                raise_for_error(response)
            parser, collector = SSEParser(), StreamCollector()
            async for line in response.aiter_lines():
                for name, data in parser.feed([line]):
                    yield collector.add(parse_event(name, data))

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
