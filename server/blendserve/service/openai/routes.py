"""``POST /v1/chat/completions`` and ``POST /v1/completions``: voted answers, drop-in."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from blendserve.engines.base import Engine, GenerateRequest, Sample
from blendserve.engines.passthrough import PassThrough
from blendserve.errors import BlendserveError
from blendserve.scheduler import AnswerEvent, Question
from blendserve.service.admission import admitted
from blendserve.service.errors import error_body, error_responses, status_for
from blendserve.service.jobs import JobOptions
from blendserve.service.limits import Prompt
from blendserve.service.openai.online import DropIn
from blendserve.service.openai.render import (
    DONE,
    Reply,
    choices_from_answers,
    choices_from_samples,
    usage_of,
    vote_out,
)
from blendserve.service.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
)
from blendserve.service.openai.served import ServedModels
from blendserve.service.security import ClientIds
from blendserve.service.settings import Settings
from blendserve.service.vocabulary import check_extra

__all__ = ["router"]

router = APIRouter(prefix="/v1")

_STREAMED: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "chunks when streamed"},
    **error_responses(400, 401, 404, 413, 422, 429, 502, 503, 504),
}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_Body = TypeVar("_Body", ChatCompletionRequest, CompletionRequest)


@router.post("/chat/completions", response_model=ChatCompletion, responses=_STREAMED)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response | Any:
    """A chat completion whose content is a sampled completion with the voted answer.

    ``blendserve`` in the body overrides the server's self-consistency
    settings; ``{"blendserve": {"enabled": false}}`` passes the request upstream.
    ``model`` must be one of ``GET /v1/models`` (else a 404) unless the server
    allows aliases.
    """
    body = await _served(request, body)
    if not body.blendserve.enabled:
        return await _pass_through(request, "/chat/completions", body)
    question = Question("0", messages=body.messages)
    return await _self_consistent(request, body, [question], body.token_limit, chat=True)


@router.post("/completions", response_model=Completion, responses=_STREAMED)
async def completions(body: CompletionRequest, request: Request) -> Response | Any:
    """A text completion per prompt (a list of prompts is a batch of questions)."""
    body = await _served(request, body)
    if not body.blendserve.enabled:
        return await _pass_through(request, "/completions", body)
    questions = [Question(str(i), prompt=p) for i, p in enumerate(body.prompts)]
    return await _self_consistent(request, body, questions, body.max_tokens, chat=False)


async def _served(request: Request, body: _Body) -> _Body:
    """``body`` naming the model it runs on: as asked, or the one an alias stands for.

    Raises:
        ModelNotFound: the engine does not serve the model asked for.
    """
    served: ServedModels = request.app.state.served_models
    model = await served.resolve(body.model)
    return body if model == body.model else body.model_copy(update={"model": model})


def _model(request: Request, asked: str | None) -> str:
    settings: Settings = request.app.state.settings
    engine: Engine = request.app.state.engine
    return asked or settings.model or engine.name


async def _self_consistent(
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    questions: Sequence[Question],
    max_tokens: int | None,
    *,
    chat: bool,
) -> Response | Any:
    settings: Settings = request.app.state.settings
    grouper: DropIn = request.app.state.grouper
    clients: ClientIds = request.app.state.clients
    options = body.blendserve
    answer = options.answer
    budget = options.budget_per_question or settings.sc_budget_per_question
    temperature = body.temperature
    # Greedy decoding has one answer: more samples would only repeat it.
    one_sample = temperature == 0 and settings.sc_greedy_temperature is None
    if one_sample:
        budget = 1
    elif temperature == 0:
        temperature = settings.sc_greedy_temperature
    group = JobOptions(
        policy=options.policy or settings.sc_policy,
        answer_kind=answer.kind if answer is not None else settings.sc_answer,
        answer_pattern=answer.pattern if answer is not None else None,
        settle_delta=(
            options.settle_delta if options.settle_delta is not None else settings.sc_settle_delta
        ),
        sampling=body.sampling(max_tokens, temperature),
        model=body.model,
    )
    check_extra(group.sampling.extra)
    questions_param, prompts = _prompt_fields(body, [q.prompt or q.messages for q in questions])
    async with admitted(
        request,
        len(questions),
        param=questions_param,
        prompts=prompts,
        budget=budget * len(questions),
        budget_param="blendserve.budget_per_question",
    ) as held:
        ticket = grouper.submit(
            group,
            questions,
            budget,
            confidence=None if one_sample else options.confidence,
            # A job spends exactly its budget (one sample each); a pool paces a mean.
            policy_asked=options.policy is not None or one_sample,
            client=clients.of(request.headers),
        )
        # Each question gives its slot back once answered, not when its request or its
        # group ends: a question answered early in a large request, or a stream read
        # slowly, holds nothing.
        for future in ticket.futures:
            future.add_done_callback(lambda _: held.slot.answered())
        reply = Reply(chat, _model(request, body.model))

        def render(events: list[AnswerEvent]) -> tuple[Any, ...]:
            choices = choices_from_answers(events, body.n)
            usage = usage_of(
                sum(e.usage.prompt_tokens for e in events),
                sum(e.usage.completion_tokens for e in events),
            )
            return choices, usage, [vote_out(e, temperature) for e in events]

        if body.stream:
            return held.stream(
                _voted_stream(reply, ticket.answers, render, body.include_usage),
                on_close=ticket.abandon,  # a no-op once answered
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
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
        error = error_body(str(exc), type(exc).__name__, status_for(exc))
        yield f"data: {json.dumps(error)}\n\n"
        yield DONE
        return
    choices, usage, votes = render(events)
    for chunk in reply.chunks(choices, usage if include_usage else None, votes):
        yield chunk


def _prompt_fields(
    body: ChatCompletionRequest | CompletionRequest, prompts: Sequence[Prompt | None]
) -> tuple[str, dict[str, Prompt]]:
    """The field listing the questions, and each question's prompt by its field."""
    param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    listed = isinstance(body, CompletionRequest) and body.batched
    fields = {f"{param}.{i}" if listed else param: p or "" for i, p in enumerate(prompts)}
    return param, fields


async def _pass_through(
    request: Request, path: str, body: ChatCompletionRequest | CompletionRequest
) -> Response | Any:
    """The request as the client sent it (less ``blendserve``), to the upstream."""
    raw: dict[str, Any] = await request.json()
    raw.pop("blendserve", None)
    if body.model is not None:
        raw["model"] = body.model  # the model an alias stands for
    engine: Engine = request.app.state.engine
    # Held until the reply has been relayed: passed-through requests count as jobs too,
    # and their samples (n a prompt) are bounded as a voted request's are.
    asked = body.prompts if isinstance(body, CompletionRequest) else [body.messages]
    param, prompts = _prompt_fields(body, asked)
    async with admitted(
        request,
        len(prompts),
        param=param,
        prompts=prompts,
        budget=body.n * len(prompts),
        budget_param="n",
    ) as held:
        forwarded = engine.forward(path, raw) if isinstance(engine, PassThrough) else None
        reply = await held.wait(forwarded) if forwarded is not None else None
        if reply is not None:
            sse = reply.content_type.startswith("text/event-stream")
            return held.stream(
                reply.body,
                status_code=reply.status,
                media_type=reply.content_type,
                headers=_SSE_HEADERS if sse else None,
            )
    return await _emulate(request, body)


async def _emulate(
    request: Request, body: ChatCompletionRequest | CompletionRequest
) -> Response | Any:
    """Passthrough on an engine with no OpenAI upstream: plain samples via ``generate``."""
    chat = isinstance(body, ChatCompletionRequest)
    n = body.n
    engine: Engine = request.app.state.engine
    if isinstance(body, ChatCompletionRequest):
        asks = [
            GenerateRequest(
                messages=body.messages,
                n=n,
                params=body.sampling(body.token_limit),
                model=body.model,
            )
        ]
    else:
        asks = [
            GenerateRequest(prompt=p, n=n, params=body.sampling(), model=body.model)
            for p in body.prompts
        ]
    # The service's own samples: the same limits and admission as a voted request.
    param, prompts = _prompt_fields(body, [ask.prompt or ask.messages for ask in asks])
    async with admitted(
        request, len(asks), param=param, prompts=prompts, budget=n * len(asks), budget_param="n"
    ) as held:
        results: list[list[Sample]] = await held.wait(
            asyncio.gather(*(engine.generate(ask) for ask in asks))
        )
    reply = Reply(chat, _model(request, body.model))
    choices = [c for i, samples in enumerate(results) for c in choices_from_samples(samples, i * n)]
    samples = [s for result in results for s in result]
    usage = usage_of(
        sum(result[0].prompt_tokens for result in results if result),
        sum(s.completion_tokens for s in samples),
    )
    if body.stream:
        lines = [
            reply.opening(),
            *reply.chunks(choices, usage if body.include_usage else None, None),
        ]
        return StreamingResponse(iter(lines), media_type="text/event-stream", headers=_SSE_HEADERS)
    return reply.full(choices, usage, None)
