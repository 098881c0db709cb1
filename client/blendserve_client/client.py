"""``Client`` and ``AsyncClient`` for a blendserve service."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from blendserve_client._request import (
    QuestionLike,
    SSEParser,
    headers,
    raise_for_error,
    solve_body,
)
from blendserve_client.models import Answer, Progress, SolveResult, StreamCollector, parse_event

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
        *,
        budget: int | None = None,
        budget_per_question: float | None = None,
        policy: str | None = None,
        answer: Mapping[str, Any] | str | None = None,
        sampling: Mapping[str, Any] | None = None,
        model: str | None = None,
        settle_delta: float = 0.0,
        concurrency: int | None = None,
        confidence: float | None = None,
        max_samples_per_question: int | None = None,
    ) -> SolveResult:
        """Runs a job and returns every answer.

        Args:
            questions: prompts, or ``{"id", "prompt" | "messages"}`` objects.
            budget: total samples (or give ``budget_per_question``, or ``confidence``).
            policy: None for the service's default (``hedge``), or ``blend``,
                ``asc``, ``ppr``, ``esc``, ``sc``.
            answer: answer kind (``"number"``) or ``{"kind", "pattern"}``.
            sampling: temperature, top_p, max_tokens, stop, seed, ...
            model: upstream model.
            settle_delta: stop a question at this PPR-1v1 error (0: never).
            concurrency: samples in flight.
            confidence: a quality target instead of a budget: each question stops
                once ``P[its answer is not the most likely one] <= 1 - confidence``.
            max_samples_per_question: with ``confidence``, the cap (default 64).

        Raises:
            APIError: the service refused the job.
        """
        body = solve_body(
            questions, budget=budget, budget_per_question=budget_per_question, policy=policy,
            answer=answer, sampling=sampling, model=model, settle_delta=settle_delta,
            concurrency=concurrency, confidence=confidence,
            max_samples_per_question=max_samples_per_question, stream=False,
        )  # fmt: skip
        response = self._http.post("/solve", json=body)
        raise_for_error(response)
        return SolveResult.model_validate(response.json())

    def stream(
        self,
        questions: Sequence[QuestionLike],
        *,
        budget: int | None = None,
        budget_per_question: float | None = None,
        policy: str | None = None,
        answer: Mapping[str, Any] | str | None = None,
        sampling: Mapping[str, Any] | None = None,
        model: str | None = None,
        settle_delta: float = 0.0,
        concurrency: int | None = None,
        confidence: float | None = None,
        max_samples_per_question: int | None = None,
    ) -> Iterator[StreamEvent]:
        """Runs a job and yields each answer as it settles, progress, then the summary.

        Closing the iterator early disconnects, which cancels the job's samples.
        """
        body = solve_body(
            questions, budget=budget, budget_per_question=budget_per_question, policy=policy,
            answer=answer, sampling=sampling, model=model, settle_delta=settle_delta,
            concurrency=concurrency, confidence=confidence,
            max_samples_per_question=max_samples_per_question, stream=True,
        )  # fmt: skip
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
        *,
        budget: int | None = None,
        budget_per_question: float | None = None,
        policy: str | None = None,
        answer: Mapping[str, Any] | str | None = None,
        sampling: Mapping[str, Any] | None = None,
        model: str | None = None,
        settle_delta: float = 0.0,
        concurrency: int | None = None,
        confidence: float | None = None,
        max_samples_per_question: int | None = None,
    ) -> SolveResult:
        """Runs a job and returns every answer (see :meth:`Client.solve`)."""
        body = solve_body(
            questions, budget=budget, budget_per_question=budget_per_question, policy=policy,
            answer=answer, sampling=sampling, model=model, settle_delta=settle_delta,
            concurrency=concurrency, confidence=confidence,
            max_samples_per_question=max_samples_per_question, stream=False,
        )  # fmt: skip
        response = await self._http.post("/solve", json=body)
        raise_for_error(response)
        return SolveResult.model_validate(response.json())

    async def stream(
        self,
        questions: Sequence[QuestionLike],
        *,
        budget: int | None = None,
        budget_per_question: float | None = None,
        policy: str | None = None,
        answer: Mapping[str, Any] | str | None = None,
        sampling: Mapping[str, Any] | None = None,
        model: str | None = None,
        settle_delta: float = 0.0,
        concurrency: int | None = None,
        confidence: float | None = None,
        max_samples_per_question: int | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Yields answers as they settle, progress, then the summary (see :meth:`Client.stream`)."""
        body = solve_body(
            questions, budget=budget, budget_per_question=budget_per_question, policy=policy,
            answer=answer, sampling=sampling, model=model, settle_delta=settle_delta,
            concurrency=concurrency, confidence=confidence,
            max_samples_per_question=max_samples_per_question, stream=True,
        )  # fmt: skip
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
