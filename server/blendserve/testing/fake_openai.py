"""A fake OpenAI-compatible upstream for tests and benchmarks; it runs no model.

``create_app(state)`` builds a FastAPI app serving ``POST /v1/chat/completions``,
``POST /v1/completions``, ``GET /v1/models`` and vLLM-named gauges at
``GET /metrics``, whose behaviour follows the
knobs of a :class:`FakeState` and which counts what it does there. Every
choice's text is unique (``"{name}:{serial}"``), so tests can tell that no
sample was returned twice.

:class:`FakeServer` serves one app with a real uvicorn server on 127.0.0.1 in
a background thread (ephemeral port, readiness polled on ``/v1/models``); it
can be killed mid-run and restarted on the same port. Run as a module for a
separate process (benchmarks)::

    python -m blendserve.testing.fake_openai --port 0 [--latency S] [--ignore-n]
        [--endless [--endless-piece N] | --endless-line]

which prints ``PORT <number>`` once bound and serves ``GET /fake/stats``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = [
    "THOUGHT",
    "THOUGHT_SHAPES",
    "FakeServer",
    "FakeState",
    "Written",
    "completion_body",
    "create_app",
]


#: How a reasoning model's samples are written (``FakeState.thoughts``): split by
#: vLLM's reasoning parser into ``reasoning`` (``parser``) or its older
#: ``reasoning_content`` (``parser_legacy``), both chat only (text completions
#: get ``tags``); raw ``<think>...</think>`` (``tags``); R1's, with no opening
#: tag (``r1``); gpt-oss's harmony channels (``harmony``).
THOUGHT_SHAPES = ("parser", "parser_legacy", "tags", "r1", "harmony")
PARSED = {"parser": "reasoning", "parser_legacy": "reasoning_content"}
#: A thought full of answers that must never vote: a box, a choice, ``####``, numbers.
THOUGHT = (
    "Let me see, 3+4 is 7? No wait, maybe \\boxed{8}. Answer: (B)? "
    "So #### 144, since 12*12 = 144. Hmm."
)
#: The per-token top logprobs of a fallen trace's words, ``-FALLEN_STEP * j`` (``fall_at``).
FALLEN_STEP = 0.002
#: What a thought cut at max_tokens ends with (it never closes).
CUT_TAIL = " But let me double check 12*12=144"


@dataclass
class FakeState:
    """Knobs and counters of one fake upstream (shared across its restarts).

    Knobs: ``honour_n`` (False: one choice whatever ``n``, like llama.cpp),
    ``latency`` (seconds before answering), ``fail_next`` (answer the next k
    completion requests with 500), ``drop`` (drop every completion request's
    connection after sending headers), ``record`` (keep request bodies),
    ``answers`` (when set, each text ends in ``"so the answer is {a}"`` with
    ``a`` drawn from it), ``tokenizer`` (serve vLLM's ``GET /tokenizer_info``,
    ``POST /tokenize`` and ``POST /detokenize``, one token per character;
    else they are 404s). A request with ``stream`` is answered with OpenAI's
    streamed chunks, ending in a usage chunk unless ``stream_usage`` is False
    (like llama.cpp's server, which ignores ``stream_options``).
    Injected faults, drawn per completion request from a generator seeded with
    ``fault_seed``: ``error_rate`` (a 500), ``timeout_rate`` (no answer until
    the client leaves; streamed: silence after the first chunk), ``drop_rate``
    (the connection drops after the headers), ``slow_rate`` (``slow_latency``
    more seconds first). Hostile upstreams: ``retry_after`` (answer every
    completion request ``retry_after_status``, 429 by default, with this
    ``Retry-After``; only the next ``retry_after_count`` when that is set),
    ``endless`` (a streamed answer that never ends, ``endless_piece``
    characters an event; ``endless_line``: one that never ends its first line
    either), ``pad_bytes`` (each text
    padded to this size), ``nested`` (every completion body, streamed chunk
    and ``GET /v1/models`` body is a JSON array nested this deep).
    Reasoning models: ``thoughts`` makes each sample think first, written
    in one of :data:`THOUGHT_SHAPES` (the thought is ``thought``, with
    ``answers`` its text ends in ``"so the final answer is {a}."``);
    ``cut_every`` cuts every k-th sample's thought at ``max_tokens`` (finish
    reason ``length``, the thought never closed, a parser's content null);
    ``reasoning_tokens`` reports each sample's thought tokens in
    ``usage.completion_tokens_details``; ``reasoning_tags`` are the tags a raw
    thought is written between.
    Unusable answers, to completion requests whose body (as JSON text) contains
    ``target`` (every one when it is empty): ``usage_tokens`` (the usage
    reports this many completion tokens, per choice too), ``garbage_2xx`` (a
    200 ``text/html`` error page, as a proxy in front of a dead server
    answers), ``stream_error`` (streamed: one text chunk, then vLLM's error
    chunk, ``data: {"error": ...}``, and ``data: [DONE]``), ``bad_chunk``
    (streamed: this chunk after the first text chunk). ``multiline_data``
    writes every streamed event as the SSE specification allows and vLLM does
    not: a comment first, its JSON indented over several ``data:`` lines, CRLF
    line ends.
    ``authorizations`` records each completion request's ``Authorization``.
    ``step_cost``: an engine whose decode step costs a known time: ``(a, c)``
    seconds make a completion request of ``n`` choices and ``max_tokens`` T
    take ``latency + T * (a + n * c)`` seconds, each choice
    report T completion tokens and the prompt ``len(prompt) // 4`` tokens;
    ``/metrics`` then serves vLLM's step series, priced by the same line at
    the sequences running (:meth:`step_series`).
    Engines calibrate cannot believe: ``token_scale`` multiplies every token
    count the usage reports, ``prompt_tokens`` is the prompt's count reported
    whatever the prompt, ``speed_change`` ``(k, f)`` multiplies ``step_cost``'s
    times by ``f`` from the k-th completion request on.
    ``extra_metrics``: Prometheus text served after the gauges at ``/metrics``
    (a test writes vLLM's step-cost series there).
    ``slow_every``: every k-th completion request takes ``slow_latency`` more
    seconds (a straggler); ``slow_answered`` counts those answered, not left.
    ``die_by``: the process kills itself with this signal at its first
    completion request (a crashing server's stand-in; no core file is written).
    ``logprobs``: how a request that asks for logprobs is answered: ``openai`` (each
    word of a text is a token, its top logprobs ``-0.1 * j * scale`` for j = 1..k,
    ``scale`` the sample's serial mod 3 plus 1, so its confidence is
    ``0.05 * (k + 1) * scale``; streamed a word a chunk, with its logprobs),
    ``ignored`` (none sent, as a server that does not support them), ``garbage``
    (logprobs of the wrong shape); None: as ``openai``. ``fall_at``: a streamed
    answer that asks for logprobs is a trace whose confidence falls: ``fall_at`` words
    read as ``openai`` ones, then words of confidence :data:`FALLEN` (top logprobs
    ``-0.002 * j``) without end, until the client leaves (a client that never cuts it
    runs into its ``max_tokens``); ``fallen_sent`` counts those sent.
    Counters: ``requests`` (completion requests received), ``in_flight``,
    ``max_in_flight``, ``samples_served`` (choices in answers sent),
    ``disconnects`` (clients that went away while waiting), ``model_requests``,
    ``metrics_requests``,
    ``faults`` (injected faults by kind).
    """

    name: str = "fake"
    model: str = "fake-model"
    honour_n: bool = True
    latency: float = 0.0
    step_cost: tuple[float, float] | None = None
    token_scale: int = 1
    prompt_tokens: int | None = None
    speed_change: tuple[int, float] | None = None
    fail_next: int = 0
    drop: bool = False
    record: bool = True
    answers: tuple[str, ...] = ()
    tokenizer: bool = False
    stream_usage: bool = True
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    drop_rate: float = 0.0
    slow_rate: float = 0.0
    slow_latency: float = 0.0
    fault_seed: int = 0
    retry_after: str | None = None
    retry_after_status: int = 429
    retry_after_count: int | None = None
    endless: bool = False
    endless_line: bool = False
    endless_piece: int = 4096
    pad_bytes: int = 0
    nested: int = 0
    target: str = ""
    usage_tokens: int | None = None
    garbage_2xx: bool = False
    stream_error: bool = False
    bad_chunk: Any = None
    multiline_data: bool = False
    thoughts: str | None = None
    thought: str = THOUGHT
    cut_every: int = 0
    reasoning_tokens: int | None = None
    reasoning_tags: tuple[str, str] = ("<think>", "</think>")
    authorizations: list[str | None] = field(default_factory=list)
    die_by: int = 0
    slow_every: int = 0
    slow_answered: int = 0
    extra_metrics: str = ""
    logprobs: str | None = None
    fall_at: int | None = None
    fallen_sent: int = 0
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    samples_served: int = 0
    disconnects: int = 0
    model_requests: int = 0
    metrics_requests: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    _serial: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    # step_cost's requests: (start, end, n, steps, prompt tokens)
    _stepped: list[tuple[float, float, int, int, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._rng.seed(self.fault_seed)

    def next_text(self) -> str:
        self._serial += 1
        text = f"{self.name}:{self._serial}"
        if self.answers:
            answer = self._rng.choice(self.answers)
            text += (
                f" so the final answer is {answer}."
                if self.thoughts
                else f" so the answer is {answer}"
            )
        return text + " " * (self.pad_bytes - len(text))

    def write(self, chat: bool) -> Written:
        """The next sample, as the upstream writes it (with a thought if ``thoughts``)."""
        text = self.next_text()
        if self.thoughts is None:
            finish = "stop" if chat else "length"
            return Written(text, finish_reason=finish, scale=self._serial % 3 + 1)
        if self.thoughts not in THOUGHT_SHAPES:
            raise ValueError(f"unknown thought shape {self.thoughts!r}")
        cut = self.cut_every > 0 and self._serial % self.cut_every == 0
        thought = self.thought + (CUT_TAIL if cut else "")
        finish = "length" if cut else "stop"
        field = PARSED.get(self.thoughts)
        if field is not None and chat:
            return Written(None if cut else text, thought, field, finish)
        raw = _raw_thought(self.thoughts, thought, None if cut else text, self.reasoning_tags)
        return Written(raw, None, "", finish)

    def draw_fault(self) -> str | None:
        """The fault to inject into the next completion request, if any."""
        draw = self._rng.random()
        for kind, rate in (
            ("error", self.error_rate),
            ("timeout", self.timeout_rate),
            ("drop", self.drop_rate),
            ("slow", self.slow_rate),
        ):
            if draw < rate:
                self.faults[kind] = self.faults.get(kind, 0) + 1
                return kind
            draw -= rate
        return None

    def step(self, body: dict[str, Any], n: int) -> None:
        """Starts modelling ``step_cost``'s steps of a request of ``n`` choices now."""
        if self.step_cost is not None:
            per_step, per_sequence = self.step_cost
            steps = int(body.get("max_tokens") or 16)
            prompt = _usage(self, 1, body)["prompt_tokens"]
            start = time.monotonic() + self.latency
            end = start + steps * (per_step + n * per_sequence)
            self._stepped.append((start, end, n, steps, prompt))

    def step_series(self) -> str:
        """vLLM's step and request series so far (see ``step_cost``): while ``k`` sequences run,
        a step of ``k`` tokens every ``a + k c`` seconds; a request's tokens once it ends."""
        if self.step_cost is None:
            return ""
        per_step, per_sequence = self.step_cost
        now = time.monotonic()
        events = sorted(
            [(min(start, now), n) for start, _, n, _, _ in self._stepped]
            + [(min(end, now), -n) for _, end, n, _, _ in self._stepped]
        )
        totals = dict.fromkeys(("steps", "tokens", "requests", "prompt", "generation"), 0.0)
        running, since = 0, 0.0
        for at, change in events:
            if running:
                steps = (at - since) / (per_step + running * per_sequence)
                totals["steps"] += steps
                totals["tokens"] += running * steps
            running, since = running + change, at
        for _, end, n, steps, prompt in self._stepped:
            if end <= now:
                totals["requests"] += n
                totals["prompt"] += n * prompt
                totals["generation"] += n * steps
        labels = f'{{model_name="{self.model}"}}'
        return "".join(
            f"vllm:{name}{labels} {totals[key]}\n"
            for name, key in (
                ("iteration_tokens_total_count", "steps"),
                ("iteration_tokens_total_sum", "tokens"),
                ("generation_tokens_total", "tokens"),
                ("request_prompt_tokens_count", "requests"),
                ("request_prompt_tokens_sum", "prompt"),
                ("request_generation_tokens_count", "requests"),
                ("request_generation_tokens_sum", "generation"),
            )
        )

    def targets(self, body: dict[str, Any]) -> bool:
        """Whether the unusable-answer knobs apply to a request of ``body``."""
        return not self.target or self.target in json.dumps(body)

    def stats(self) -> dict[str, Any]:
        hidden = ("bodies", "authorizations", "bad_chunk")
        return {k: v for k, v in asdict(self).items() if k not in hidden and not k.startswith("_")}


_HANG_S = 3600.0  # an injected timeout: longer than any test waits


@dataclass(frozen=True)
class Written:
    """One sample as the fake writes it.

    Attributes:
        text: its text (chat: its content; None: a reasoning parser's null content).
        reasoning: its thought, split out by a reasoning parser (None: not split).
        field: the message field the parser writes the thought to.
        finish_reason: ``stop``, or ``length`` when cut.
        scale: what its tokens' logprobs are multiplied by (``FakeState.logprobs``).
    """

    text: str | None
    reasoning: str | None = None
    field: str = ""
    finish_reason: str = "stop"
    scale: int = 1


def asked_logprobs(body: dict[str, Any] | None) -> int:
    """The top logprobs a request body asks for (0: none)."""
    if body is None or not body.get("logprobs"):
        return 0
    if "messages" in body:
        return int(body.get("top_logprobs") or 0)
    return int(body["logprobs"])


def fallen_confidence(k: int) -> float:
    """The confidence of a fallen word's token (``fall_at``) read from its top ``k``."""
    return FALLEN_STEP * (k + 1) / 2


def _logprobs(
    state: FakeState, words: list[str], scale: int, k: int, chat: bool, step: float = 0.1
) -> Any:
    """``words``' logprobs in the API's shape (``FakeState.logprobs``): the top ``k`` of each
    ``-step * j * scale``."""
    if state.logprobs == "garbage":
        return {"content": "not a list"} if chat else {"top_logprobs": 7}
    tops = [[-step * j * scale for j in range(1, k + 1)] for _ in words]
    if chat:
        return {
            "content": [
                {
                    "token": w,
                    "logprob": top[0],
                    "top_logprobs": [{"token": f"t{j}", "logprob": lp} for j, lp in enumerate(top)],
                }
                for w, top in zip(words, tops, strict=True)
            ]
        }
    return {
        "tokens": words,
        "token_logprobs": [top[0] for top in tops],
        "top_logprobs": [{f"t{j}": lp for j, lp in enumerate(top)} for top in tops],
        "text_offset": [0] * len(words),
    }


def _words(text: str) -> list[str]:
    """A text's tokens, as the fake counts them: its words, each with the space before it."""
    words = text.split(" ")
    return [words[0], *(" " + w for w in words[1:])]


def _raw_thought(shape: str, thought: str, final: str | None, tags: tuple[str, str]) -> str:
    """A thought and a final answer (None: the thought was cut) as a model writes them raw."""
    if shape == "harmony":
        text = f"<|channel|>analysis<|message|>{thought}"
        if final is not None:
            text += f"<|end|><|start|>assistant<|channel|>final<|message|>{final}<|return|>"
        return text
    opening = "" if shape == "r1" else tags[0]  # R1's template opens the thought itself
    return opening + thought + ("" if final is None else f"{tags[1]}\n\n{final}")


class _Dropped(Exception):
    """Raised after the headers went out, so that uvicorn closes the connection."""


class _DropConnection(Response):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"64")]}
        )
        raise _Dropped("fake upstream dropped the connection")


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _wait(request: Request, latency: float, killed: asyncio.Event) -> str:
    """Waits ``latency``; returns ``done``, ``disconnected`` or ``killed``."""
    waits = {
        asyncio.ensure_future(asyncio.sleep(latency)): "done",
        asyncio.ensure_future(_until_disconnect(request)): "disconnected",
        asyncio.ensure_future(killed.wait()): "killed",
    }
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.wait(pending)
    return next(waits[t] for t in waits if t in done)


def _event(data: dict[str, Any], multiline: bool = False) -> str:
    if not multiline:
        return f"data: {json.dumps(data)}\n\n"
    lines = "".join(f"data: {line}\r\n" for line in json.dumps(data, indent=1).splitlines())
    return f": a comment\r\n{lines}\r\n"


#: What a proxy in front of a dead model server answers, with status 200.
ERROR_PAGE = "<html><body><h1>502 Bad Gateway</h1><p>upstream unavailable</p></body></html>"
#: vLLM's chunk for a failure during a stream.
ERROR_CHUNK = {"error": {"message": "injected failure mid-stream", "type": "Internal", "code": 500}}


def _pieces(
    written: Written, chat: bool, state: FakeState | None = None, k: int = 0
) -> list[dict[str, Any]]:
    """One sample's deltas (chat) or texts: its thought in two halves, then its text
    (asked for ``k`` logprobs: a word a chunk, each with its logprobs)."""
    pieces: list[dict[str, Any]] = []
    if written.reasoning is not None:
        half = len(written.reasoning) // 2
        for part in (written.reasoning[:half], written.reasoning[half:]):
            pieces.append({"delta": {written.field: part}})
    if written.text is None:
        return pieces
    if state is None or not k or state.logprobs == "ignored":
        pieces.append({"delta": {"content": written.text}} if chat else {"text": written.text})
        return pieces
    for word in _words(written.text):
        piece: dict[str, Any] = {"delta": {"content": word}} if chat else {"text": word}
        piece["logprobs"] = _logprobs(state, [word], written.scale, k, chat)
        pieces.append(piece)
    return pieces


def _usage(state: FakeState, n: int, body: dict[str, Any] | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": 3, "completion_tokens": 5 * n}
    if state.step_cost is not None and body is not None:
        prompt = body.get("prompt") or json.dumps(body.get("messages"))
        tokens = int(body.get("max_tokens") or 16)
        usage = {"prompt_tokens": len(str(prompt)) // 4, "completion_tokens": tokens * n}
    if state.prompt_tokens is not None:
        usage["prompt_tokens"] = state.prompt_tokens
    for key in ("prompt_tokens", "completion_tokens"):
        usage[key] *= state.token_scale
    if state.reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": state.reasoning_tokens * n}
    if state.usage_tokens is not None and body is not None and state.targets(body):
        usage["completion_tokens"] = state.usage_tokens
    return usage


class _Stream(StreamingResponse):
    """A streamed answer that counts, once it is over, whether its client left first.

    Counted here rather than in the chunks' generator: a client that stops reading fills
    the socket's buffer, so its leaving cancels the server while it waits to send, outside
    the generator, which then learns of it only when it is collected.
    """

    def __init__(self, state: FakeState, chunks: AsyncIterator[str]) -> None:
        self.state = state
        self.ended = False
        super().__init__(self._until_the_end(chunks), media_type="text/event-stream")

    async def _until_the_end(self, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        async for chunk in chunks:
            yield chunk
        self.ended = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.state.in_flight -= 1
            self.state.disconnects += not self.ended


async def _chunks(
    state: FakeState,
    texts: list[Written],
    chat: bool,
    stall: bool,
    body: dict[str, Any] | None = None,
) -> AsyncIterator[str]:
    """``texts`` as OpenAI's streamed chunks; ``stall``: silence after the first chunk."""
    hostile = body is not None and state.targets(body)
    multiline = state.multiline_data

    def event(data: dict[str, Any]) -> str:
        return _event(data, multiline)

    k = asked_logprobs(body)
    async for endless in _endless(state, texts[0], chat, k, event):
        yield endless
    for i, written in enumerate(texts):
        for piece in _pieces(written, chat, state, k):
            yield event({"choices": [{"index": i, **piece}]})
            if hostile and state.stream_error:
                yield event(ERROR_CHUNK)
                yield "data: [DONE]\n\n"
                return
            if hostile and state.bad_chunk is not None:
                yield event(state.bad_chunk)
            if stall:
                await asyncio.sleep(_HANG_S)  # until the client leaves
    ends = [
        {"index": i, "finish_reason": w.finish_reason, "delta": {}}
        if chat
        else {"index": i, "finish_reason": w.finish_reason, "text": ""}
        for i, w in enumerate(texts)
    ]
    yield event({"choices": ends})
    if state.stream_usage:
        yield event({"choices": [], "usage": _usage(state, len(texts), body)})
    yield "data: [DONE]\n\n"
    state.samples_served += len(texts)


async def _endless(
    state: FakeState, written: Written, chat: bool, k: int, event: Callable[[dict[str, Any]], str]
) -> AsyncIterator[str]:
    """The streams that never end, where a knob asks for one (nothing otherwise): hostile
    ones (``endless_line``, ``endless``) and a trace whose confidence falls (``fall_at``,
    asked for ``k`` logprobs), a word a chunk."""
    if state.endless_line:  # a hostile upstream: one line for ever
        yield 'data: {"choices": [{"index": 0, "delta": {"content": "'
        while True:
            yield "x" * 4096
            await asyncio.sleep(0)
    while state.endless:  # a hostile upstream: chunks for ever
        chunk = "x" * state.endless_piece
        yield event({"choices": [{"index": 0, "delta": {"content": chunk}}]})
        await asyncio.sleep(0)
    if state.fall_at is None or not k:
        return
    for i in itertools.count():
        word = f" w{i}"
        fallen = i >= state.fall_at
        piece: dict[str, Any] = {"delta": {"content": word}} if chat else {"text": word}
        step = FALLEN_STEP if fallen else 0.1
        piece["logprobs"] = _logprobs(state, [word], 1 if fallen else written.scale, k, chat, step)
        yield event({"choices": [{"index": 0, **piece}]})
        state.fallen_sent += fallen
        await asyncio.sleep(0)  # a stream the client may leave at any chunk


async def _complete(
    state: FakeState, kill: asyncio.Event, request: Request, chat: bool
) -> Response:
    """One completion request: a fault, an error, a stream or a JSON body."""
    if state.die_by:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), state.die_by)
    body = json.loads(await request.body())
    state.requests += 1
    if state.record:
        state.bodies.append(body)
        state.authorizations.append(request.headers.get("authorization"))
    if state.retry_after is not None and state.retry_after_count != 0:
        if state.retry_after_count is not None:
            state.retry_after_count -= 1
        error = {"error": {"message": "slow down"}}
        headers = {"Retry-After": state.retry_after}
        return JSONResponse(error, state.retry_after_status, headers=headers)
    unusable = _unusable(state, body)
    if unusable is not None:
        return unusable
    fault = state.draw_fault()
    if state.fail_next > 0 or fault == "error":
        state.fail_next = max(0, state.fail_next - 1)
        return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    streamed = bool(body.get("stream"))
    try:
        outcome = "done"
        n = int(body.get("n", 1)) if state.honour_n else 1
        latency = _latency(state, body, n, fault)
        straggler = state.slow_every > 0 and state.requests % state.slow_every == 0
        latency += state.slow_latency * straggler
        state.step(body, n)
        if fault == "timeout" and not streamed:
            latency = _HANG_S
        if latency > 0:
            outcome = await _wait(request, latency, kill)
        if outcome == "disconnected":
            state.disconnects += 1
            return Response(status_code=204)  # nobody is listening
        state.slow_answered += straggler and outcome == "done"  # a straggler waited out
        if state.drop or fault == "drop" or kill.is_set():
            return _DropConnection()
        if streamed:
            texts = [state.write(chat) for _ in range(n)]
            chunks = _chunks(state, texts, chat, stall=fault == "timeout", body=body)
            state.in_flight += 1  # until the stream ends
            return _Stream(state, chunks)
        payload = completion_body(state, n, chat, body)
        state.samples_served += n
        return Response(json.dumps(payload), media_type="application/json")
    finally:
        state.in_flight -= 1


def _unusable(state: FakeState, body: dict[str, Any]) -> Response | None:
    """An unusable answer the knobs ask for (``nested``, ``garbage_2xx``), if any."""
    if state.nested:
        return _nested(state.nested, streamed=bool(body.get("stream")))
    if state.garbage_2xx and state.targets(body):
        return Response(ERROR_PAGE, media_type="text/html")
    return None


def _latency(state: FakeState, body: dict[str, Any], n: int, fault: str | None) -> float:
    """Seconds before answering: ``latency`` (and a slow fault's), or ``step_cost``'s."""
    if state.step_cost is not None:
        per_step, per_sequence = state.step_cost
        steps = int(body.get("max_tokens") or 16) * (per_step + n * per_sequence)
        if state.speed_change is not None and state.requests >= state.speed_change[0]:
            steps *= state.speed_change[1]
        return state.latency + steps
    return state.latency + (state.slow_latency if fault == "slow" else 0.0)


def _nested(depth: int, streamed: bool = False) -> Response:
    """A JSON array nested ``depth`` deep: a body, or one streamed chunk and the end."""
    deep = b"[" * depth + b"]" * depth
    if streamed:
        return Response(b"data: " + deep + b"\n\ndata: [DONE]\n\n", media_type="text/event-stream")
    return Response(deep, media_type="application/json")


def completion_body(
    state: FakeState, n: int, chat: bool, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A non-streamed completion body of ``n`` choices (``body``: the request answered)."""
    choices: list[dict[str, Any]] = []
    k = asked_logprobs(body)
    for i in range(n):
        written = state.write(chat)
        if chat:
            message = {"role": "assistant", "content": written.text}
            if written.reasoning is not None:
                message[written.field] = written.reasoning
            choices.append({"index": i, "message": message, "finish_reason": written.finish_reason})
        else:
            choices.append(
                {"index": i, "text": written.text, "finish_reason": written.finish_reason}
            )
        if k and written.text is not None and state.logprobs != "ignored":
            choices[-1]["logprobs"] = _logprobs(state, _words(written.text), written.scale, k, chat)
    if state.usage_tokens is not None and body is not None and state.targets(body):
        for choice in choices:
            choice["usage"] = {"completion_tokens": state.usage_tokens}
    return {
        "id": f"cmpl-{state.name}-{state.requests}",
        "object": "chat.completion" if chat else "text_completion",
        "model": state.model,
        "choices": choices,
        "usage": _usage(state, n, body),
    }


def _add_tokenizer(app: FastAPI, state: FakeState) -> None:
    """vLLM's tokenizer endpoints, answering 404 unless ``state.tokenizer``."""

    def no_tokenizer() -> Response:
        return JSONResponse({"detail": "Not Found"}, status_code=404)

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> Response:
        if not state.tokenizer:
            return no_tokenizer()
        info = {"eos_token": "</s>", "bos_token": None, "pad_token": None, "chat_template": None}
        return JSONResponse(info)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        if not state.tokenizer:
            return no_tokenizer()
        tokens = [ord(c) for c in (await request.json())["prompt"]]
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": 4096})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        if not state.tokenizer:
            return no_tokenizer()
        return JSONResponse({"prompt": "".join(map(chr, (await request.json())["tokens"]))})


def create_app(state: FakeState, killed: asyncio.Event | None = None) -> FastAPI:
    """The fake upstream app; setting ``killed`` drops every pending and later request."""
    app = FastAPI()
    kill = killed if killed is not None else asyncio.Event()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _complete(state, kill, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(state, kill, request, chat=False)

    @app.get("/v1/models")
    async def models() -> Response:
        state.model_requests += 1
        if state.nested:
            return _nested(state.nested)
        return JSONResponse({"object": "list", "data": [{"id": state.model, "object": "model"}]})

    _add_tokenizer(app, state)

    @app.get("/metrics")
    async def metrics() -> Response:
        # vLLM's own metric names, so that dashboards have a model server to show.
        state.metrics_requests += 1
        labels = f'{{model_name="{state.model}"}}'
        lines = [
            f"vllm:num_requests_running{labels} {state.in_flight}",
            f"vllm:num_requests_waiting{labels} 0",
            f"vllm:kv_cache_usage_perc{labels} {min(1.0, state.in_flight / 64)}",
        ]
        text = "\n".join(lines) + "\n" + state.step_series() + state.extra_metrics
        return Response(text, media_type="text/plain; version=0.0.4")

    @app.get("/fake/stats")
    async def stats() -> dict[str, Any]:
        return state.stats()

    return app


# Every port a fake of this process has served on. The service's metrics are
# process-wide and labelled by upstream URL, so a fake on a port an earlier
# test's fake had would start with that test's counts.
_PORTS_TAKEN: set[int] = set()


def _bind(port: int) -> socket.socket:
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that name it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def _bind_fresh() -> socket.socket:
    """A socket on a port no fake of this process has had (see ``_PORTS_TAKEN``)."""
    refused: list[socket.socket] = []  # held open, so the OS offers another port
    try:
        while (sock := _bind(0)).getsockname()[1] in _PORTS_TAKEN:
            refused.append(sock)
    finally:
        for other in refused:
            other.close()
    _PORTS_TAKEN.add(sock.getsockname()[1])
    return sock


def _config(app: FastAPI) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http="h11",
        loop="asyncio",
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level="critical",
        timeout_graceful_shutdown=2,
    )


def wait_ready(url: str, timeout: float = 10.0) -> None:
    """Polls ``{url}/models`` until it answers 200, or raises TimeoutError."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while True:
            try:
                if client.get(url + "/models").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not become ready in {timeout} s")
            time.sleep(0.01)


class FakeServer:
    """A fake upstream served by uvicorn on 127.0.0.1 from a background thread.

    Args:
        state: knobs and counters (a new one named ``name`` when None).
        name: the state's name when ``state`` is None.
    """

    def __init__(self, state: FakeState | None = None, name: str = "fake") -> None:
        self.state = state if state is not None else FakeState(name=name)
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._killed: asyncio.Event | None = None

    @property
    def url(self) -> str:
        """Base URL, ending in ``/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 10.0) -> FakeServer:
        """Serves (again, on the same port once started before) and waits until ready."""
        if self._thread is not None:
            raise RuntimeError("already running")
        sock = _bind(self.port) if self.port else _bind_fresh()
        self.port = sock.getsockname()[1]
        self._killed = asyncio.Event()
        self._server = uvicorn.Server(_config(create_app(self.state, self._killed)))
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(sock, started), name=f"fake-{self.state.name}", daemon=True
        )
        self._thread.start()
        started.wait(timeout)
        wait_ready(self.url, timeout)
        return self

    def _run(self, sock: socket.socket, started: threading.Event) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            started.set()
            assert self._server is not None
            await self._server.serve(sockets=[sock])

        asyncio.run(serve())

    def kill(self, timeout: float = 10.0) -> None:
        """Drops every pending and later request, then stops listening."""
        self.signal_stop(kill=True)
        self.join(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Lets pending requests finish, then stops listening."""
        self.signal_stop()
        self.join(timeout)

    def signal_stop(self, kill: bool = False) -> None:
        """Starts stopping (see :meth:`kill`, :meth:`stop`) without waiting."""
        server, killed, loop = self._server, self._killed, self._loop
        if server is None or killed is None or loop is None:
            return

        def now() -> None:
            if kill:
                killed.set()
            server.should_exit = True

        loop.call_soon_threadsafe(now)

    def join(self, timeout: float = 10.0) -> None:
        """Waits until a stop started by :meth:`signal_stop` is complete."""
        if self._thread is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"fake {self.state.name} did not stop in {timeout} s")
        self._thread = self._server = self._loop = self._killed = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serves one fake upstream in this process until interrupted."""
    parser = argparse.ArgumentParser(description="fake OpenAI-compatible upstream")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--ignore-n", action="store_true")
    parser.add_argument("--name", default="fake")
    parser.add_argument("--die-by", default=None, help="a signal's name, such as SIGILL")
    parser.add_argument("--endless", action="store_true", help="streamed answers never end")
    parser.add_argument("--endless-line", action="store_true", help="nor does their first line")
    parser.add_argument("--endless-piece", type=int, default=4096, help="characters an event")
    args = parser.parse_args(argv)
    state = FakeState(
        name=args.name,
        honour_n=not args.ignore_n,
        latency=args.latency,
        record=False,
        die_by=signal.Signals[args.die_by] if args.die_by else 0,
        endless=args.endless,
        endless_line=args.endless_line,
        endless_piece=args.endless_piece,
    )
    sock = _bind(args.port)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(_config(create_app(state))).run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
