"""A trace cut mid-stream on an OpenAI-compatible upstream once its window confidence falls
below the request's bar (``GenerateRequest.cut_below``): the reading stops, the response is
closed and the upstream sees the client leave. Fake upstreams on 127.0.0.1 (they run no
model): ``fall_at`` streams a trace whose confidence falls and never ends, so that a trace
that is not cut runs into its ``max_tokens``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from blendserve.core.signals import ConfidenceSpec
from blendserve.core.traces import LOW_CONFIDENCE
from blendserve.engines._retry import RetryPolicy
from blendserve.engines.base import GenerateRequest, Sample, SamplingParams
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.openai.wire import CutBar, ServerEvent, collect_events, parse_samples
from blendserve.errors import EngineProtocolError
from blendserve.testing.fake_openai import FakeServer, fallen_confidence
from blendserve.testing.waiting import wait_until

from tests.support.running import run_coroutine

Fakes = Callable[..., list[FakeServer]]
K = 5
WINDOW = 4
SPEC = ConfidenceSpec(top_logprobs=K, window=WINDOW, tail=WINDOW, block=2)
#: Below a window of fallen tokens only: one word of the fake's ``openai`` confidence
#: (at least ``0.05 * (K + 1)``) lifts a window of ``WINDOW`` above it.
BAR = 0.05
FALL_AT = 10
#: The tokens a cut trace has read: its confident words, then a window of fallen ones.
CUT_AT = FALL_AT + WINDOW


def _request(chat: bool, n: int = 1, bar: float | None = BAR, **params: Any) -> GenerateRequest:
    sampling = SamplingParams(max_tokens=params.pop("max_tokens", 400), **params)
    if chat:
        messages = [{"role": "user", "content": "2+2?"}]
        return GenerateRequest(
            messages=messages, n=n, params=sampling, confidence=SPEC, cut_below=bar
        )
    return GenerateRequest(prompt="2+2?", n=n, params=sampling, confidence=SPEC, cut_below=bar)


def _generate(server: FakeServer, request: GenerateRequest, **engine: Any) -> list[Sample]:
    async def main() -> list[Sample]:
        async with OpenAIEngine([server.url], **engine) as e:
            return await e.generate(request)

    return run_coroutine(main())


def _assert_cut(sample: Sample) -> None:
    assert sample.finish_reason == LOW_CONFIDENCE, sample
    assert sample.completion_tokens == CUT_AT, sample
    assert sample.text == "".join(f" w{i}" for i in range(CUT_AT))  # a word a chunk
    assert sample.stop_reason is None
    confidence = sample.confidence
    assert confidence is not None
    assert confidence.tokens == CUT_AT and confidence.window == WINDOW
    assert sample.prompt_tokens == 3  # the stream's usage never came: counted by a probe
    # The window it was cut on: every token of it fallen.
    assert confidence.lowest_group == pytest.approx(fallen_confidence(K))
    assert confidence.tail == pytest.approx(fallen_confidence(K))
    assert len(confidence.groups) == CUT_AT // SPEC.block


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_a_falling_trace_is_cut_and_its_stream_closed(fakes: Fakes, chat: bool) -> None:
    [server] = fakes(1, logprobs="openai", fall_at=FALL_AT)
    [sample] = _generate(server, _request(chat), stream=True)
    _assert_cut(sample)
    state = server.state
    # The upstream saw the client leave mid-stream: its trace has no end to run to.
    wait_until(lambda: state.disconnects == 1, 10, "the fake to see the client leave")
    wait_until(lambda: state.in_flight == 0, 10, "the fake's stream to end")
    assert state.fallen_sent >= WINDOW
    # Besides the stream, only the unstreamed one-token probe of the prompt's tokens.
    assert [bool(b.get("stream")) for b in state.bodies] == [True, False]
    assert state.bodies[1]["max_tokens"] == 1 and state.samples_served == 1


def test_a_request_of_n_sent_as_singles_cuts_each(fakes: Fakes) -> None:
    """``stream()`` sends a request of ``n`` as singles: each is cut and closed on its own,
    and the engine's connections serve the next request (none was left held)."""
    [server] = fakes(1, logprobs="openai", fall_at=FALL_AT)

    async def main() -> tuple[list[Sample], list[Sample]]:
        async with OpenAIEngine([server.url], stream=True, n_support="no") as e:
            cut = [s async for s in e.stream(_request(True, n=3))]
            server.state.fall_at = None  # the next answers end on their own
            return cut, await e.generate(_request(True, n=2))

    cut, after = run_coroutine(main())
    assert len(cut) == 3
    for sample in cut:
        _assert_cut(sample)
    wait_until(lambda: server.state.disconnects == 3, 10, "the fake to see three clients leave")
    assert [s.finish_reason for s in after] == ["stop", "stop"]


def test_the_embedded_servers_shape_is_cut(fakes: Fakes) -> None:
    """llama.cpp's server (the embedded default, which the engine streams from) ignores
    ``n`` and ``stream_options``: no usage chunk, and once seen to ignore ``n``, singles,
    each cut. (The request that finds out is one of ``n``: not cut.)"""
    [server] = fakes(1, logprobs="openai", honour_n=False, stream_usage=False, answers=("4",))

    async def main() -> tuple[list[Sample], list[Sample]]:
        async with OpenAIEngine([server.url], stream=True) as e:
            found_out = await e.generate(_request(False, n=2))
            server.state.fall_at = FALL_AT
            return found_out, await e.generate(_request(False, n=2))

    found_out, cut = run_coroutine(main())
    assert [s.finish_reason for s in found_out] == ["length", "length"]  # the fake's own
    assert len(cut) == 2
    for sample in cut:
        _assert_cut(sample)
    wait_until(lambda: server.state.disconnects == 2, 10, "the fake to see the clients leave")


@pytest.mark.parametrize("bar", [None, 0.01], ids=["no-bar", "below-every-window"])
def test_a_trace_above_the_bar_is_unchanged(fakes: Fakes, bar: float | None) -> None:
    [server] = fakes(1, logprobs="openai", answers=("4",))
    [plain] = _generate(server, _request(True, bar=None), stream=True)
    [read] = _generate(server, _request(True, bar=bar), stream=True)
    assert read.finish_reason == plain.finish_reason == "stop"
    words = len(read.text.split(" "))
    assert words > WINDOW and read.completion_tokens == plain.completion_tokens == words
    assert read.confidence is not None and read.confidence.tokens == words
    assert server.state.disconnects == 0 and server.state.samples_served == 2


def test_an_unstreamed_request_is_not_cut(fakes: Fakes) -> None:
    """Its answer comes whole: there is nothing to close early."""
    [server] = fakes(1, logprobs="openai")
    [sample] = _generate(server, _request(True, bar=100.0), stream=False)
    assert sample.finish_reason == "stop" and sample.confidence is not None
    assert sample.confidence.lowest_group < 100.0


def test_a_request_of_n_in_one_stream_is_not_cut(fakes: Fakes) -> None:
    """One stream of ``n`` choices cannot close one of them: the falling trace runs on
    into its ``max_tokens``, where the engine stops a runaway stream."""
    [server] = fakes(1, logprobs="openai", fall_at=FALL_AT)
    with pytest.raises(EngineProtocolError, match="runaway"):
        _generate(
            server, _request(True, n=2, max_tokens=40), stream=True, n_support="yes",
            retry=RetryPolicy(max_retries=0),
        )  # fmt: skip


async def _events(chunks: list[dict[str, Any]], read: list[int]) -> AsyncIterator[ServerEvent]:
    for chunk in chunks:
        read[0] += 1
        yield ServerEvent("message", json.dumps(chunk).encode())


def _collect(chunks: list[dict[str, Any]], bar: float | None) -> tuple[list[Sample], int]:
    """The samples of ``chunks`` collected with ``bar``, and the chunks read of them."""
    read = [0]
    cut = None if bar is None else CutBar(SPEC, bar)
    payload = run_coroutine(collect_events(_events(chunks, read), None, K, cut))
    return parse_samples(payload, False, "u", SPEC), read[0]


def _choice(index: int, confidences: list[float], text: str = "x") -> dict[str, Any]:
    top = [{f"t{j}": -c for j in range(K)} for c in confidences]
    return {"index": index, "text": text, "logprobs": {"top_logprobs": top}}


def test_collecting_stops_at_the_token_whose_window_falls_below_the_bar() -> None:
    """Token by token, also within a chunk of several: the window (4) after the 6th token is
    (1 + 1 + 0.1 + 0.1) / 4 = 0.55, the first below 0.6."""
    confidences = [1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.1]
    chunks = [
        {"choices": [_choice(0, confidences[:3])]},
        {"choices": [_choice(0, confidences[3:])]},
    ]
    chunks += [{"choices": [_choice(0, [1.0])]}] * 5 + [
        {"choices": [], "usage": {"prompt_tokens": 2}}
    ]
    [sample], read = _collect(chunks, 0.6)
    assert (sample.finish_reason, sample.completion_tokens) == (LOW_CONFIDENCE, 6)
    assert sample.text == "xx" and read == 2  # nothing read past the chunk it fell in
    assert sample.confidence is not None and sample.confidence.tokens == 6
    assert sample.confidence.lowest_group == pytest.approx(0.55)


@pytest.mark.parametrize("bar", [None, 0.05])
def test_collecting_a_trace_that_stays_above_the_bar_is_unchanged(bar: float | None) -> None:
    chunks = [{"choices": [_choice(0, [0.1] * 3)]} for _ in range(3)]
    chunks.append({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
    [sample], read = _collect(chunks, bar)
    assert (sample.finish_reason, sample.completion_tokens, read) == ("stop", 9, 4)


def test_collecting_a_stream_of_several_choices_never_cuts() -> None:
    chunks = [{"choices": [_choice(0, [1.0] * 4), _choice(1, [1.0] * 4)]}]
    chunks += [{"choices": [_choice(0, [0.01] * 4), _choice(1, [0.01] * 4)]}]
    chunks.append(
        {"choices": [{"index": i, "text": "", "finish_reason": "length"} for i in (0, 1)]}
    )
    samples, read = _collect(chunks, 0.5)
    assert [(s.finish_reason, s.completion_tokens) for s in samples] == [("length", 8)] * 2
    assert read == 3
