"""What ``/v1`` does with a parsed request: voted answers, pass-through, plain samples.

The routes (:mod:`blendserve.service.openai.routes`) parse and delegate here,
as vLLM splits its OpenAI routes from their serving classes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from blendserve.engines.base import GenerateRequest, Sample
from blendserve.engines.passthrough import PassThrough
from blendserve.errors import BlendserveError
from blendserve.scheduler import AnswerEvent, Question
from blendserve.service.admission import admitted
from blendserve.service.errors import error_body, status_for
from blendserve.service.jobs import JobOptions
from blendserve.service.limits import Budget, Passed, Prompt
from blendserve.service.openai.render import (
    DONE,
    Reply,
    choices_from_answers,
    choices_from_samples,
    reasoning_tokens_of,
    usage_of,
    vote_out,
)
from blendserve.service.openai.schemas import ChatCompletionRequest, CompletionRequest
from blendserve.service.state import ServiceState, service_of
from blendserve.service.vocabulary import check_extra

__all__ = ["serve"]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_Body = ChatCompletionRequest | CompletionRequest


async def serve(request: Request, body: _Body) -> Any:
    """The reply to a chat or text completion request: voted, or passed through."""
    state = service_of(request)
    body = await _served(state, body)
    if not body.blendserve.enabled:
        return await _pass_through(request, state, body)
    if isinstance(body, ChatCompletionRequest):
        questions = [Question("0", messages=body.messages)]
        return await _self_consistent(request, state, body, questions, body.token_limit)
    questions = [Question(str(i), prompt=p) for i, p in enumerate(body.prompts)]
    return await _self_consistent(request, state, body, questions, body.max_tokens)


async def _served(state: ServiceState, body: _Body) -> _Body:
    """``body`` naming the model it runs on: as asked, or the one an alias stands for.

    Raises:
        ModelNotFound: the engine does not serve the model asked for.
    """
    model = await state.served_models.resolve(body.model)
    return body if model == body.model else body.model_copy(update={"model": model})


def _model(state: ServiceState, asked: str | None) -> str:
    return asked or state.settings.model or state.engine.name


@dataclass(frozen=True)
class _Voting:
    """How a ``/v1`` request's questions are voted on: its job options, mean samples per
    question or quality target (``confidence``), and the temperature samples are drawn at;
    ``policy_asked``: it named a policy (or is greedy), so a job, not a pool, votes.
    """

    options: JobOptions
    budget_per_question: float
    confidence: float | None
    policy_asked: bool
    temperature: float | None


def _voting(state: ServiceState, body: _Body, max_tokens: int | None) -> _Voting:
    settings = state.settings
    asked = body.blendserve
    temperature = body.temperature
    # Greedy decoding has one answer: more samples would only repeat it.
    greedy = temperature == 0 and settings.sc_greedy_temperature is None
    if temperature == 0 and not greedy:
        temperature = settings.sc_greedy_temperature
    defaults = JobOptions(
        policy=settings.sc_policy,
        answer_kind=settings.sc_answer,
        settle_delta=settings.sc_settle_delta,
    )
    options = JobOptions.asked(
        asked, body.sampling(max_tokens, temperature), body.model, defaults=defaults
    )
    check_extra(options.sampling.extra)
    return _Voting(
        options,
        1 if greedy else asked.budget_per_question or settings.sc_budget_per_question,
        None if greedy else asked.confidence,
        asked.policy is not None or greedy,  # a greedy job spends exactly one sample each
        temperature,
    )


async def _self_consistent(
    request: Request,
    state: ServiceState,
    body: _Body,
    questions: Sequence[Question],
    max_tokens: int | None,
) -> Any:
    voting = _voting(state, body, max_tokens)
    param, prompts = _prompt_fields(body, [q.prompt or q.messages for q in questions])
    budget = Budget(
        voting.budget_per_question,
        voting.budget_per_question * len(questions),
        "blendserve.budget_per_question",
    )
    passed = Passed(voting.options.sampling.extra)
    async with admitted(request, prompts, budget, param=param, passed=passed) as held:
        ticket = state.dropin.submit(
            voting.options,
            questions,
            voting.budget_per_question,
            confidence=voting.confidence,
            policy_asked=voting.policy_asked,
            client=state.clients.of(request.headers),
        )
        # Each question gives its slot back once answered, not when its request or its
        # group ends: a question answered early in a large request, or a stream read
        # slowly, holds nothing.
        for future in ticket.futures:
            future.add_done_callback(lambda _: held.slot.answered())
        reply = Reply(isinstance(body, ChatCompletionRequest), _model(state, body.model))

        def render(events: list[AnswerEvent]) -> tuple[Any, ...]:
            choices = choices_from_answers(events, body.n)
            usage = usage_of(
                sum(e.usage.prompt_tokens for e in events),
                sum(e.usage.completion_tokens for e in events),
                reasoning_tokens_of(e.usage.reasoning_tokens for e in events),
            )
            return choices, usage, [vote_out(e, voting.temperature) for e in events]

        if body.stream:
            return held.stream(
                _voted_stream(reply, ticket.answers, render, body.include_usage),
                on_close=ticket.abandon,  # a no-op once answered
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        events = await held.wait(ticket.answers(), on_gone=ticket.abandon)
    return reply.full(*render(events))


async def _voted_stream(
    reply: Reply,
    answers: Callable[[], Awaitable[list[AnswerEvent]]],
    render: Callable[[list[AnswerEvent]], tuple[Any, ...]],
    include_usage: bool,
) -> AsyncIterator[str]:
    """The opening chunk at once, then the answers' chunks once every question is answered."""
    yield reply.opening()
    try:
        events = await answers()
    except BlendserveError as exc:
        # The 200 went out with the opening chunk: the error is a chunk.
        yield f"data: {json.dumps(error_body(str(exc), status_for(exc)))}\n\n"
        yield DONE
        return
    choices, usage, votes = render(events)
    for chunk in reply.chunks(choices, usage if include_usage else None, votes):
        yield chunk


def _prompt_fields(body: _Body, prompts: Sequence[Prompt | None]) -> tuple[str, dict[str, Prompt]]:
    """The field listing the questions, and each question's prompt by its field."""
    param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    listed = isinstance(body, CompletionRequest) and body.batched
    fields = {f"{param}.{i}" if listed else param: p or "" for i, p in enumerate(prompts)}
    return param, fields


def _samples_budget(body: _Body, prompts: int) -> Budget:
    """A request that is not voted on asks ``n`` samples of each prompt."""
    return Budget(body.n, body.n * prompts, "n")


async def _pass_through(request: Request, state: ServiceState, body: _Body) -> Any:
    """The request as the client sent it (less ``blendserve``), to the upstream."""
    raw: dict[str, Any] = await request.json()
    raw.pop("blendserve", None)
    if body.model is not None:
        raw["model"] = body.model  # the model an alias stands for
    path = "/chat/completions" if isinstance(body, ChatCompletionRequest) else "/completions"
    engine = state.engine
    # Held until the reply has been relayed: passed-through requests count as jobs too,
    # and their samples (n a prompt) are bounded as a voted request's are.
    asked = body.prompts if isinstance(body, CompletionRequest) else [body.messages]
    param, prompts = _prompt_fields(body, asked)
    async with admitted(request, prompts, _samples_budget(body, len(prompts)), param=param) as held:
        forwarded = engine.forward(path, raw) if isinstance(engine, PassThrough) else None
        reply = await held.wait(forwarded) if forwarded is not None else None
        if reply is not None:
            sse = reply.content_type.startswith("text/event-stream")
            return held.stream(
                reply.body,
                status_code=reply.status,
                media_type=reply.content_type,
                headers=SSE_HEADERS if sse else None,
            )
    return await _emulate(request, state, body)


def _asks(body: _Body) -> list[GenerateRequest]:
    """One engine request of ``n`` plain samples per prompt."""
    if isinstance(body, ChatCompletionRequest):
        params = body.sampling(body.token_limit)
        return [GenerateRequest(messages=body.messages, n=body.n, params=params, model=body.model)]
    return [
        GenerateRequest(prompt=p, n=body.n, params=body.sampling(), model=body.model)
        for p in body.prompts
    ]


async def _emulate(request: Request, state: ServiceState, body: _Body) -> Response | Any:
    """Passthrough on an engine with no OpenAI upstream: plain samples via ``generate``."""
    n = body.n
    asks = _asks(body)
    # The service's own samples: the same limits and admission as a voted request.
    param, prompts = _prompt_fields(body, [ask.prompt or ask.messages for ask in asks])
    budget, passed = _samples_budget(body, len(asks)), Passed(asks[0].params.extra)
    async with admitted(request, prompts, budget, param=param, passed=passed) as held:
        results: list[list[Sample]] = await held.wait(
            asyncio.gather(*(state.engine.generate(ask) for ask in asks))
        )
    reply = Reply(isinstance(body, ChatCompletionRequest), _model(state, body.model))
    tags = state.job_maker.defaults.reasoning_tags
    choices = [
        c for i, samples in enumerate(results) for c in choices_from_samples(samples, i * n, tags)
    ]
    samples = [s for result in results for s in result]
    usage = usage_of(
        sum(result[0].prompt_tokens for result in results if result),
        sum(s.completion_tokens for s in samples),
        reasoning_tokens_of(s.reasoning_tokens for s in samples),
    )
    if body.stream:
        lines = [
            reply.opening(),
            *reply.chunks(choices, usage if body.include_usage else None, None),
        ]
        return StreamingResponse(iter(lines), media_type="text/event-stream", headers=SSE_HEADERS)
    return reply.full(choices, usage, None)
