"""DeepConf's pieces as the engine benchmark uses them: the filter, the bar and the
weighted vote the simulator's DeepConf runs on, and the replay engine cutting a trace
where the simulator does."""

import numpy as np
import pytest
from blendserve.core.signals import ConfidenceSpec
from blendserve.core.traces import LOW_CONFIDENCE
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.engines.replay import ReplayEngine
from blendserve.recordings.format import RecordedQuestion
from blendserve.sim.clock import run_virtual
from blendserve.sim.trace_data import trace_recording
from blendserve.sim.traces import (
    TraceDraws,
    cut_point,
    deepconf_bar,
    deepconf_kept,
    deepconf_warmup,
    run_deepconf_offline,
    run_deepconf_online,
    trace_questions,
    weighted_leader,
)


def test_weighted_leader_sums_weights_skips_abstentions_and_breaks_ties_by_arrival() -> None:
    votes = [("b", 0.5), (None, 9.0), ("a", 0.25), ("a", 0.25), ("b", 0.25)]
    leader, share = weighted_leader(votes)
    assert leader == "b" and share == pytest.approx(0.75 / 1.25)
    # a and b tie at 0.5: b reached it first.
    assert weighted_leader(votes[:4]) == ("b", 0.5)
    assert weighted_leader([(None, 1.0)]) == (None, 0.0)


def test_deepconf_kept_is_the_top_eta_percent_in_order() -> None:
    confidences = [3.0, 9.0, 5.0, 9.0, 1.0, 7.0, 2.0, 4.0, 6.0, 8.0]
    assert deepconf_kept(confidences, 10.0) == [1]  # the tie at 9 goes to the earlier
    assert deepconf_kept(confidences, 30.0) == [1, 3, 9]
    assert deepconf_kept(confidences, 90.0) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert deepconf_kept(confidences[:3], 10.0) == [1]  # at least one
    assert deepconf_kept(confidences, 100.0) == list(range(10))


def test_deepconf_bar_lets_the_top_share_through() -> None:
    confidences = list(np.random.default_rng(0).normal(10.0, 2.0, 1000))
    for eta in (10.0, 90.0):
        bar = deepconf_bar(confidences, eta)
        passed = sum(c >= bar for c in confidences) / len(confidences)
        assert passed == pytest.approx(eta / 100.0, abs=0.002)


def test_the_helpers_are_the_simulators_deepconf() -> None:
    """Offline run through the helpers gives the simulator's answers, question by question."""
    questions = trace_questions(trace_recording("flat", 40, 32, 1.0, 1.2, seed=3))
    for eta in (10.0, 90.0):
        run = run_deepconf_offline(questions, 12, eta, seed=5)
        draws = TraceDraws(questions, seed=5)
        for q, question in enumerate(questions):
            traces = [draws.next(q) for _ in range(12)]
            confidences = [t.confidence.lowest_group for t in traces if t.confidence]
            kept = deepconf_kept(confidences, eta)
            leader, _ = weighted_leader((traces[i].key, confidences[i]) for i in kept)
            assert run.right[q] == (leader is not None and leader == question.gold)
    # Online draws the warm-up first, and only later traces are cut.
    online = run_deepconf_online(questions, 12, eta=90.0, seed=5)
    assert min(online.samples) >= deepconf_warmup(12)
    assert all(
        c <= n - deepconf_warmup(12) for c, n in zip(online.cut, online.samples, strict=True)
    )


def test_the_replay_engine_cuts_a_trace_where_the_simulator_does() -> None:
    """A trace requested with ``cut_below`` is charged what the simulator charges that
    trace under that bar: the engine timing DeepConf online spends the simulator's tokens.
    Each recorded trace is made a question of its own, so that a request serves it."""
    records = trace_recording("flat", 6, 16, 1.0, 1.0, seed=2)
    singles = [
        RecordedQuestion(f"{record.id}/{i}", (sample,), gold=record.gold)
        for record in records
        for i, sample in enumerate(record.samples)
    ]
    traces = [question.samples[0] for question in trace_questions(singles)]
    levels = [t.confidence.lowest_group for t in traces if t.confidence]
    bar = deepconf_bar(levels, 50.0)
    engine = ReplayEngine(singles)
    spec = ConfidenceSpec().scaled(512)
    assert spec.window == 64

    async def main() -> list[Sample]:
        served = []
        for question in singles:
            request = GenerateRequest(
                prompt=question.id, question_id=question.id, confidence=spec, cut_below=bar
            )
            served += await engine.generate(request)
        return served

    served, _ = run_virtual(main())
    cuts = 0
    for trace, sample in zip(traces, served, strict=True):
        stop = cut_point(trace, bar)
        if sample.finish_reason == LOW_CONFIDENCE:
            cuts += 1
            assert stop is not None and sample.completion_tokens == stop < trace.tokens
        else:
            assert sample.completion_tokens == trace.tokens
            assert stop is None or stop >= trace.tokens
    assert 0 < cuts < len(traces)
