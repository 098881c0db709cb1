"""The replay engine cuts a recorded trace where its replayed window confidence first falls
below the request's bar (``GenerateRequest.cut_below``), and its modelled clocks charge only
the tokens read by then; the shipped recording's traces are cut where their trajectories say."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from blendserve.answers import extract
from blendserve.core.signals import ConfidenceSpec
from blendserve.core.traces import LOW_CONFIDENCE
from blendserve.engines import GenerateRequest
from blendserve.engines.replay import LatencyModel, ReplayEngine, cut_point
from blendserve.engines.step_cost import StepCost
from blendserve.recordings.format import parse_record
from blendserve.sim import run_virtual

from tests.support.running import run_coroutine

SPEC = ConfidenceSpec(top_logprobs=5, window=16, tail=8, block=4)
#: 64 tokens in blocks of 4: sure for 8 blocks, then unsure. The windows (4 blocks) after
#: blocks 10 and 11 are 0.55 and 0.325: a bar of 0.5 cuts after 11 blocks, 44 tokens.
GROUPS = [1.0] * 8 + [0.1] * 8
SUMMARY = {"mean": 0.55, "lowest_group": 0.1, "tail": 0.1, "tokens": 64, "window": 16, "block": 4}
RECORD = {
    "id": "q",
    "samples": [{"answer": "7", "tokens": 64, "finish": "stop", "confidence": SUMMARY,
                 "groups": GROUPS}],
}  # fmt: skip
CUT_AT = 44
#: Steps of 10 ms plus 1 ms a sequence.
FLAT = StepCost(base_ms=10.0, per_sequence_ms=1.0, per_sequence_context_ms=0.0)
RECORDING = Path(__file__).parents[3] / "bench" / "recordings" / "data" / "qwen2.5-coder-0.5b.jsonl"


def _engine(**latency: Any) -> ReplayEngine:
    return ReplayEngine([RECORD], answer_kind="number", latency=LatencyModel(**latency))


def _request(bar: float | None, spec: ConfidenceSpec = SPEC, n: int = 1) -> GenerateRequest:
    return GenerateRequest(prompt="q", n=n, question_id="q", confidence=spec, cut_below=bar)


def test_a_trace_is_cut_where_its_replayed_window_first_falls_below_the_bar() -> None:
    [sample] = run_coroutine(_engine().generate(_request(0.5)))
    assert sample.finish_reason == LOW_CONFIDENCE and sample.stop_reason is None
    assert sample.completion_tokens == CUT_AT
    assert extract(sample.text, "number") is None  # it never reached its answer
    confidence = sample.confidence
    assert confidence is not None
    assert (confidence.tokens, confidence.window, confidence.block) == (CUT_AT, 16, 4)
    assert confidence.groups == tuple(GROUPS[: CUT_AT // 4])
    assert confidence.lowest_group == pytest.approx(0.325)  # the window it was cut on
    assert confidence.mean == pytest.approx((8 * 1.0 + 3 * 0.1) / 11)
    assert confidence.tail == pytest.approx(0.1)  # its last 8 tokens: two unsure blocks


@pytest.mark.parametrize("bar", [None, 0.05], ids=["no-bar", "below-every-window"])
def test_a_trace_that_never_falls_below_the_bar_is_served_as_recorded(bar: float | None) -> None:
    [sample] = run_coroutine(_engine().generate(_request(bar)))
    assert (sample.finish_reason, sample.completion_tokens) == ("stop", 64)
    assert extract(sample.text, "number") == "7"
    assert sample.confidence is not None and sample.confidence.tokens == 64


def test_a_window_other_than_the_recorded_one_cannot_be_replayed_and_cuts_nothing() -> None:
    other = ConfidenceSpec(top_logprobs=5, window=32, tail=8, block=4)
    [sample] = run_coroutine(_engine().generate(_request(0.5, other)))
    assert (sample.finish_reason, sample.completion_tokens) == ("stop", 64)


def test_the_wave_model_charges_a_cut_trace_its_tokens_read() -> None:
    latency = {"fixed": 1.0, "per_token": 0.01}
    _, whole = run_virtual(_engine(**latency).generate(_request(None)))
    _, cut = run_virtual(_engine(**latency).generate(_request(0.5)))
    assert whole == pytest.approx(1.0 + 64 * 0.01)
    assert cut == pytest.approx(1.0 + CUT_AT * 0.01)


def test_continuous_batching_frees_a_cut_traces_slot_after_its_tokens_read() -> None:
    """One slot: a cut trace holds it for its 44 steps, and the next request starts then."""
    engine = _engine(step_cost=FLAT, max_concurrent_sequences=1)
    ended: list[float] = []

    async def ask() -> None:
        async def one() -> None:
            await engine.generate(_request(0.5))
            ended.append(asyncio.get_running_loop().time())

        await asyncio.gather(one(), one())

    run_virtual(ask())
    step = 0.011  # a step one wide
    assert ended == pytest.approx([CUT_AT * step, 2 * CUT_AT * step], rel=0.02)


def test_the_shipped_recordings_traces_are_cut_where_their_trajectories_fall() -> None:
    """Each recorded sample of the real recording, served with a bar at its own recorded
    lowest window: cut (or not) exactly where :func:`cut_point` replays it, never later
    than its end, its clock's tokens those read."""
    import json

    questions = [parse_record(json.loads(line), "r") for line in RECORDING.read_text().splitlines()]
    question = questions[0]
    recorded = [s for s in question.samples if s.confidence is not None and s.confidence.groups]
    assert recorded
    confidence = recorded[0].confidence
    assert confidence is not None
    spec = ConfidenceSpec(top_logprobs=5, window=confidence.window, tail=confidence.window,
                          block=confidence.block)  # fmt: skip
    engine = ReplayEngine([question], seed=3)
    bar = sorted(s.confidence.lowest_group for s in recorded if s.confidence)[len(recorded) // 2]
    samples = run_coroutine(
        engine.generate(GenerateRequest(prompt="x", n=64, question_id=question.id,
                                        confidence=spec, cut_below=bar + 1e-6))
    )  # fmt: skip
    cut = [s for s in samples if s.finish_reason == LOW_CONFIDENCE]
    assert cut and len(cut) < len(samples)  # a bar at the median: some cut, some not
    for sample in cut:
        assert sample.confidence is not None
        assert sample.confidence.lowest_group < bar + 1e-6
        assert sample.completion_tokens == sample.confidence.tokens
    ends = {cut_point(s.confidence, spec.window, bar + 1e-6) for s in recorded}
    assert {s.completion_tokens for s in cut} <= ends
