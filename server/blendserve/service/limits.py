"""Limits on what one request may ask and on how much runs at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from blendserve.errors import InvalidRequest, ServiceOverloaded
from blendserve.service.errors import send_error

if TYPE_CHECKING:
    from blendserve.service.settings import Settings

__all__ = [
    "LARGE_BODY_BYTES",
    "NO_SAMPLES",
    "Admission",
    "BodySizeLimit",
    "Budget",
    "HeldStreamingResponse",
    "JobLimits",
    "Passed",
    "Prompt",
    "Slot",
]

#: A question's prompt (text or token ids) or chat messages.
Prompt = str | Sequence[int] | Sequence[Mapping[str, Any]]


class Budget(NamedTuple):
    """A request's sample budget as the limits see it, both ways, named by its field.

    Attributes:
        per_question: samples per question on average.
        total: samples for the whole request.
        param: the field the budget was given in.
    """

    per_question: float
    total: float
    param: str


#: The budget of a request that asks for no samples (the tokenizer routes).
NO_SAMPLES = Budget(0, 0, "")


class Passed(NamedTuple):
    """Fields a request sends upstream with every one of its engine requests.

    Attributes:
        fields: the fields, by name.
        param: the field that holds them (``sampling.extra``); empty: they are the
            body's own, and the largest is named.
    """

    fields: Mapping[str, Any]
    param: str = ""


def _json_bytes(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON, as an upstream request carries it."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", "surrogatepass"))


class JobLimits:
    """The shape limits of one job (``/solve``) or one ``/v1`` request: the ``max_*`` settings.

    ``max_prompt_bytes`` bounds one question's prompt or messages in UTF-8, and
    ``max_extra_bytes`` the JSON of the fields sent with every engine request
    (:class:`Passed`).
    """

    def __init__(
        self,
        max_questions: int,
        max_budget: int,
        max_budget_per_question: float,
        max_prompt_bytes: int,
        max_extra_bytes: int = 64 << 10,
    ) -> None:
        self.max_questions = max_questions
        self.max_budget = max_budget
        self.max_budget_per_question = max_budget_per_question
        self.max_prompt_bytes = max_prompt_bytes
        self.max_extra_bytes = max_extra_bytes

    @classmethod
    def from_settings(cls, settings: Settings) -> JobLimits:
        """The limits the service's settings give."""
        return cls(
            settings.max_questions_per_job,
            settings.max_budget_per_job,
            settings.max_budget_per_question,
            settings.max_prompt_bytes,
            settings.max_extra_bytes,
        )

    def check(
        self,
        prompts: Mapping[str, Prompt],
        budget: Budget,
        *,
        param: str,
        passed: Passed | None = None,
    ) -> None:
        """Raises a 422 naming the offending field when a limit is passed.

        ``prompts`` maps each question's field (``questions.0.prompt``, ``messages``)
        to its prompt or chat messages; the other arguments are as for
        :func:`~blendserve.service.admission.admitted`.
        """
        if passed is not None:
            self._check_passed(passed)
        count = len(prompts)
        if count > self.max_questions:
            raise InvalidRequest(
                f"{count} questions: at most {self.max_questions} per job", param=param
            )
        if budget.total > self.max_budget:
            raise InvalidRequest(
                f"budget of {budget.total:g} samples: at most {self.max_budget} per job",
                param=budget.param,
            )
        if count and budget.per_question > self.max_budget_per_question:
            raise InvalidRequest(
                f"{budget.per_question:g} samples per question: at most "
                f"{self.max_budget_per_question:g}",
                param=budget.param,
            )
        for param, prompt in prompts.items():
            text = prompt if isinstance(prompt, str) else json.dumps(prompt)
            size = len(text.encode())
            if size > self.max_prompt_bytes:
                raise InvalidRequest(
                    f"prompt of {size} bytes: at most {self.max_prompt_bytes}", param=param
                )

    def _check_passed(self, passed: Passed) -> None:
        """Each upstream request carries these again: 1 MB of them is 10 GB for 10,000."""
        if not passed.fields:
            return
        size = _json_bytes(passed.fields)
        if size <= self.max_extra_bytes:
            return
        largest = max(passed.fields, key=lambda name: _json_bytes(passed.fields[name]))
        what = passed.param or f"fields passed upstream as they are (the largest: {largest})"
        raise InvalidRequest(
            f"{what}: {size} bytes of JSON, sent with every upstream request: at most "
            f"{self.max_extra_bytes}",
            param=passed.param or largest,
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

    def admit(self, questions: int, *, param: str = "questions") -> Slot:
        """One job slot and ``questions`` question slots, held until :meth:`Slot.release`.

        Raises:
            InvalidRequest: more questions than ever fit (naming ``param``);
                a retry cannot help, so not a 429.
            ServiceOverloaded: a limit would be passed now.
        """
        if questions > self.max_questions:
            raise InvalidRequest(
                f"{questions} questions: at most {self.max_questions} run at once", param=param
            )
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
    """What one admitted request holds; :meth:`release` gives it back (once).

    A question slot can be given back early, once its question is answered
    (:meth:`answered`): a long job, or a stream its client reads slowly, then
    holds only the questions still running.
    """

    def __init__(self, admission: Admission, questions: int) -> None:
        self._admission: Admission | None = admission
        self._questions = questions

    def answered(self, questions: int = 1) -> None:
        """Gives back ``questions`` question slots (at most those still held)."""
        count = min(questions, self._questions)
        if self._admission is not None and count > 0:
            self._admission.questions -= count
            self._questions -= count

    def release(self) -> None:
        """Gives the slots back; later calls do nothing."""
        if self._admission is not None:
            self._admission.jobs -= 1
            self._admission.questions -= self._questions
            self._admission = None


class HeldStreamingResponse(StreamingResponse):
    """A streamed response that holds ``slot`` until it ends, however it ends.

    When the response ends (finished, failed, cancelled, or the client left) the
    body is closed, ``on_close`` runs and the slot is released, even if the body
    never started: a generator's own ``finally`` would not run then. Other
    arguments are ``StreamingResponse``'s.
    """

    def __init__(
        self,
        content: AsyncIterator[str] | AsyncIterator[bytes],
        slot: Slot,
        *,
        on_close: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._content = content
        self._slot = slot
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                if isinstance(self._content, AsyncGenerator):
                    await self._content.aclose()
                if self._on_close is not None:
                    self._on_close()
            finally:
                self._slot.release()


#: Bodies of this many bytes or more are given to the application one per turn of the loop.
LARGE_BODY_BYTES = 64 * 1024


class BodySizeLimit:
    """Answers 413 to a request body over ``max_bytes``, declared or streamed.

    The 413 closes the connection: the rest of the body is never read. Paths in
    ``path_bytes`` have a limit of their own instead (the tokenizer routes). The
    application parses a body in one step of the event loop, so a body of
    :data:`LARGE_BODY_BYTES` or more is handed over only once the previous large
    one has been taken: large bodies arriving together do not make one turn of
    the loop (which ``/health`` waits out) last the sum of their validations.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, path_bytes: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_bytes = dict(path_bytes or {})
        self._large = asyncio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_bytes.get(scope.get("path", ""), self.max_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, limit)
            return
        read = await self._read(receive, limit)
        if read is None:
            return  # the client left (or a body deadline passed) before its body was in
        messages, received = read
        if received > limit:
            await self._refuse(send, limit)
            return
        replay = iter(messages)
        held = received >= LARGE_BODY_BYTES
        if held:
            await self._large.acquire()

        def hand_over() -> None:
            nonlocal held
            if held:  # at the next turn: a body that arrived with this one waits for it
                held = False
                asyncio.get_running_loop().call_soon(self._large.release)

        async def replayed() -> Message:
            message = next(replay, None)
            if message is None or not message.get("more_body", False):
                hand_over()  # the last part: the application parses the body in this step
            return message or await receive()

        async def sending(message: Message) -> None:
            hand_over()  # answered without reading its body
            await send(message)

        try:
            await self.app(scope, replayed, sending)
        finally:
            hand_over()

    async def _read(self, receive: Receive, limit: int) -> tuple[list[Message], int] | None:
        """The whole body's messages and size (stopping once over the limit); None: gone.

        Read whole before the app sees it: a body over the limit never reaches a handler.
        """
        messages: list[Message] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            messages.append(message)
            received += len(message.get("body", b""))
            if received > limit or not message.get("more_body", False):
                return messages, received

    async def _refuse(self, send: Send, limit: int) -> None:
        message = f"request body over {limit} bytes"
        await send_error(send, 413, message, headers=[(b"connection", b"close")])
