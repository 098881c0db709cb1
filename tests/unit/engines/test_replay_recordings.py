"""The replay engine on recordings: each drawn sample's length, finish and stop reasons and
confidence as recorded; older ``answers`` data served exactly as before."""

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from blendserve.answers import extract
from blendserve.core.signals import Confidence, ConfidenceSpec
from blendserve.engines import GenerateRequest
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.engines.step_cost import StepCost
from blendserve.recordings.format import parse_record
from blendserve.sim import run_virtual

from tests.support.running import run_coroutine

OLD_DATA = Path(__file__).parents[2] / "fixtures" / "replay_small.jsonl"
SUMMARY = {"mean": 3.2, "lowest_group": 2.5, "tail": 3.0, "tokens": 120, "window": 16, "block": 32}
GROUPS = [3.1, 3.3, 3.2, 3.2]
#: One question recorded in two lines (a resumed recording): an answer ended by a stop
#: string with its confidence, one cut at the length limit, and one that gave no answer.
RECORDING = [
    {
        "id": "q",
        "prompt": "Which is it?",
        "gold": "7",
        "samples": [
            {"answer": "7", "tokens": 120, "finish": "stop", "stop": "</answer>",
             "confidence": SUMMARY, "groups": GROUPS},
            {"answer": "8", "tokens": 900, "finish": "length"},
        ],
    },
    {"id": "q", "samples": [{"answer": None, "tokens": 2048, "finish": "length"}]},
]  # fmt: skip
#: Steps of 10 ms plus 1 ms a sequence.
FLAT = StepCost(base_ms=10.0, per_sequence_ms=1.0, per_sequence_context_ms=0.0)


def _write(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    path = tmp_path / "recording.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _ask(engine: ReplayEngine, n: int, **kwargs: Any) -> list[Any]:
    request = GenerateRequest(prompt="unused", n=n, question_id="q", **kwargs)
    return run_coroutine(engine.generate(request))


def test_a_drawn_sample_keeps_its_recorded_tokens_finish_stop_and_confidence(
    tmp_path: Path,
) -> None:
    # A length model is set, and must not be drawn from: every sample has its tokens.
    latency = LatencyModel(length=(9.0, 0.0))
    path = _write(tmp_path, RECORDING)
    engine = ReplayEngine(path, seed=1, answer_kind="number", latency=latency)
    samples = _ask(engine, 300, confidence=ConfidenceSpec())
    served = {
        extract(s.text, "number"): (
            s.completion_tokens, s.finish_reason, s.stop_reason, s.confidence
        )
        for s in samples
    }  # fmt: skip
    confidence = Confidence.from_json(SUMMARY, GROUPS)
    assert served == {
        "7": (120, "stop", "</answer>", confidence),
        "8": (900, "length", None, None),
        None: (2048, "length", None, None),
    }
    assert served["7"][3] is not None and served["7"][3].groups == tuple(GROUPS)


def test_a_recorded_confidence_is_served_only_where_the_request_asks_for_it(
    tmp_path: Path,
) -> None:
    engine = ReplayEngine(_write(tmp_path, RECORDING), seed=1, answer_kind="number")
    samples = _ask(engine, 100)
    assert any(extract(s.text, "number") == "7" for s in samples)
    assert all(s.confidence is None for s in samples)


def test_a_sample_recorded_without_tokens_gets_the_length_model(tmp_path: Path) -> None:
    lines = [{"id": "q", "samples": [{"answer": "1", "tokens": 5}, {"answer": "2"}]}]
    path = _write(tmp_path, lines)
    modelled = ReplayEngine(path, seed=2, latency=LatencyModel(length=(math.log(40), 0.0)))
    words = ReplayEngine(path, seed=2)
    for engine, unrecorded in ((modelled, 40), (words, None)):
        samples = _ask(engine, 50)
        tokens = {extract(s.text, "number"): s.completion_tokens for s in samples}
        assert tokens["1"] == 5
        sample_of_2 = next(s for s in samples if extract(s.text, "number") == "2")
        assert tokens["2"] == (unrecorded or len(sample_of_2.text.split()))
        assert sample_of_2.finish_reason == "stop" and sample_of_2.stop_reason is None


def test_older_answers_data_draws_exactly_as_before() -> None:
    # Pinned from the engine before it read recordings: same seed, same draws and lengths.
    engine = ReplayEngine(
        OLD_DATA, seed=3, latency=LatencyModel(length=(5.58, 0.3)), answer_kind="number"
    )
    samples = run_coroutine(
        engine.generate(GenerateRequest(prompt="x", n=12, question_id="q-split"))
    )
    assert [(extract(s.text, "number"), s.completion_tokens) for s in samples] == [
        ("8", 339), ("7", 168), ("8", 260), ("7", 279), ("7", 312), ("7", 317),
        ("7", 284), ("7", 219), ("7", 282), ("7", 354), ("7", 243), ("7", 205),
    ]  # fmt: skip
    assert all(s.finish_reason == "stop" and s.stop_reason is None for s in samples)
    asked = run_coroutine(
        engine.generate(
            GenerateRequest(prompt="x", n=20, question_id="q-split", confidence=ConfidenceSpec())
        )
    )
    assert all(s.confidence is None for s in asked)


def test_older_answers_and_the_same_samples_without_lengths_draw_alike() -> None:
    lines = [json.loads(line) for line in OLD_DATA.read_text().splitlines() if line.strip()]
    as_samples = [
        {**{k: v for k, v in line.items() if k != "answers"},
         "samples": [{"answer": a} for a in line["answers"]]}
        for line in lines
    ]  # fmt: skip
    for seed in (0, 7):
        texts = []
        for data in (lines, as_samples):
            engine = ReplayEngine(data, seed=seed, latency=LatencyModel(length=(5.0, 0.5)))
            samples = [s for q in ("q-easy", "q-split", "q-letters") for s in _ask_id(engine, q)]
            texts.append([(s.text, s.finish_reason, s.completion_tokens) for s in samples])
        assert texts[0] == texts[1]


def _ask_id(engine: ReplayEngine, question_id: str) -> list[Any]:
    return run_coroutine(engine.generate(GenerateRequest(prompt="x", n=9, question_id=question_id)))


def test_continuous_batching_ends_each_sample_after_its_recorded_tokens() -> None:
    # The length model would make both samples 8,103 tokens long: the recording decides.
    latency = LatencyModel(step_cost=FLAT, max_concurrent_sequences=8, length=(9.0, 0.0))
    records = [
        {"id": "short", "samples": [{"answer": "1", "tokens": 10, "finish": "stop"}]},
        {"id": "long", "samples": [{"answer": "2", "tokens": 1000, "finish": "stop"}]},
    ]
    engine = ReplayEngine(records, latency=latency)
    assert engine.delivers_each
    ended: dict[str, float] = {}

    async def ask(question_id: str) -> None:
        request = GenerateRequest(prompt=question_id, n=1, question_id=question_id)
        async for sample in engine.stream(request):
            assert sample.completion_tokens == (10 if question_id == "short" else 1000)
            ended[question_id] = asyncio.get_running_loop().time()

    async def both() -> None:
        await asyncio.gather(ask("long"), ask("short"))

    _, elapsed = run_virtual(both())
    # 10 steps two wide (12 ms), then the long one's 990 alone (11 ms).
    assert ended["short"] == pytest.approx(10 * 0.012, rel=0.02)
    assert ended["long"] == pytest.approx(10 * 0.012 + 990 * 0.011, rel=0.02)
    assert elapsed == pytest.approx(ended["long"])


def test_one_request_streams_its_short_recorded_samples_before_its_long_ones() -> None:
    latency = LatencyModel(step_cost=FLAT, max_concurrent_sequences=8)
    record = {"id": "q", "samples": [{"answer": "1", "tokens": 20}, {"answer": "2", "tokens": 400}]}
    engine = ReplayEngine([record], seed=4, latency=latency)
    order: list[tuple[float, int]] = []

    async def ask() -> None:
        async for sample in engine.stream(GenerateRequest(prompt="q", n=8, question_id="q")):
            order.append((asyncio.get_running_loop().time(), sample.completion_tokens))

    run_virtual(ask())
    tokens = [count for _, count in order]
    assert set(tokens) == {20, 400} and tokens == sorted(tokens)
    short_end = max(t for t, count in order if count == 20)
    assert short_end < min(t for t, count in order if count == 400)


def test_the_wave_model_lasts_the_longest_recorded_sample() -> None:
    latency = LatencyModel(fixed=1.0, per_token=0.01, length=(9.0, 0.0))
    record = {"id": "q", "samples": [{"answer": "1", "tokens": 500}]}
    engine = ReplayEngine([record], latency=latency)
    _, elapsed = run_virtual(engine.generate(GenerateRequest(prompt="q", n=2, question_id="q")))
    assert elapsed == pytest.approx(1.0 + 500 * 0.01)


def test_recorded_questions_are_found_by_id_prompt_or_last_message(tmp_path: Path) -> None:
    chat = {
        "id": "c",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
        ],
        "samples": [{"answer": "4", "tokens": 3, "finish": "stop"}],
    }
    engine = ReplayEngine([parse_record(chat, "chat"), *RECORDING], answer_kind="number", seed=1)
    by_message = GenerateRequest(messages=[{"role": "user", "content": "2+2?"}])
    (sample,) = run_coroutine(engine.generate(by_message))
    assert extract(sample.text, "number") == "4" and sample.completion_tokens == 3
    by_prompt = run_coroutine(engine.generate(GenerateRequest(prompt="Which is it?", n=200)))
    # Both lines of "q" are one question: the second line's sample is drawn too.
    assert {s.completion_tokens for s in by_prompt} == {120, 900, 2048}
