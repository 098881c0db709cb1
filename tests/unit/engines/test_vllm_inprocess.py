"""The in-process vLLM engine over a fake ``vllm`` package: what it asks of ``AsyncLLM``
and how it reads the outputs (the real one runs in the vLLM lane, tests/integration)."""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from blendserve.core.signals import ConfidenceMeter, ConfidenceSpec
from blendserve.engines.base import GenerateRequest, Sample, SamplingParams
from blendserve.errors import EngineUnavailable

from tests.support.running import run_coroutine


def test_without_vllm_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from blendserve.engines.vllm_inprocess import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vLLM were not installed
    with pytest.raises(EngineUnavailable, match=r"pip install -e ./client -e '\.\[vllm\]'"):
        VLLMEngine({"model": "any"})


class FakeOutputKind(enum.Enum):
    """vLLM's ``RequestOutputKind``: the two kinds the engine asks for."""

    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class FakeLogprob:
    """vLLM's ``Logprob``: what the engine reads of it."""

    logprob: float
    rank: int | None = None


@dataclass
class FakeCompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, FakeLogprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class FakeRequestOutput:
    prompt_token_ids: list[int]
    outputs: list[FakeCompletionOutput]


@dataclass
class FakeTrace:
    """One scripted sample: at each token, the logprobs of a six-token vocabulary (best
    first) and the rank of the one sampled; how it ends and why."""

    positions: list[tuple[list[float], int]]
    finish_reason: str
    stop_reason: int | str | None = None


_SURE = [-0.05, -4.0, -5.0, -6.0, -7.0, -8.0]
_TORN = [-1.0, -1.5, -2.0, -3.0, -4.0, -9.0]
#: Two samples. The first samples its vocabulary's last token at its third step (ranked
#: below any top k: vLLM sends its logprob beside them) and ends on a stop string; the
#: second runs to its length.
TRACES = [
    FakeTrace([(_SURE, 1), (_TORN, 2), (_TORN, 6)], "stop", "\n"),
    FakeTrace([(_TORN, 1), (_TORN, 1), (_SURE, 1), (_SURE, 1), (_SURE, 3)], "length"),
]
PROMPT_IDS = [1, 2, 3, 4]


@dataclass
class FakeAsyncLLM:
    """vLLM's ``AsyncLLM``, replaying :data:`TRACES` one token a step for each sample (all
    at once, at the end, for ``FINAL_ONLY``); it records the sampling params it was given."""

    params: list[Any] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    errored: bool = False
    vllm_config: Any = None

    @classmethod
    def from_engine_args(cls, args: Any) -> FakeAsyncLLM:
        return cls()

    async def generate(
        self, prompt: Any, params: Any, request_id: str
    ) -> AsyncIterator[FakeRequestOutput]:
        self.params.append(params)
        traces = TRACES[: params.kwargs["n"]]
        k = params.kwargs.get("logprobs")
        if params.kwargs["output_kind"] is FakeOutputKind.FINAL_ONLY:
            yield FakeRequestOutput(PROMPT_IDS, [_final(i, t, k) for i, t in enumerate(traces)])
            return
        for step in range(max(len(t.positions) for t in traces)):
            outputs = [
                _step(i, t, step, k) for i, t in enumerate(traces) if step < len(t.positions)
            ]
            yield FakeRequestOutput(PROMPT_IDS, outputs)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def shutdown(self) -> None:
        pass


def _position(vocabulary: list[float], rank: int, k: int | None) -> dict[int, FakeLogprob] | None:
    """vLLM's logprobs of one token: the sampled token's first, then the top k (a dict: the
    sampled token once where it is among them)."""
    if k is None:
        return None
    entries = {100 + rank: FakeLogprob(vocabulary[rank - 1], rank)}
    entries.update({100 + r: FakeLogprob(vocabulary[r - 1], r) for r in range(1, k + 1)})
    return entries


def _step(index: int, trace: FakeTrace, step: int, k: int | None) -> FakeCompletionOutput:
    last = step == len(trace.positions) - 1
    position = _position(*trace.positions[step], k)
    return FakeCompletionOutput(
        index,
        f"t{step}",
        [100 + step],
        None if position is None else [position],
        trace.finish_reason if last else None,
        trace.stop_reason if last else None,
    )


def _final(index: int, trace: FakeTrace, k: int | None) -> FakeCompletionOutput:
    positions = [_position(vocabulary, rank, k) for vocabulary, rank in trace.positions]
    return FakeCompletionOutput(
        index,
        "".join(f"t{step}" for step in range(len(positions))),
        [100 + step for step in range(len(positions))],
        None if k is None else [p for p in positions if p is not None],
        trace.finish_reason,
        trace.stop_reason,
    )


class FakeSamplingParams:
    """vLLM's ``SamplingParams``: keeps what it was made of."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A ``vllm`` package of fakes, enough for :class:`VLLMEngine` on a CPU build."""
    modules = {
        "vllm": {"SamplingParams": FakeSamplingParams},
        "vllm.engine": {},
        "vllm.engine.arg_utils": {"AsyncEngineArgs": lambda **kwargs: kwargs},
        "vllm.sampling_params": {"RequestOutputKind": FakeOutputKind},
        "vllm.v1": {},
        "vllm.v1.engine": {},
        "vllm.v1.engine.async_llm": {"AsyncLLM": FakeAsyncLLM},
        "vllm.platforms": {"current_platform": types.SimpleNamespace(is_cpu=lambda: True)},
    }
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    yield


def _expected(trace: FakeTrace, spec: ConfidenceSpec) -> Any:
    meter = ConfidenceMeter(spec)
    for vocabulary, _ in trace.positions:
        meter.add(vocabulary[: spec.top_logprobs])  # the top k alone
    return meter.summary()


def _run(request: GenerateRequest, streamed: bool) -> tuple[list[Sample], FakeAsyncLLM]:
    from blendserve.engines.vllm_inprocess import VLLMEngine

    engine = VLLMEngine({"model": "fake"})

    async def scenario() -> list[Sample]:
        if streamed:
            return [sample async for sample in engine.stream(request)]
        return await engine.generate(request)

    samples = run_coroutine(scenario(), timeout=10)
    fake = engine._engine
    assert isinstance(fake, FakeAsyncLLM)
    return sorted(samples, key=lambda s: s.completion_tokens), fake


@pytest.mark.usefixtures("fake_vllm")
@pytest.mark.parametrize("streamed", [True, False], ids=["delta", "final-only"])
@pytest.mark.parametrize("k", [2, 3])
def test_a_confidence_spec_asks_for_top_logprobs_and_reads_each_samples_tokens(
    streamed: bool, k: int
) -> None:
    spec = ConfidenceSpec(top_logprobs=k, window=2, tail=2, block=2)
    request = GenerateRequest(prompt="q", n=2, params=SamplingParams(max_tokens=5), confidence=spec)
    samples, fake = _run(request, streamed)
    (params,) = fake.params
    assert params.kwargs["logprobs"] == k
    assert [s.completion_tokens for s in samples] == [3, 5]
    for sample, trace in zip(samples, TRACES, strict=True):
        # The sampled token's own logprob (-9) beside the top k is not among the k largest.
        assert sample.confidence == _expected(trace, spec)
        assert sample.finish_reason == trace.finish_reason
    assert [s.stop_reason for s in samples] == ["\n", None]
    first = samples[0].confidence
    assert first is not None and first.tokens == 3 and len(first.groups) == 2
    sure, torn = -sum(_SURE[:k]) / k, -sum(_TORN[:k]) / k
    assert first.groups == pytest.approx(((sure + torn) / 2, torn))


@pytest.mark.usefixtures("fake_vllm")
@pytest.mark.parametrize("streamed", [True, False], ids=["delta", "final-only"])
def test_without_a_spec_no_logprobs_are_asked_for_and_samples_have_no_confidence(
    streamed: bool,
) -> None:
    request = GenerateRequest(prompt="q", n=2, params=SamplingParams(max_tokens=5))
    samples, fake = _run(request, streamed)
    assert "logprobs" not in fake.params[0].kwargs
    assert [s.confidence for s in samples] == [None, None]
    assert [s.stop_reason for s in samples] == ["\n", None]


@pytest.mark.usefixtures("fake_vllm")
def test_a_callers_own_logprobs_are_passed_unchanged() -> None:
    spec = ConfidenceSpec(top_logprobs=3)
    params = SamplingParams(max_tokens=5, extra={"logprobs": 5})
    samples, fake = _run(GenerateRequest(prompt="q", n=1, params=params, confidence=spec), True)
    assert fake.params[0].kwargs["logprobs"] == 5
    (sample,) = samples
    assert sample.confidence == _expected(TRACES[0], spec)  # the spec's k of the caller's 5


#: Windows of one token from the top 2: the first trace's tokens read 2.025, 1.25, 1.25.
CUT_SPEC = ConfidenceSpec(top_logprobs=2, window=1, tail=1, block=1)


@pytest.mark.usefixtures("fake_vllm")
@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "generate"])
def test_a_sample_whose_window_falls_below_the_bar_is_cut_and_aborted(streamed: bool) -> None:
    """A request of 2 with a bar goes as two singles, read step by step; each is cut at its
    second token (1.25 < 1.5) and aborted in the engine."""
    request = GenerateRequest(
        prompt="q", n=2, params=SamplingParams(max_tokens=5), confidence=CUT_SPEC, cut_below=1.5
    )
    samples, fake = _run(request, streamed)
    assert [p.kwargs["n"] for p in fake.params] == [1, 1]
    assert all(p.kwargs["output_kind"] is FakeOutputKind.DELTA for p in fake.params)
    for sample in samples:
        assert sample.finish_reason == "low_confidence" and sample.stop_reason is None
        assert (sample.text, sample.completion_tokens, sample.prompt_tokens) == ("t0t1", 2, 4)
        assert sample.confidence is not None and sample.confidence.tokens == 2
        assert sample.confidence.tail == pytest.approx(-sum(_TORN[:2]) / 2)
    assert len(fake.aborted) == 2 and len(set(fake.aborted)) == 2  # each single's own


@pytest.mark.usefixtures("fake_vllm")
@pytest.mark.parametrize("bar", [None, 0.5], ids=["no-bar", "below-every-window"])
def test_a_sample_above_the_bar_runs_to_its_end(bar: float | None) -> None:
    request = GenerateRequest(
        prompt="q", n=1, params=SamplingParams(max_tokens=5), confidence=CUT_SPEC, cut_below=bar
    )
    [sample], fake = _run(request, False)
    assert (sample.finish_reason, sample.completion_tokens, sample.text) == ("stop", 3, "t0t1t2")
    assert sample.confidence == _expected(TRACES[0], CUT_SPEC)
    assert fake.aborted == []
