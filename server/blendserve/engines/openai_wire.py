"""The OpenAI wire format: URLs, request bodies, responses, streams, ``Retry-After``.

Pure functions (the stream ones take any async iterator): no I/O, no engine
state. A streamed completion (server-sent events) is reassembled into the
non-streamed shape, so one parser reads both.
"""

from __future__ import annotations

import base64
import email.utils
import json
import math
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import httpx2

from blendserve.engines.base import GenerateRequest, Sample
from blendserve.errors import EngineProtocolError, InvalidRequest

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "MAX_RETRY_AFTER",
    "REASONING_FIELDS",
    "TOKENIZER_PATHS",
    "collect_events",
    "encode",
    "error_message",
    "lines",
    "normalise_base_url",
    "once",
    "parse_response",
    "parse_samples",
    "reasoning_of",
    "request_body",
    "retry_after",
    "sampling_body",
    "split_credentials",
]

#: Paths under a replica's ``/v1``.
CHAT = "/chat/completions"
COMPLETIONS = "/completions"
#: vLLM's tokenizer endpoints, at the server's root.
TOKENIZER_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")
#: The longest ``Retry-After`` that :func:`retry_after` reports.
MAX_RETRY_AFTER = 30.0
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


def parse_response(response: httpx2.Response, chat: bool, want: int, upstream: str) -> list[Sample]:
    """The samples of a 2xx completion response asking for ``want``: 1..want of them.

    Raises:
        EngineProtocolError: not JSON, not a usable completion, or over ``want`` choices.
    """
    try:
        payload = response.json()
    except (ValueError, RecursionError) as exc:  # nested past the parser's depth too
        raise EngineProtocolError(
            f"{upstream}: response is not JSON: {response.text[:200]!r}"
        ) from None if isinstance(exc, RecursionError) else exc
    samples = parse_samples(payload, chat, upstream)
    if len(samples) > want:
        raise EngineProtocolError(f"{upstream}: {len(samples)} choices for n={want}")
    return samples


def parse_samples(payload: Any, chat: bool, upstream: str) -> list[Sample]:
    """The samples of a completion response, in choice order.

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
    prompt_tokens = _count(usage.get("prompt_tokens"))
    own = [_choice_tokens(c) for c in choices]
    if all(t is not None for t in own):
        tokens = [t or 0 for t in own]
    else:
        tokens = _shares(_count(usage.get("completion_tokens")), len(choices))
    reasoning_total = _reasoning_tokens(usage)
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
        samples.append(
            Sample(
                text=text,
                finish_reason=finish if isinstance(finish, str) else None,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                upstream=upstream,
                reasoning=reasoning,
                reasoning_tokens=thought_tokens,
            )
        )
    return samples


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


def _reasoning_tokens(usage: dict[str, Any]) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens``: None where it is not reported."""
    details = usage.get("completion_tokens_details")
    value = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return _count(value) if value is not None else None


async def lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The UTF-8 text lines of a byte stream (``chunks`` bound how much one line holds)."""
    pending = bytearray()
    async for chunk in chunks:
        pending += chunk
        if b"\n" in chunk:
            *complete, rest = bytes(pending).split(b"\n")
            pending = bytearray(rest)
            for line in complete:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.decode("utf-8", "replace")


async def collect_events(stream: AsyncIterator[str]) -> dict[str, Any]:
    """Assembles a streamed completion (server-sent lines) into the non-streamed shape.

    A chat stream's thought (``delta.reasoning`` or ``delta.reasoning_content``)
    is assembled into the message's ``reasoning``.
    """
    texts: dict[int, list[str]] = {}
    thoughts: dict[int, list[str]] = {}
    finish: dict[int, Any] = {}
    usage: Any = None
    num_chunks = 0
    chat = False
    async for line in stream:
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        try:
            chunk = json.loads(line[5:])
        except (ValueError, RecursionError):
            raise EngineProtocolError(f"stream chunk is not JSON: {line[:200]!r}") from None
        choices = chunk.get("choices") or [] if isinstance(chunk, dict) else None
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise EngineProtocolError(f"stream chunk is not a completion chunk: {line[:200]!r}")
        usage = chunk.get("usage") or usage
        for choice in choices:
            index = choice.get("index", 0)
            delta = choice.get("delta")
            chat = chat or isinstance(delta, dict)
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            thought = reasoning_of(delta) if isinstance(delta, dict) else None
            if piece:
                texts.setdefault(index, []).append(piece)
                num_chunks += 1
            else:
                texts.setdefault(index, [])
            if thought:
                thoughts.setdefault(index, []).append(thought)
                num_chunks += 1
            if choice.get("finish_reason") is not None:
                finish[index] = choice["finish_reason"]
    choices = []
    for index in sorted(texts):
        text = "".join(texts[index])
        body: dict[str, Any] = {"message": {"content": text}} if chat else {"text": text}
        if index in thoughts:
            body["message"]["reasoning"] = "".join(thoughts[index])
        choices.append({"index": index, "finish_reason": finish.get(index), **body})
    # An upstream without stream usage: a content chunk is about one token.
    return {"choices": choices, "usage": usage or {"completion_tokens": num_chunks}}


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


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _choice_tokens(choice: dict[str, Any]) -> int | None:
    usage = choice.get("usage")
    value = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if value is None:
        value = choice.get("completion_tokens")
    return _count(value) if value is not None else None


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
