"""The OpenAI wire format and the retry policy, without I/O."""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx2 as httpx
import pytest
from blendserve.core.signals import ConfidenceSpec
from blendserve.engines._retry import RetryPolicy, exhausted
from blendserve.engines.base import GenerateRequest, SamplingParams
from blendserve.engines.openai.wire import (
    MAX_TOKENS,
    collect_events,
    error_message,
    normalise_base_url,
    parse_response,
    parse_samples,
    piece_limit,
    request_body,
    retry_after,
    sampling_body,
    server_events,
    split_credentials,
    token_confidences,
)
from blendserve.errors import (
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
)


async def _chunks(parts: Iterable[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _framed(parts: Iterable[bytes]) -> list[tuple[str, str]]:
    return [(e.event, e.data.decode()) async for e in server_events(_chunks(parts))]


def _events(*chunks: dict[str, Any], done: bool = True) -> list[bytes]:
    sse = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
    return [*sse, b"data: [DONE]\n\n"] if done else sse


def _collect(parts: list[bytes]) -> dict[str, Any]:
    return asyncio.run(collect_events(server_events(_chunks(parts))))


def test_urls_end_in_v1_and_lose_their_credentials() -> None:
    assert normalise_base_url(" http://h:8000/ ") == "http://h:8000/v1"
    assert normalise_base_url("https://h/v1") == "https://h/v1"
    assert split_credentials("http://u:p%40w@h:8000") == ("http://h:8000/v1", "Basic dTpwQHc=")
    assert split_credentials("http://h") == ("http://h/v1", None)
    with pytest.raises(ValueError, match="ftp://h") as raised:
        normalise_base_url("ftp://user:secret@h")
    assert "secret" not in str(raised.value)


def test_events_are_framed_as_the_sse_specification_says() -> None:
    parts = [b": comment\r\nda", b"ta: a\r", b"\ndata:b\r\rdata: {\n", b"data: }\n\n", b"event: x"]
    parts += [b"\ndata: c\n\n\xe2\x82", b"\xacdata: d\n\n"]
    assert asyncio.run(_framed(parts)) == [
        ("message", "a\nb"),  # one event over two lines: CRLF, then a lone CR, end a line
        ("message", "{\n}"),
        ("x", "c"),
    ]  # "€data: d" is no field: its event has no data


def test_a_multi_line_data_field_is_one_chunk() -> None:
    chunk = json.dumps({"choices": [{"index": 0, "text": "42", "finish_reason": "stop"}]}, indent=1)
    event = "".join(f"data: {line}\r\n" for line in chunk.splitlines()) + "\r\n"
    payload = _collect([event.encode(), b"data: [DONE]\r\n\r\n"])
    assert payload["choices"] == [{"index": 0, "finish_reason": "stop", "text": "42"}]


def test_a_chat_stream_is_reassembled_per_choice() -> None:
    payload = _collect(
        _events(
            {"choices": [{"index": 1, "delta": {"content": "B"}}]},
            {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
            {"choices": [{"index": 0, "delta": {"content": "A"}, "finish_reason": "stop"}]},
            {"choices": [{"index": 1, "delta": {"content": "b"}, "finish_reason": "length"}]},
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}},
        )
    )
    assert payload == {
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"content": "A"}},
            {"index": 1, "finish_reason": "length", "message": {"content": "Bb"}},
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
    }
    (sample,) = parse_samples(payload, True, "up")[:1]
    assert (sample.text, sample.prompt_tokens, sample.upstream) == ("A", 3, "up")


def test_a_completions_stream_without_usage_counts_its_chunks() -> None:
    payload = _collect(
        _events({"choices": [{"text": "4"}]}, {"choices": [{"text": "2", "finish_reason": "stop"}]})
    )
    assert payload == {
        "choices": [{"index": 0, "finish_reason": "stop", "text": "42"}],
        "usage": {"completion_tokens": 2},
    }


def test_a_stream_chunk_that_is_not_json_is_a_protocol_error() -> None:
    with pytest.raises(EngineProtocolError, match="not JSON"):
        _collect([b"data: {oops\n\n"])


PARTIAL = {"choices": [{"index": 0, "delta": {"content": "Let me compute: 6*7 = 4"}}]}


@pytest.mark.parametrize(
    "error",
    [
        b'data: {"error": {"message": "engine died", "code": 500}}\n\n',  # vLLM's
        b'data: {"object": "error", "message": "engine died", "code": 500}\n\n',  # older vLLM
        b'event: error\ndata: {"message": "engine died"}\n\n',
    ],
)
def test_a_stream_that_reports_an_error_is_a_protocol_error_not_its_partial_text(
    error: bytes,
) -> None:
    with pytest.raises(EngineProtocolError, match=r"reported an error.*engine died"):
        _collect([*_events(PARTIAL, done=False), error, b"data: [DONE]\n\n"])


@pytest.mark.parametrize(
    ("choice", "where"),
    [
        ({"index": [0], "delta": {"content": "x"}}, "index"),
        ({"index": {"i": 0}, "delta": {"content": "x"}}, "index"),
        ({"index": "0", "delta": {"content": "x"}}, "index"),
        ({"index": 0, "delta": {"content": 7}}, "content"),
        ({"index": 0, "delta": {"content": ["x"]}}, "content"),
        ({"index": 0, "delta": "x"}, "delta"),
        ({"index": 0, "text": 7}, "text"),
        ({"index": 0, "text": "x", "finish_reason": 1}, "finish_reason"),
        ({"index": 0, "delta": {"reasoning": {"x": 1}}}, "reasoning"),
        (None, "choices.1"),
    ],
)
def test_a_malformed_stream_chunk_is_a_protocol_error_naming_it(choice: Any, where: str) -> None:
    mixed = {"choices": [{"index": 0, "delta": {"content": "a"}}, choice]}
    with pytest.raises(EngineProtocolError, match=rf"not a completion chunk.*{where}") as raised:
        _collect(_events(mixed))
    assert "choices" in str(raised.value)  # the chunk itself is quoted


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 3, "completion_tokens": 10**400},
        {"prompt_tokens": MAX_TOKENS + 1, "completion_tokens": 3},
        {"completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 10**30}},
        {"completion_tokens": -1},
        {"completion_tokens": "3"},
    ],
)
def test_a_streamed_usage_that_is_no_token_count_is_a_protocol_error(usage: Any) -> None:
    with pytest.raises(EngineProtocolError, match=r"not a completion chunk.*usage"):
        _collect(_events(PARTIAL, {"choices": [], "usage": usage}))


@pytest.mark.parametrize(
    ("choice", "usage"),
    [
        ({}, {"prompt_tokens": 3, "completion_tokens": 10**400}),
        ({}, {"prompt_tokens": 10**400, "completion_tokens": 3}),
        ({"usage": {"completion_tokens": MAX_TOKENS + 1}}, {}),
        ({"completion_tokens": 10**400}, {}),
        ({}, {"completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 2**40}}),
    ],
)
def test_a_token_count_past_any_context_is_a_protocol_error(
    choice: dict[str, Any], usage: dict[str, Any]
) -> None:
    payload = {"choices": [{"index": 0, "text": "42", **choice}], "usage": usage}
    with pytest.raises(EngineProtocolError, match=f"up: a usage reports over {MAX_TOKENS} tokens"):
        parse_response(httpx.Response(200, text=json.dumps(payload)), False, 1, "up")
    within = {"choices": [{"index": 0, "text": "42"}], "usage": {"completion_tokens": MAX_TOKENS}}
    assert parse_samples(within, False, "up")[0].completion_tokens == MAX_TOKENS


def test_samples_follow_choice_indices_and_share_the_usage() -> None:
    payload = {
        "choices": [
            {"index": 1, "text": "b", "finish_reason": "length"},
            {"index": 0, "text": "a", "finish_reason": "stop"},
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7},
    }
    samples = parse_samples(payload, False, "up")
    assert [s.text for s in samples] == ["a", "b"]
    assert [s.completion_tokens for s in samples] == [4, 3]
    assert {s.prompt_tokens for s in samples} == {5}


def test_a_chat_choice_with_null_content_is_an_empty_sample() -> None:
    payload = {"choices": [{"message": {"content": None, "reasoning_content": "..."}}]}
    assert parse_samples(payload, True, "up")[0].text == ""


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_a_reasoning_parsers_thought_is_read_from_either_field(field: str) -> None:
    payload = {
        "choices": [
            {"index": 0, "message": {"content": "7", field: "maybe 8"}, "finish_reason": "stop"},
            {"index": 1, "message": {"content": None, field: "12*12"}, "finish_reason": "length"},
            {"index": 2, "message": {"content": "plain"}, "finish_reason": "stop"},
        ],
        "usage": {
            "prompt_tokens": 4,
            "completion_tokens": 30,
            "completion_tokens_details": {"reasoning_tokens": 20},
        },
    }
    samples = parse_samples(payload, True, "up")
    assert [(s.text, s.reasoning) for s in samples] == [
        ("7", "maybe 8"),
        ("", "12*12"),
        ("plain", None),
    ]
    assert [s.reasoning_tokens for s in samples] == [7, 7, 6]  # the upstream's 20, shared
    assert [s.thought().cut for s in samples] == [False, True, False]  # the thought never ended
    assert [
        s.reasoning_tokens for s in parse_samples({"choices": [{"text": "a"}]}, False, "u")
    ] == [None]  # not counted upstream: unknown, not 0


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_a_streamed_thought_is_reassembled_with_its_token_count(field: str) -> None:
    usage = {
        "prompt_tokens": 3,
        "completion_tokens": 9,
        "completion_tokens_details": {"reasoning_tokens": 6},
    }
    payload = _collect(
        _events(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"index": 0, "delta": {field: "12*12 ", "content": None}}]},
            {"choices": [{"index": 0, "delta": {field: "= 144"}}]},
            {"choices": [{"index": 0, "delta": {"content": "144"}, "finish_reason": "stop"}]},
            {"choices": [], "usage": usage},
        )
    )
    (sample,) = parse_samples(payload, True, "up")
    assert (sample.text, sample.reasoning, sample.reasoning_tokens) == ("144", "12*12 = 144", 6)
    assert sample.completion_tokens == 9


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({}, "no choices"),
        ({"choices": ["x"]}, "not an object"),
        ({"choices": [{"text": "a"}]}, "no message"),
    ],
)
def test_unusable_payloads_are_protocol_errors(payload: Any, match: str) -> None:
    with pytest.raises(EngineProtocolError, match=match):
        parse_samples(payload, True, "up")


def test_a_response_is_json_with_at_most_the_choices_asked_for() -> None:
    two = httpx.Response(200, json={"choices": [{"text": "a"}, {"text": "b"}]})
    assert len(parse_response(two, False, 2, "up")) == 2
    with pytest.raises(EngineProtocolError, match="2 choices for n=1"):
        parse_response(two, False, 1, "up")
    with pytest.raises(EngineProtocolError, match="not JSON"):
        parse_response(httpx.Response(200, text="<html>"), False, 1, "up")


def test_retry_after_is_seconds_or_a_date_and_capped() -> None:
    def parsed(value: str) -> float | None:
        return retry_after(httpx.Response(429, headers={"Retry-After": value}))

    assert parsed("1.5") == 1.5
    assert parsed("-3") == 0.0
    assert parsed("3600") == 30.0
    assert parsed("nan") is None
    assert parsed("soon") is None
    later = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8 <= (parsed(later) or 0) <= 10
    assert retry_after(httpx.Response(503)) is None


def test_error_messages_come_from_the_usual_fields() -> None:
    assert error_message(httpx.Response(400, json={"error": {"message": "bad"}})) == "bad"
    assert error_message(httpx.Response(400, json={"detail": "nope"})) == "nope"
    assert error_message(httpx.Response(502, text="")) == "Bad Gateway"


def test_a_request_body_carries_the_set_params_and_refuses_engine_owned_ones() -> None:
    params = SamplingParams(temperature=0.5, stop=("x",), extra={"top_k": 3, "foo": 1})
    body = request_body(GenerateRequest(prompt="p", params=params), "m")
    assert body == {
        "model": "m",
        "prompt": "p",
        "temperature": 0.5,
        "stop": ["x"],
        "top_k": 3,
        "foo": 1,
    }
    chat = request_body(
        GenerateRequest(messages=[{"role": "user", "content": "q"}], model="o"), "m"
    )
    assert chat == {"model": "o", "messages": [{"role": "user", "content": "q"}]}
    with pytest.raises(InvalidRequest) as raised:
        request_body(GenerateRequest(prompt="p", params=SamplingParams(extra={"seed": 1})), None)
    assert raised.value.param == "params.extra.seed"


def test_a_request_reading_confidence_asks_for_one_more_chat_logprob_than_its_k() -> None:
    def body(k: int, chat: bool, **extra: Any) -> dict[str, Any]:
        spec = ConfidenceSpec(top_logprobs=k)
        params = SamplingParams(extra=extra)
        if chat:
            messages = [{"role": "user", "content": "q"}]
            return request_body(
                GenerateRequest(messages=messages, params=params, confidence=spec), None
            )
        return request_body(GenerateRequest(prompt="p", params=params, confidence=spec), None)

    assert body(5, chat=True)["top_logprobs"] == 6 and body(5, chat=True)["logprobs"] is True
    assert body(20, chat=True)["top_logprobs"] == 20  # the API's bound
    assert body(5, chat=False)["logprobs"] == 5 and "top_logprobs" not in body(5, chat=False)
    assert body(5, chat=True, top_logprobs=2)["top_logprobs"] == 2  # the caller's own
    # vLLM's chat API: a token sampled below the top k (-9) listed first, then the best,
    # cut at top_logprobs. With k + 1 of them the k largest are the top k.
    listed = [-9.0, -0.1, -1.0]
    entry = {"logprob": -9.0, "top_logprobs": [{"logprob": lp} for lp in listed]}
    assert token_confidences({"content": [entry]}, 2) == pytest.approx([0.55])


def test_a_sampling_body_adds_n_seed_and_stream() -> None:
    assert json.loads(sampling_body({"prompt": "p"}, 1, None, False)) == {"prompt": "p"}
    assert json.loads(sampling_body({"prompt": "p"}, 3, 7, True)) == {
        "prompt": "p",
        "n": 3,
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with pytest.raises(InvalidRequest):
        sampling_body({"temperature": float("nan")}, 1, None, False)


def test_the_retry_policy_backs_off_or_honours_retry_after_within_the_deadline() -> None:
    policy = RetryPolicy(max_retries=2, backoff_base=1.0, max_retry_after=5.0)
    rng = random.Random(0)
    assert policy.attempts == 3
    assert 2.0 <= (policy.delay(2, None, 0.0, 100.0, rng) or 0) <= 4.0
    assert 5.0 <= (policy.delay(9, None, 0.0, 100.0, rng) or 0) <= 10.0  # capped at 10 s
    assert policy.delay(0, 3.0, 0.0, 100.0, rng) == 3.0
    assert policy.delay(0, 6.0, 0.0, 100.0, rng) is None  # longer than max_retry_after
    assert policy.delay(0, 3.0, 98.0, 100.0, rng) is None  # past the deadline


def test_exhausted_retries_name_a_timeout_or_unavailability() -> None:
    request = httpx.Request("POST", "http://up/v1/completions")
    assert isinstance(exhausted(httpx.ReadTimeout("slow", request=request), 2), EngineTimeout)
    assert isinstance(exhausted(httpx.ConnectTimeout("x", request=request), 2), EngineUnavailable)
    assert "after 1 attempt(s)" in str(exhausted(None, 1))
    unusable = exhausted(EngineProtocolError("up: response is not JSON: '<html>'"), 4)
    assert isinstance(unusable, EngineProtocolError)
    assert (
        str(unusable) == "no usable answer after 4 attempt(s): up: response is not JSON: '<html>'"
    )


def test_a_stream_past_its_piece_limit_is_a_runaway() -> None:
    body = {"max_tokens": 1}
    limit = piece_limit(body, 1)
    assert limit is not None and piece_limit({}, 1) is None
    event = b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n'
    within = [event] * limit + [b"data: [DONE]\n\n"]
    assert asyncio.run(_collect_limited(within, limit))["choices"][0]["text"] == "x" * limit
    with pytest.raises(EngineProtocolError, match="runaway"):
        asyncio.run(_collect_limited([event] * (limit + 1), limit))


async def _collect_limited(parts: list[bytes], limit: int) -> dict[str, Any]:
    return await collect_events(server_events(_chunks(parts)), limit)


#: A token's logprobs as llama-cpp-python's server sends them (its shapes, values rounded):
#: its top logprobs keyed by their text (the completions API), the sampled token's own set
#: beside them, and a byte-fragment token as "".
LLAMA_CPP_COMPLETION_LOGPROBS = {
    "tokens": [" casting", " a"],
    "text_offset": [10, 18],
    "token_logprobs": [-3.5, -0.3],
    "top_logprobs": [
        {" covered": -2.3, " painted": -2.4, " clear": -2.5, " casting": -3.5},
        {" a": -0.3, " shadows": -2.9, "": -3.8},
    ],
}
LLAMA_CPP_CHAT_LOGPROBS = {
    "content": [
        {"token": token, "logprob": own, "bytes": None,
         "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in top.items()]}
        for token, own, top in zip(
            LLAMA_CPP_COMPLETION_LOGPROBS["tokens"],
            LLAMA_CPP_COMPLETION_LOGPROBS["token_logprobs"],
            LLAMA_CPP_COMPLETION_LOGPROBS["top_logprobs"],
            strict=True,
        )
    ],
    "refusal": None,
}  # fmt: skip


@pytest.mark.parametrize("logprobs", [LLAMA_CPP_COMPLETION_LOGPROBS, LLAMA_CPP_CHAT_LOGPROBS])
def test_llama_cpp_logprobs_are_read_the_top_k_of_each_token(logprobs: dict[str, Any]) -> None:
    # The first token was sampled outside the top 3: its own -3.5 is not among the 3 largest.
    assert token_confidences(logprobs, 3) == pytest.approx([7.2 / 3, 7.0 / 3])
    assert token_confidences(logprobs, 1) == pytest.approx([2.3, 0.3])


@pytest.mark.parametrize(
    "logprobs",
    [
        None,
        "text",
        [],
        {"content": "text"},
        {"content": [None, 1, {"logprob": "x"}, {"top_logprobs": [None, {"logprob": True}]}]},
        {"content": [{"logprob": 10**400}, {"top_logprobs": [{"logprob": 10**400}]}]},
        {"top_logprobs": [None, [], {"a": None}, {"a": 10**400}], "token_logprobs": "x"},
        {"top_logprobs": "x", "token_logprobs": [None, "x", 10**400]},
    ],
)
def test_malformed_logprobs_read_nothing_and_never_raise(logprobs: Any) -> None:
    assert token_confidences(logprobs, 5) == []
