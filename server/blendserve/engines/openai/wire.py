"""The OpenAI wire format: URLs, request bodies, responses, streams, ``Retry-After``.

Pure functions (the stream ones take any async iterator): no I/O, no engine
state. A streamed completion is reassembled into the non-streamed shape, so
one parser reads both; a chunk of the wrong shape, an error reported
mid-stream, or a token count over :data:`MAX_TOKENS` makes a reply unusable.
"""

from __future__ import annotations

import base64
import email.utils
import json
import math
import time
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Annotated, Any, NamedTuple

import httpx2
from pydantic import BaseModel, Field, StrictInt, StrictStr, ValidationError

from blendserve.core.signals import (
    MAX_TOP_LOGPROBS,
    ConfidenceMeter,
    ConfidenceSpec,
    token_confidence,
)
from blendserve.core.traces import LOW_CONFIDENCE
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.errors import EngineProtocolError, InvalidRequest

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "MAX_RETRY_AFTER",
    "MAX_TOKENS",
    "REASONING_FIELDS",
    "TOKENIZER_PATHS",
    "CutBar",
    "ServerEvent",
    "collect_events",
    "encode",
    "error_message",
    "normalise_base_url",
    "once",
    "parse_response",
    "parse_samples",
    "piece_limit",
    "reasoning_of",
    "request_body",
    "retry_after",
    "sampling_body",
    "server_events",
    "split_credentials",
    "token_confidences",
]

#: Paths under a replica's ``/v1``.
CHAT = "/chat/completions"
COMPLETIONS = "/completions"
#: vLLM's tokenizer endpoints, at the server's root.
TOKENIZER_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")
#: The longest ``Retry-After`` that :func:`retry_after` reports.
MAX_RETRY_AFTER = 30.0
#: The largest token count (or choice index) an upstream may report: far past any context.
MAX_TOKENS = 2**31
#: A stream may send this many pieces of text per token of its ``max_tokens`` ...
PIECES_PER_TOKEN = 2
#: ... and this many more per completion (:func:`piece_limit`).
PIECES_SLACK = 64
#: Where a reasoning parser puts a chat message's thought: vLLM's field, then its old name.
REASONING_FIELDS = ("reasoning", "reasoning_content")
# The engine sets these itself: an override would break sample accounting.
_ENGINE_OWNED = frozenset({"n", "seed", "stream"})


def normalise_base_url(url: str) -> str:
    """Returns ``url`` without a trailing slash and ending in ``/v1``.

    Raises:
        ValueError: not an absolute http(s) URL.
    """
    base = url.strip().rstrip("/")
    try:
        parsed = httpx2.URL(base)
    except httpx2.InvalidURL as exc:
        raise ValueError(f"not an http(s) base URL: {_without_userinfo(url)!r}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"not an http(s) base URL: {_without_userinfo(url)!r}")
    return base if base.endswith("/v1") else base + "/v1"


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}" if sep else url


def split_credentials(url: str) -> tuple[str, str | None]:
    """``url`` normalised and without its userinfo, and the ``Authorization`` it stands for.

    ``http://user:pw@host:8000`` gives ``("http://host:8000/v1", "Basic dXNlcjpwdw==")``;
    a URL without userinfo gives None.

    Raises:
        ValueError: not an absolute http(s) URL.
    """
    base = normalise_base_url(url)
    parsed = httpx2.URL(base)
    if not parsed.userinfo:
        return base, None
    user = urllib.parse.unquote(parsed.username)
    secret = f"{user}:{urllib.parse.unquote(parsed.password or '')}".encode()
    return str(parsed.copy_with(username=None, password=None)), (
        "Basic " + base64.b64encode(secret).decode()
    )


def request_body(request: GenerateRequest, default_model: str | None) -> dict[str, Any]:
    """The completion request body for ``request``, less ``n``, ``seed`` and ``stream``.

    A request that reads confidence asks for its top logprobs (chat: ``logprobs`` and
    ``top_logprobs``, one more than its k up to the API's bound; completions:
    ``logprobs``), unless ``params.extra`` asks itself. vLLM's chat API lists a token's
    logprobs sampled token first and cuts the list at ``top_logprobs``: k of them would
    drop the k-th best for a token sampled below it, k + 1 hold the top k whatever was
    sampled, and the k largest are read (:func:`token_confidences`).

    Raises:
        InvalidRequest: ``params.extra`` sets a field the engine owns.
    """
    params = request.params
    body: dict[str, Any] = {}
    model = default_model if request.model is None else request.model
    if model is not None:
        body["model"] = model
    if request.messages is not None:
        body["messages"] = [dict(m) for m in request.messages]
    else:
        body["prompt"] = request.prompt
    for key, value in (
        ("temperature", params.temperature),
        ("top_p", params.top_p),
        ("max_tokens", params.max_tokens),
        ("top_k", params.top_k),
        ("min_p", params.min_p),
    ):
        if value is not None:
            body[key] = value
    if params.stop is not None:
        body["stop"] = list(params.stop)
    if request.confidence is not None:
        k = request.confidence.top_logprobs
        if request.messages is not None:
            body.update({"logprobs": True, "top_logprobs": min(k + 1, MAX_TOP_LOGPROBS)})
        else:
            body["logprobs"] = k
    owned = sorted(_ENGINE_OWNED.intersection(params.extra))
    if owned:
        raise InvalidRequest(
            f"params.extra may not set {owned[0]!r}: use GenerateRequest.n / params.seed",
            param=f"params.extra.{owned[0]}",
        )
    body.update(params.extra)
    return body


def sampling_body(body: dict[str, Any], n: int, seed: int | None, stream: bool) -> bytes:
    """``body`` asking for ``n`` samples from ``seed`` (streamed, with usage), encoded.

    Raises:
        InvalidRequest: the body is not JSON.
    """
    payload = dict(body)
    if n > 1:
        payload["n"] = n
    if seed is not None:
        payload["seed"] = seed
    if stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    return encode(payload)


def parse_response(
    response: httpx2.Response,
    chat: bool,
    want: int,
    upstream: str,
    confidence: ConfidenceSpec | None = None,
) -> list[Sample]:
    """The samples of a 2xx completion response asking for ``want``: 1..want of them, their
    confidence read as ``confidence`` says (:func:`parse_samples`).

    Raises:
        EngineProtocolError: not JSON, not a usable completion, or over ``want`` choices.
    """
    try:
        payload = response.json()
    except (ValueError, RecursionError) as exc:  # nested past the parser's depth too
        raise EngineProtocolError(
            f"{upstream}: response is not JSON: {response.text[:200]!r}"
        ) from None if isinstance(exc, RecursionError) else exc
    samples = parse_samples(payload, chat, upstream, confidence)
    if len(samples) > want:
        raise EngineProtocolError(f"{upstream}: {len(samples)} choices for n={want}")
    return samples


def parse_samples(
    payload: Any, chat: bool, upstream: str, confidence: ConfidenceSpec | None = None
) -> list[Sample]:
    """The samples of a completion response, in choice order.

    With ``confidence``, each sample's is read from its choice's ``logprobs`` (either
    API's shape), or from the ``token_confidences`` a collected stream left there
    (:func:`collect_events`); a choice without them has none.

    Raises:
        EngineProtocolError: the payload is not a usable completion.
    """
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices:
        raise EngineProtocolError(f"{upstream}: response has no choices")
    if not all(isinstance(c, dict) for c in choices):
        raise EngineProtocolError(f"{upstream}: a choice is not an object")
    if all(isinstance(c.get("index"), int) for c in choices):
        choices = sorted(choices, key=lambda c: c["index"])
    usage = payload.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    prompt_tokens = _count(usage.get("prompt_tokens"), upstream)
    own = [_choice_tokens(c, upstream) for c in choices]
    if all(t is not None for t in own):
        tokens = [t or 0 for t in own]
    else:
        tokens = _shares(_count(usage.get("completion_tokens"), upstream), len(choices))
    reasoning_total = _reasoning_tokens(usage, upstream)
    reasoning_tokens: list[int | None] = (
        [None] * len(choices)
        if reasoning_total is None
        else list(_shares(reasoning_total, len(choices)))
    )
    samples = []
    for choice, completion_tokens, thought_tokens in zip(
        choices, tokens, reasoning_tokens, strict=True
    ):
        reasoning = None
        if chat:
            message = choice.get("message")
            if not isinstance(message, dict):
                raise EngineProtocolError(f"{upstream}: a chat choice has no message")
            # content is null when a reasoning parser kept everything in the thought
            text = message.get("content") or ""
            reasoning = reasoning_of(message)
        else:
            text = choice.get("text")
        if not isinstance(text, str):
            raise EngineProtocolError(f"{upstream}: a choice has no text")
        finish = choice.get("finish_reason")
        stop = choice.get("stop_reason")
        samples.append(
            Sample(
                text=text,
                finish_reason=finish if isinstance(finish, str) else None,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                upstream=upstream,
                reasoning=reasoning,
                reasoning_tokens=thought_tokens,
                stop_reason=str(stop) if isinstance(stop, (str, int)) else None,
                confidence=None if confidence is None else _confidence(choice, confidence),
            )
        )
    return samples


def _confidence(choice: dict[str, Any], spec: ConfidenceSpec) -> Any:
    collected = choice.get("token_confidences")
    if isinstance(collected, list):
        values = [c for c in collected if isinstance(c, float)]
    else:
        values = token_confidences(choice.get("logprobs"), spec.top_logprobs)
    meter = ConfidenceMeter(spec)
    for value in values:
        meter.add_confidence(value)
    return meter.summary()


def token_confidences(logprobs: Any, k: int) -> list[float]:
    """Each token's confidence (:func:`~blendserve.core.signals.token_confidence`) from a
    choice's or chunk's ``logprobs``: the chat API's ``{"content": [{"logprob",
    "top_logprobs": [{"logprob"}, ...]}, ...]}`` or the completions API's ``{"top_logprobs":
    [{token: logprob, ...}, ...], "token_logprobs": [...]}``. A token without top logprobs
    counts its own; entries of another shape are skipped, never fatal."""
    if not isinstance(logprobs, dict):
        return []
    values: list[float] = []
    content = logprobs.get("content")
    if isinstance(content, list):
        for entry in content:
            if not isinstance(entry, dict):
                continue
            top = entry.get("top_logprobs")
            numbers = (
                [t.get("logprob") for t in top if isinstance(t, dict)]
                if isinstance(top, list) and top
                else [entry.get("logprob")]
            )
            _read_token(numbers, k, values)
        return values
    tops = logprobs.get("top_logprobs")
    own = logprobs.get("token_logprobs")
    if isinstance(tops, list):
        for i, top in enumerate(tops):
            if isinstance(top, dict) and top:
                _read_token(list(top.values()), k, values)
            elif isinstance(own, list) and i < len(own):
                _read_token([own[i]], k, values)
    elif isinstance(own, list):
        for value in own:
            _read_token([value], k, values)
    return values


def _read_token(numbers: list[Any], k: int, into: list[float]) -> None:
    confidence = token_confidence(_floats(numbers), k)
    if confidence is not None:
        into.append(confidence)


def _floats(numbers: list[Any]) -> list[float]:
    """The numbers among ``numbers`` as floats: an integer too large for a float (a
    malformed logprob) is left out, as other entries of the wrong type are."""
    floats = []
    for x in numbers:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            try:
                floats.append(float(x))
            except OverflowError:
                continue
    return floats


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The thought a reasoning parser split out of a chat message or delta, if any.

    vLLM writes it to ``reasoning`` (older versions: ``reasoning_content``, as
    DeepSeek's API and llama.cpp's server do); either is read, never both.
    """
    for name in REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _shares(total: int, parts: int) -> list[int]:
    share, rest = divmod(total, parts)
    return [share + (i < rest) for i in range(parts)]


def _reasoning_tokens(usage: dict[str, Any], upstream: str) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens``: None where it is not reported."""
    details = usage.get("completion_tokens_details")
    value = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return _count(value, upstream) if value is not None else None


class _LineSplitter:
    """Splits a byte stream's chunks into lines ending in CR, LF or CRLF, in linear time."""

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # the line not ended yet, in pieces
        self._after_cr = False  # the last chunk ended in CR: an LF that starts the next ends it
        self._first = True

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` ends, without their line ends."""
        if self._first and chunk:
            chunk, self._first = chunk.removeprefix(b"\xef\xbb\xbf"), False  # a BOM
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._after_cr = chunk[-1:] == b"\r"
        if not chunk:
            return []
        lines = chunk.splitlines()  # CR, LF, CRLF only: bytes know no other line ends
        rest = None if chunk[-1:] in (b"\n", b"\r") else lines.pop()  # not ended yet
        if lines and self._partial:
            lines[0] = b"".join(self._partial) + lines[0]  # the line earlier chunks began
            self._partial = []
        if rest is not None:
            self._partial.append(rest)
        return lines


class ServerEvent(NamedTuple):
    """One server-sent event: its type (``message`` unless named) and its data."""

    event: str
    data: bytes


async def server_events(chunks: AsyncIterator[bytes]) -> AsyncGenerator[ServerEvent, None]:
    """The server-sent events of a byte stream, framed as the SSE specification says.

    Lines end in CR, LF or CRLF (also when a chunk ends between CR and LF);
    comments are skipped; the ``data`` lines of one event are joined with LF;
    an event without data is not dispatched, nor is one the stream ends in
    (no blank line after it); ``id`` and ``retry`` are ignored. The work is
    linear in the bytes: a line that never ends is kept in pieces, joined once
    it ends (``chunks`` bound how much it holds).
    """
    split = _LineSplitter()
    name = ""
    data: list[bytes] = []
    async for chunk in chunks:
        lines = split.feed(chunk)
        for line in lines:
            if not line:
                if data:
                    yield ServerEvent(name or "message", b"\n".join(data))
                name, data = "", []
            elif line[:1] != b":":
                field, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if field == b"data":
                    data.append(value)
                elif field == b"event":
                    name = value.decode("utf-8", "replace")


_Count = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]


class _Details(BaseModel):
    reasoning_tokens: _Count | None = None


class _Usage(BaseModel):
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None
    completion_tokens_details: _Details | None = None


class _Delta(BaseModel):
    content: StrictStr | None = None
    reasoning: StrictStr | None = None
    reasoning_content: StrictStr | None = None


class _Choice(BaseModel):
    index: _Count = 0
    delta: _Delta | None = None
    text: StrictStr | None = None
    finish_reason: StrictStr | None = None
    stop_reason: StrictStr | StrictInt | None = None
    logprobs: Any = None


class _Chunk(BaseModel):
    """A streamed completion chunk: what is read of it (other fields are ignored)."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None  # vLLM's failure during a stream
    object: Any = None  # "error" where an older vLLM wrote its error response instead


def _chunk(data: bytes) -> _Chunk:
    """The chunk an event's data holds.

    Raises:
        EngineProtocolError: not JSON, not a completion chunk, or an error.
    """
    try:
        chunk = _Chunk.model_validate_json(data)
    except ValidationError as exc:
        problem = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        if problem["type"] == "json_invalid":
            raise EngineProtocolError(f"stream chunk is not JSON: {_quoted(data)}") from None
        where = ".".join(map(str, problem["loc"]))
        raise EngineProtocolError(
            f"stream chunk is not a completion chunk ({where}: {problem['msg']}): {_quoted(data)}"
        ) from None
    if chunk.error is not None or chunk.object == "error":
        raise EngineProtocolError(f"the stream reported an error: {_stated(chunk.error, data)}")
    return chunk


def _quoted(data: bytes) -> str:
    return repr(data[:200].decode("utf-8", "replace"))


def _stated(error: Any, data: bytes) -> str:
    """What an error chunk says: its message, else the chunk."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:500]
    return error[:500] if isinstance(error, str) else _quoted(data)


class CutBar(NamedTuple):
    """A streamed sample is cut once its window confidence (read by ``spec``) falls
    ``below`` this (:attr:`~blendserve.engines.base.GenerateRequest.cut_below`)."""

    spec: ConfidenceSpec
    below: float


async def collect_events(
    events: AsyncIterator[ServerEvent],
    max_pieces: int | None = None,
    top_logprobs: int | None = None,
    cut: CutBar | None = None,
) -> dict[str, Any]:
    """Assembles a streamed completion (its server-sent events) into the non-streamed shape.

    A chat stream's thought (``delta.reasoning`` or ``delta.reasoning_content``)
    goes to the message's ``reasoning``; events named other than ``message`` or
    ``error`` are skipped. With ``top_logprobs`` (k), each token's logprobs are read
    as they come, into a choice's ``token_confidences`` (one float a token, not the
    k logprobs: :func:`parse_samples` sums them up).

    With ``cut`` (a stream of one completion), the reading stops at the first token after
    which the window confidence is below the bar: the choice is handed over with finish
    reason :data:`~blendserve.core.traces.LOW_CONFIDENCE`, the text of the chunks read
    (the last one whole: a chunk's text is not split by token), and the tokens read up to
    that one as its ``completion_tokens`` and ``token_confidences``. The caller closes the
    stream, which releases the upstream request. A stream that turns out to hold more than
    one choice is never cut: closing it would end its other choices too.

    Raises:
        EngineProtocolError: a chunk is not a completion chunk, the stream reports
            an error, or it sends more than ``max_pieces`` pieces of text.
    """
    choices: dict[int, _Assembled] = {}
    usage: dict[str, Any] | None = None
    num_chunks = 0
    chat = False
    k = top_logprobs if cut is None or top_logprobs is not None else cut.spec.top_logprobs
    async for event in events:
        name, data = event
        if name == "error":
            raise EngineProtocolError(f"the stream reported an error: {_quoted(data)}")
        if name != "message" or data.strip() == b"[DONE]":
            continue
        chunk = _chunk(data)
        if chunk.usage is not None:
            usage = chunk.usage.model_dump(exclude_none=True) or usage
        for choice in chunk.choices or ():
            chat = chat or choice.delta is not None
            taken = choices.get(choice.index)
            if taken is None:
                if choices:
                    cut = None  # one choice of several cannot be closed alone
                    for other in choices.values():
                        other.meter = None
                taken = choices[choice.index] = _Assembled(cut)
            num_chunks += taken.add(choice, k)
        if max_pieces is not None and num_chunks > max_pieces:
            raise EngineProtocolError(
                f"the stream sent over {max_pieces} pieces of text, more than its"
                " max_tokens allow: a runaway stream"
            )
        if cut is not None and any(c.cut_at is not None for c in choices.values()):
            break
    assembled = [choices[index].body(index, chat) for index in sorted(choices)]
    # An upstream without stream usage: a content chunk is about one token.
    return {"choices": assembled, "usage": usage or {"completion_tokens": num_chunks}}


class _Assembled:
    """One choice of a stream, as its chunks come; with ``cut``, watched for its window
    confidence falling below the bar."""

    def __init__(self, cut: CutBar | None = None) -> None:
        self.texts: list[str] = []
        self.thoughts: list[str] = []
        self.finish: str | None = None
        self.stop: str | int | None = None
        self.confidences: list[float] | None = None
        self.meter = None if cut is None else ConfidenceMeter(cut.spec)
        self.bar = -math.inf if cut is None else cut.below
        self.cut_at: int | None = None  # tokens read when the bar was crossed

    def add(self, choice: _Choice, top_logprobs: int | None) -> int:
        """Takes a chunk's choice; returns the pieces of text it held (0, 1 or 2)."""
        delta = choice.delta
        piece = choice.text if delta is None else delta.content
        thought = None if delta is None else (delta.reasoning or delta.reasoning_content)
        if piece:
            self.texts.append(piece)
        if thought:
            self.thoughts.append(thought)
        if choice.finish_reason is not None:
            self.finish = choice.finish_reason
        if choice.stop_reason is not None:
            self.stop = choice.stop_reason
        if top_logprobs is not None and choice.logprobs is not None:
            if self.confidences is None:
                self.confidences = []
            read = token_confidences(choice.logprobs, top_logprobs)
            if self.meter is not None and self.cut_at is None:
                read = self._watch(read)
            self.confidences += read
        return bool(piece) + bool(thought)

    def _watch(self, read: list[float]) -> list[float]:
        """Feeds ``read`` to the meter, token by token; those up to the one after which the
        window falls below the bar (all where it does not)."""
        meter = self.meter
        assert meter is not None
        for i, confidence in enumerate(read):
            meter.add_confidence(confidence)
            group = meter.group()
            if group is not None and group < self.bar:
                self.cut_at = meter.tokens
                self.finish, self.stop = LOW_CONFIDENCE, None
                return read[: i + 1]
        return read

    def body(self, index: int, chat: bool) -> dict[str, Any]:
        """The choice in the non-streamed shape."""
        text = "".join(self.texts)
        body: dict[str, Any] = {"index": index, "finish_reason": self.finish}
        if chat:
            body["message"] = {"content": text}
            if self.thoughts:
                body["message"]["reasoning"] = "".join(self.thoughts)
        else:
            body["text"] = text
        if self.stop is not None:
            body["stop_reason"] = self.stop
        if self.confidences is not None:
            body["token_confidences"] = self.confidences
        if self.cut_at is not None:
            body["completion_tokens"] = self.cut_at
        return body


def piece_limit(body: Mapping[str, Any], n: int) -> int | None:
    """How many pieces of text (content or thought deltas) a stream of ``n`` completions
    may send under the body's ``max_tokens`` (or ``max_completion_tokens``); None: unbounded.

    Every piece holds at least one token, so a stream past this is running away: it is
    cut here, long before the response size limit, whose parsing costs CPU per byte.
    The margin leaves room for an engine that splits a token's characters.
    """
    limits = [
        value
        for value in (body.get("max_tokens"), body.get("max_completion_tokens"))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0
    ]
    return n * (PIECES_PER_TOKEN * min(limits) + PIECES_SLACK) if limits else None


async def once(content: bytes) -> AsyncIterator[bytes]:
    """``content`` as a one-chunk body."""
    yield content


def encode(payload: dict[str, Any]) -> bytes:
    """``payload`` as compact UTF-8 JSON.

    Raises:
        InvalidRequest: it is not JSON (a NaN, a non-string key, ...).
    """
    try:
        return json.dumps(
            payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"the request is not valid JSON: {exc}") from exc


def _count(value: Any, upstream: str) -> int:
    """A reported token count; 0 where it is not a count.

    Raises:
        EngineProtocolError: a count over :data:`MAX_TOKENS`.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return 0
    if value > MAX_TOKENS:  # not printed: a huge int takes long to, or cannot be, written out
        raise EngineProtocolError(f"{upstream}: a usage reports over {MAX_TOKENS} tokens")
    return value


def _choice_tokens(choice: dict[str, Any], upstream: str) -> int | None:
    """A choice's own completion tokens: its usage where an upstream reports one a choice,
    else the tokens its logprobs list (an ``n`` request's usage is their sum only)."""
    usage = choice.get("usage")
    value = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if value is None:
        value = choice.get("completion_tokens")
    if value is None:
        value = _logprob_tokens(choice)
    return _count(value, upstream) if value is not None else None


def _logprob_tokens(choice: dict[str, Any]) -> int | None:
    """The tokens a choice's logprobs list (None: it has none)."""
    collected = choice.get("token_confidences")
    if isinstance(collected, list):
        return len(collected)
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    for name in ("content", "tokens", "token_logprobs"):
        entries = logprobs.get(name)
        if isinstance(entries, list):
            return len(entries)
    return None


def error_message(response: httpx2.Response) -> str:
    """The error an upstream's error response states, else its text or reason."""
    try:
        data = response.json()
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for value in (error, data.get("message"), data.get("detail")):
            if isinstance(value, str):
                return value
    return response.text.strip()[:500] or response.reason_phrase


def retry_after(response: httpx2.Response) -> float | None:
    """``Retry-After`` in seconds (delay or HTTP date), capped; None: absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)
