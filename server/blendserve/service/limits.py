"""Limits on what one request may ask and on how much runs at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from blendserve.errors import RequestValidationError, ServiceOverloaded

__all__ = ["Admission", "BodySizeLimit", "JobLimits", "Slot", "release_after"]


class JobLimits:
    """The shape limits of one job (``/solve``) or one ``/v1`` request.

    Args:
        max_questions: questions per job.
        max_budget: samples per job.
        max_budget_per_question: samples per question on average.
        max_prompt_bytes: UTF-8 bytes of one question's prompt or messages.
    """

    def __init__(
        self,
        max_questions: int,
        max_budget: int,
        max_budget_per_question: float,
        max_prompt_bytes: int,
    ) -> None:
        self.max_questions = max_questions
        self.max_budget = max_budget
        self.max_budget_per_question = max_budget_per_question
        self.max_prompt_bytes = max_prompt_bytes

    def check(
        self,
        prompts: Sequence[str | Sequence[Mapping[str, Any]] | None],
        budget: float,
        *,
        prefix: str = "",
    ) -> None:
        """Raises a 422 naming the field when a limit is passed.

        Args:
            prompts: each question's prompt or chat messages.
            budget: the job's total budget in samples.
            prefix: the request's path to the questions (``questions``, ``messages``).
        """
        count = len(prompts)
        if count > self.max_questions:
            raise RequestValidationError(
                f"{count} questions: at most {self.max_questions} per job", param=prefix or None
            )
        if budget > self.max_budget:
            raise RequestValidationError(
                f"budget {budget:g}: at most {self.max_budget} samples per job", param="budget"
            )
        if count and budget / count > self.max_budget_per_question:
            raise RequestValidationError(
                f"{budget / count:g} samples per question: at most "
                f"{self.max_budget_per_question:g}",
                param="budget_per_question",
            )
        for i, prompt in enumerate(prompts):
            size = len(prompt.encode() if isinstance(prompt, str) else json.dumps(prompt).encode())
            if size > self.max_prompt_bytes:
                raise RequestValidationError(
                    f"prompt of {size} bytes: at most {self.max_prompt_bytes}",
                    param=f"{prefix}.{i}" if prefix else None,
                )


class Admission:
    """Admits work while fewer than ``max_jobs`` jobs and ``max_questions`` questions run.

    Work beyond either limit is refused at once (a 429 with ``Retry-After``),
    never queued without bound.
    """

    def __init__(self, max_jobs: int, max_questions: int) -> None:
        self.max_jobs = max_jobs
        self.max_questions = max_questions
        self.jobs = 0
        self.questions = 0

    def admit(self, questions: int) -> Slot:
        """One job slot and ``questions`` question slots, held until :meth:`Slot.release`.

        Raises:
            ServiceOverloaded: a limit would be passed.
        """
        if self.jobs + 1 > self.max_jobs:
            raise ServiceOverloaded(f"{self.jobs} jobs running: at most {self.max_jobs}")
        if self.questions + questions > self.max_questions:
            raise ServiceOverloaded(
                f"{self.questions} questions queued: at most {self.max_questions}"
            )
        self.jobs += 1
        self.questions += questions
        return Slot(self, questions)


class Slot:
    """What one admitted request holds; :meth:`release` gives it back (once)."""

    def __init__(self, admission: Admission, questions: int) -> None:
        self._admission: Admission | None = admission
        self._questions = questions

    def release(self) -> None:
        """Gives the slots back; later calls do nothing."""
        if self._admission is not None:
            self._admission.jobs -= 1
            self._admission.questions -= self._questions
            self._admission = None


async def release_after(body: AsyncIterator[str], slot: Slot) -> AsyncIterator[str]:
    """Streams ``body``, then releases ``slot``, however the stream ends."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        slot.release()


class BodySizeLimit:
    """Answers 413 to a request body over ``max_bytes``, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        # Read whole before the app sees it: a body over the limit never reaches a handler.
        messages: list[Message] = []
        received = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break
        replay = iter(messages)

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": f"request body over {self.max_bytes} bytes",
                    "type": "invalid_request_error",
                    "code": 413,
                }
            }
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
