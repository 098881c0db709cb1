"""Confidence read from an OpenAI-compatible upstream's logprobs, in every shape it comes:
chat and completions, streamed and not, one request of n and singles, and upstreams that
send none or garbage (fake upstreams on 127.0.0.1, which run no model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from blendserve.core.signals import ConfidenceSpec
from blendserve.engines.base import GenerateRequest, Sample, SamplingParams
from blendserve.engines.openai import OpenAIEngine
from blendserve.testing.fake_openai import FakeServer

from tests.support.running import run_coroutine

Fakes = Callable[..., list[FakeServer]]
SPEC = ConfidenceSpec(top_logprobs=5, window=2, tail=2, block=1)


def _request(chat: bool, n: int, spec: ConfidenceSpec | None = SPEC) -> GenerateRequest:
    if chat:
        return GenerateRequest(messages=[{"role": "user", "content": "2+2?"}], n=n, confidence=spec)
    return GenerateRequest(prompt="2+2?", n=n, confidence=spec)


def _samples(server: FakeServer, request: GenerateRequest, **engine: Any) -> list[Sample]:
    async def main() -> list[Sample]:
        async with OpenAIEngine([server.url], **engine) as e:
            return await e.generate(request)

    return run_coroutine(main())


def _words(text: str) -> int:
    return len(text.split(" "))


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("honour_n", [True, False], ids=["n", "singles"])
def test_each_sample_reads_its_own_tokens_confidence(
    fakes: Fakes, chat: bool, stream: bool, honour_n: bool
) -> None:
    [server] = fakes(1, honour_n=honour_n, logprobs="openai")
    samples = _samples(server, _request(chat, 3), stream=stream)
    assert len(samples) == 3
    per_token = 0.05 * (SPEC.top_logprobs + 1)  # the fake's top logprobs: -0.1 * j * scale
    scales = set()
    for sample in samples:
        confidence = sample.confidence
        assert confidence is not None
        words = _words(sample.text)
        assert confidence.tokens == words
        assert sample.completion_tokens == words  # an n request's usage is a sum only
        scale = confidence.mean / per_token
        assert scale == pytest.approx(round(scale)) and round(scale) in (1, 2, 3)
        scales.add(round(scale))
        assert confidence.lowest_group == pytest.approx(confidence.mean)
        assert len(confidence.groups) == words  # a block of one token: one point a token
    assert len(scales) > 1  # each sample its own, not one shared
    body = server.state.bodies[0]
    if chat:  # one more: vLLM's chat API lists the sampled token first, within the count
        assert (body["logprobs"], body["top_logprobs"]) == (True, SPEC.top_logprobs + 1)
    else:
        assert body["logprobs"] == SPEC.top_logprobs and "top_logprobs" not in body


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("shape", ["ignored", "garbage"])
def test_an_upstream_without_usable_logprobs_gives_no_confidence(
    fakes: Fakes, chat: bool, stream: bool, shape: str
) -> None:
    [server] = fakes(1, logprobs=shape)
    samples = _samples(server, _request(chat, 2), stream=stream)
    assert len(samples) == 2
    assert all(s.confidence is None and s.text for s in samples)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_without_a_spec_no_logprobs_are_asked_for(fakes: Fakes, chat: bool) -> None:
    [server] = fakes(1, logprobs="openai")
    samples = _samples(server, _request(chat, 2, spec=None))
    assert all(s.confidence is None for s in samples)
    assert "logprobs" not in server.state.bodies[0]
    assert "top_logprobs" not in server.state.bodies[0]


def test_a_callers_own_logprobs_field_is_kept(fakes: Fakes) -> None:
    [server] = fakes(1, logprobs="openai")
    request = GenerateRequest(
        prompt="2+2?", params=SamplingParams(extra={"logprobs": 2}), confidence=SPEC
    )
    [sample] = _samples(server, request)
    assert server.state.bodies[0]["logprobs"] == 2
    assert sample.confidence is not None
    scale = sample.confidence.mean / 0.15  # the two it asked for: 0.1 and 0.2 times scale
    assert round(scale) in (1, 2, 3) and scale == pytest.approx(round(scale))
