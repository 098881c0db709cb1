from collections import Counter
from pathlib import Path

import numpy as np
from blendserve.core.signals import Confidence
from blendserve.core.traces import TraceFacts, TraceLearner, TraceRule, parse_trace_rule
from blendserve.recordings.format import RecordedQuestion, RecordedSample
from blendserve.sim.trace_data import trace_recording, write_recording
from blendserve.sim.traces import (
    TraceDraws,
    _wave,
    cut_point,
    deepconf_warmup,
    learner_from,
    load_traces,
    run_deepconf_offline,
    run_deepconf_online,
    run_ours,
    run_sc,
    trace_questions,
)

RECORDING = Path(__file__).parents[3] / "bench/recordings/data/qwen2.5-coder-0.5b.jsonl"


def _set(d: float, seed: int, ratio: float = 1.0, questions: int = 100):
    return trace_questions(trace_recording("flat", questions, 32, d, ratio, seed=seed))


def _sample(answer: str, level: float, tokens: int = 160) -> RecordedSample:
    """A sample whose every block has confidence ``level``."""
    groups = tuple([level] * (tokens // 16))
    return RecordedSample(
        answer, tokens, "stop", confidence=Confidence(level, level, level, tokens, 64, 16, groups)
    )


def test_draws_depend_only_on_seed_question_and_index() -> None:
    questions = _set(1.0, seed=3, questions=10)
    first, second = TraceDraws(questions, seed=5), TraceDraws(questions, seed=5)
    # Drawn in another order across questions, each question's stream is the same.
    a = [[first.index(q, k) for k in range(100)] for q in range(10)]
    b = [[second.index(q, k) for k in reversed(range(100))][::-1] for q in reversed(range(10))]
    assert a == b[::-1]
    other = TraceDraws(questions, seed=6)
    assert a != [[other.index(q, k) for k in range(100)] for q in range(10)]
    assert run_sc(questions, 8, seed=2) == run_sc(questions, 8, seed=2)


def test_the_real_recording_is_judged_by_its_gold() -> None:
    questions = load_traces(RECORDING)
    samples = [s for q in questions for s in q.samples]
    assert len(questions) == 104 and len(samples) == 104 * 16
    # The recording's report: one sample in about seven is right.
    assert 0.14 < sum(s.right for s in samples) / len(samples) < 0.16
    assert all(s.windows for s in samples if s.tokens >= 64)


def test_a_synthetic_recording_reads_back_as_written(tmp_path: Path) -> None:
    records = trace_recording("peaked", 12, 8, d=1.0, length_ratio=1.3, seed=4)
    assert trace_recording("peaked", 12, 8, d=1.0, length_ratio=1.3, seed=4) == records
    path = tmp_path / "set.jsonl"
    write_recording(path, records)
    assert load_traces(path) == trace_questions(records)
    tokens = [s.tokens for r in records for s in r.samples]
    assert min(tokens) >= 150 and max(tokens) <= 600


def test_a_cut_charges_tokens_to_the_cut_and_never_votes() -> None:
    learner = learner_from(_set(2.0, seed=1))
    rule = TraceRule(cut=10)
    bar = learner.bar(rule)
    assert bar is not None and 2.0 < bar < 20.0
    # Three in four samples give "bad" and fall far below the bar from their first window.
    records = [
        RecordedQuestion(
            f"q{i}",
            (_sample("good", 20.0, 200), *[_sample("bad", 1.0, 320)] * 3),
            gold="good",
        )
        for i in range(20)
    ]
    questions = trace_questions(records)
    assert cut_point(questions[0].samples[1], bar) == 64
    counted = run_ours(questions, TraceRule(), learner, 8, seed=0)
    cut = run_ours(questions, rule, learner, 8, seed=0)
    assert counted.error > 0.5 and counted.num_cut == 0
    draws = TraceDraws(questions, seed=0)
    for q, question in enumerate(questions):
        drawn = [question.samples[draws.index(q, k)] for k in range(cut.samples[q])]
        bad = sum(s.key == "bad" for s in drawn)
        assert cut.cut[q] == bad
        assert cut.tokens[q] == 64 * bad + 200 * (len(drawn) - bad)
        # A question that drew a good sample answers it: the cut ones never voted.
        assert cut.right[q] == (bad < len(drawn))
    assert cut.error < 0.05


def test_rules_that_learn_change_nothing_on_a_noise_recording() -> None:
    learner = learner_from(_set(0.0, seed=11))
    assert all(strength == 0.0 for strength in learner.summary().values())
    questions = _set(0.0, seed=12)
    count = run_ours(questions, TraceRule(), learner, 12, seed=3)
    for text in (
        "weighted",
        "weighted:measure=length",
        "filter:keep=0.5",
        "count:cut=30",
        "weighted:measure=tail,cut=10",
    ):
        rule = parse_trace_rule(text)
        assert rule.learns
        run = run_ours(questions, rule, learner, 12, seed=3)
        assert run == count, text


def test_weighting_lowers_error_on_an_informative_recording() -> None:
    learner = learner_from(_set(2.0, seed=21, ratio=1.3))
    assert learner.strength("lowest_group") > 0.5
    questions = _set(2.0, seed=22, ratio=1.3)
    counted = [run_ours(questions, TraceRule(), learner, 8, seed=s) for s in range(3)]
    weighted = [run_ours(questions, TraceRule("weighted"), learner, 8, seed=s) for s in range(3)]
    count_error = sum(r.error for r in counted) / 3
    weighted_error = sum(r.error for r in weighted) / 3
    assert weighted_error < count_error - 0.05
    # At equal budget: the same samples spent.
    spent = sum(sum(r.samples) for r in counted), sum(sum(r.samples) for r in weighted)
    assert abs(spent[0] - spent[1]) <= 0.02 * spent[0]


def test_first_m_keeps_the_shortest_and_charges_the_rest_to_the_mth() -> None:
    questions = trace_questions(
        [RecordedQuestion("q", tuple(_sample(str(t), 10.0, t) for t in (160, 240, 320, 480)))]
    )
    draws, mirror = TraceDraws(questions, seed=1), TraceDraws(questions, seed=1)
    # Nothing is cut short before length has shown that shorter samples agree more.
    untaught = _wave(
        TraceDraws(questions, seed=1), 0, 8, TraceRule(first_m=2), TraceLearner(), None
    )
    assert not any(cut for *_, cut in untaught)
    learner = TraceLearner()
    for _ in range(16):
        learner.learn([TraceFacts(100, None, True)] * 8 + [TraceFacts(400, None, False)] * 8)
    wave = _wave(draws, 0, 8, TraceRule(first_m=2), learner, None)
    drawn = sorted((questions[0].samples[mirror.index(0, k)].tokens, k) for k in range(8))
    second = drawn[1][0]
    voters = {k for _, k in drawn[:2]}
    for k, (_, key, weight, tokens, cut) in enumerate(wave):
        own = questions[0].samples[mirror.index(0, k)].tokens
        assert cut == (k not in voters)
        assert tokens == (own if k in voters else min(own, second))
        assert key == (None if cut else str(own)) and weight == 1.0


def test_deepconf_offline_keeping_all_is_a_confidence_weighted_vote() -> None:
    questions = _set(1.0, seed=31, questions=40)
    run = run_deepconf_offline(questions, 12, eta=100.0, seed=4)
    draws = TraceDraws(questions, seed=4)
    for q, question in enumerate(questions):
        totals: Counter[str] = Counter()
        for k in range(12):
            sample = question.samples[draws.index(q, k)]
            if sample.key is not None and sample.confidence is not None:
                totals[sample.key] += sample.confidence.lowest_group
        assert run.right[q] == (totals.most_common(1)[0][0] == question.gold)
        assert run.samples[q] == 12
    filtered = run_deepconf_offline(questions, 12, eta=10.0, seed=4)
    assert filtered.tokens == run.tokens


def test_deepconf_online_stops_at_consensus() -> None:
    unanimous = trace_questions(
        [RecordedQuestion(f"q{i}", (_sample("a", 10.0),), gold="a") for i in range(5)]
    )
    run = run_deepconf_online(unanimous, 40, eta=10.0, seed=0)
    assert run.samples == [16] * 5 and run.error == 0.0
    split = trace_questions(
        [
            RecordedQuestion(f"q{i}", (_sample("a", 10.0), _sample("b", 10.0)), gold="a")
            for i in range(5)
        ]
    )
    run = run_deepconf_online(split, 40, eta=90.0, seed=0)
    # Equal confidences: nothing falls below the bar, no consensus, the cap is spent.
    assert run.samples == [40] * 5 and run.num_cut == 0
    assert run.tokens == [40 * 160] * 5


def test_deepconf_online_cuts_charge_tokens_to_the_cut() -> None:
    questions = _set(2.0, seed=41, questions=30)
    run = run_deepconf_online(questions, 24, eta=90.0, seed=2)
    assert deepconf_warmup(24) == 12
    draws = TraceDraws(questions, seed=2)
    for q, question in enumerate(questions):
        drawn = [question.samples[draws.index(q, k)] for k in range(run.samples[q])]
        bar = float(np.percentile([s.confidence.lowest_group for s in drawn[:12]], 10.0))
        later = [cut_point(s, bar) for s in drawn[12:]]
        assert run.cut[q] == sum(c is not None for c in later)
        expected = sum(s.tokens for s in drawn[:12]) + sum(
            s.tokens if c is None else c for s, c in zip(drawn[12:], later, strict=True)
        )
        assert run.tokens[q] == expected
    assert run.num_cut > 0 and max(run.samples) <= 24
    assert sum(run.tokens) < sum(run_sc(questions, 24, seed=2).tokens)
