import asyncio
import contextlib
import os
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

import pytest
from blendserve.answers import extract
from blendserve.engines import Engine, GenerateRequest, SamplingParams
from blendserve.engines.base import EngineLoad
from blendserve.engines.rendering import for_answers
from blendserve.engines.replay import FaultConfig, LatencyModel, ReplayEngine, render
from blendserve.engines.step_cost import StepCost
from blendserve.errors import EngineProtocolError, EngineTimeout, EngineUnavailable
from blendserve.sim import run_virtual
from blendserve.util import jsonl as _jsonl

from tests.support.fake_engine import FakeEngine
from tests.support.running import run_coroutine

T = TypeVar("T")
DATA = Path(__file__).parents[2] / "fixtures" / "replay_small.jsonl"


def _request(question_id: str | None = "q-easy", n: int = 1, **kwargs: Any) -> GenerateRequest:
    prompt = kwargs.pop("prompt", "unused prompt")
    return GenerateRequest(prompt=prompt, n=n, question_id=question_id, **kwargs)


def test_lookup_by_id_then_by_prompt() -> None:
    engine = ReplayEngine(DATA, answer_kind="number")
    by_id = run_coroutine(engine.generate(_request("q-easy", n=3)))
    assert len(by_id) == 3 and all(s.upstream == "replay" for s in by_id)
    by_prompt = run_coroutine(engine.generate(_request(None, prompt="Which is it?")))
    assert extract(by_prompt[0].text, "number") in {"7", "8", None}
    chat = GenerateRequest(messages=[{"role": "user", "content": "What is 6 times 7?"}])
    assert run_coroutine(engine.generate(chat))


def test_unknown_question_is_a_protocol_error() -> None:
    with pytest.raises(EngineProtocolError, match="no recorded answers"):
        run_coroutine(ReplayEngine(DATA).generate(_request("nope")))


def test_draws_follow_the_recorded_frequencies_and_render_for_extraction() -> None:
    engine = ReplayEngine(DATA, seed=3, answer_kind="number")
    samples = run_coroutine(engine.generate(_request("q-split", n=4000)))
    counts = Counter(extract(s.text, "number") for s in samples)
    assert counts["7"] / 4000 == pytest.approx(0.6, abs=0.03)
    assert counts["8"] / 4000 == pytest.approx(0.3, abs=0.03)
    assert counts[None] / 4000 == pytest.approx(0.1, abs=0.02)
    truncated = [s for s in samples if extract(s.text, "number") is None]
    assert all(s.finish_reason == "length" for s in truncated)
    assert engine.stats.samples == 4000 and engine.stats.requests == 1


def test_a_request_seed_makes_its_draws_repeatable() -> None:
    engine = ReplayEngine(DATA)
    params = SamplingParams(seed=11)
    first = run_coroutine(engine.generate(_request("q-split", n=20, params=params)))
    again = run_coroutine(engine.generate(_request("q-split", n=20, params=params)))
    assert [s.text for s in first] == [s.text for s in again]


@pytest.mark.parametrize(
    "kind,pattern",
    [
        ("math", r"\\boxed\{42\}"),
        ("choice", r"Answer: \(42\)$"),
        ("number", r"the answer is 42\.$"),
        ("exact", r"^42$"),
        ("regex", r"\nAnswer: 42$"),
    ],
)
def test_rendering_per_answer_kind(kind: str, pattern: str) -> None:
    text, finish = render("42", kind)
    assert re.search(pattern, text) and finish == "stop"
    if kind in ("math", "number", "exact"):
        assert extract(text, kind) == "42"


def test_capacity_limits_sequences_in_flight() -> None:
    engine = ReplayEngine(DATA, latency=LatencyModel(fixed=0.01, max_concurrent_sequences=4))

    async def burst() -> None:
        await asyncio.gather(*(engine.generate(_request(n=2)) for _ in range(10)))

    run_coroutine(burst())
    assert engine.stats.max_sequences_in_flight == 4
    assert engine.stats.samples == 20 and engine.stats.sequences_in_flight == 0


def test_fault_rates_are_roughly_as_configured() -> None:
    engine = ReplayEngine(DATA, faults=FaultConfig(error_rate=0.2, drop_rate=0.1))
    outcomes: Counter[str] = Counter()

    async def many() -> None:
        for _ in range(2000):
            try:
                await engine.generate(_request())
                outcomes["ok"] += 1
            except EngineUnavailable as exc:
                outcomes["dropped" if "dropped" in str(exc) else "error"] += 1

    run_coroutine(many())
    assert outcomes["error"] / 2000 == pytest.approx(0.2, abs=0.03)
    assert outcomes["dropped"] / 2000 == pytest.approx(0.1, abs=0.03)
    assert engine.stats.samples == outcomes["ok"] and engine.stats.in_flight == 0


def test_injected_timeout_honours_the_deadline() -> None:
    engine = ReplayEngine(DATA, faults=FaultConfig(timeout_rate=1.0))
    with pytest.raises(EngineTimeout):
        run_coroutine(engine.generate(_request(timeout=0.01)))


def test_cancellation_releases_capacity() -> None:
    engine = ReplayEngine(DATA, latency=LatencyModel(fixed=60, max_concurrent_sequences=2))

    async def scenario() -> None:
        stuck = asyncio.ensure_future(engine.generate(_request(n=2)))
        while engine.stats.sequences_in_flight < 2:
            await asyncio.sleep(0)
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        fast = ReplayEngine(DATA)
        assert await fast.generate(_request())
        engine.latency = LatencyModel(max_concurrent_sequences=2)
        assert len(await engine.generate(_request(n=2))) == 2

    run_coroutine(scenario())
    assert engine.stats.in_flight == 0 and engine.stats.sequences_in_flight == 0


def test_bad_data(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "answers": ["1"]}\n{broken\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        ReplayEngine(bad)
    with pytest.raises(ValueError, match="'a' has no recorded samples"):
        ReplayEngine([{"id": "a", "answers": []}])
    with pytest.raises(ValueError, match=r"replay record 1: expected an object with a 'samples'"):
        ReplayEngine([{"id": "a", "answers": ["1"]}, {"id": "b"}])
    bad.write_text('{"id": "a", "samples": [{"answer": "1", "tokens": -3}]}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: samples\[0\]\.tokens: must be a count"):
        ReplayEngine(bad)


def test_capacity_serves_waiting_requests_in_arrival_order_and_skips_the_cancelled() -> None:
    engine = ReplayEngine(
        [{"id": "q", "answers": ["1"]}],
        latency=LatencyModel(fixed=1.0, max_concurrent_sequences=2),
    )
    started: list[str] = []

    async def request(name: str, n: int) -> None:
        await engine.generate(GenerateRequest(prompt="q", n=n, question_id="q"))
        started.append(name)

    async def main() -> None:
        first = asyncio.ensure_future(request("a", 2))
        await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(request(name, 1)) for name in "bcd"]
        await asyncio.sleep(0.5)
        waiting[0].cancel()  # b leaves the queue before its turn
        await asyncio.gather(first, *waiting[1:])

    _, elapsed = run_virtual(main())
    assert started == ["a", "c", "d"]
    assert elapsed == 2.0  # c and d ran together once a finished
    assert engine.stats.max_sequences_in_flight == 2


def test_renderings_write_their_own_format_and_share_one_batch() -> None:
    engine = ReplayEngine(
        [{"id": "q", "answers": ["42"]}],
        latency=LatencyModel(fixed=1.0, max_concurrent_sequences=2),
    )
    math, exact = engine.rendering("math"), engine.rendering("exact")
    texts: list[str] = []

    async def request(view: Engine) -> None:
        samples = await view.generate(GenerateRequest(prompt="q", n=2, question_id="q"))
        texts.extend(s.text for s in samples)

    async def main() -> None:
        await asyncio.gather(request(math), request(exact), request(engine))

    _, elapsed = run_virtual(main())
    assert elapsed == 3.0  # one request of two sequences at a time
    assert engine.stats.samples == 6 and engine.stats.max_sequences_in_flight == 2
    assert [extract(t, "math") for t in texts[:2]] == ["42", "42"]
    assert texts[2:4] == ["42", "42"]
    assert extract(texts[4], "number") == "42" and engine.answer_kind == "auto"


def test_only_engines_that_render_answers_are_told_the_format() -> None:
    engine = ReplayEngine(DATA)
    view = for_answers(engine, "choice")
    (sample,) = run_coroutine(view.generate(_request("q-easy")))
    assert re.search(r"Answer: \((41|42)\)$", sample.text) and view.sink is engine.sink
    other = FakeEngine({"q": [("1", 1.0)]})
    assert for_answers(other, "choice") is other


#: How a waiter's cancellation and a release of the slots it waits for meet in one
#: loop iteration: the waiter cancelled first or last, or granted the slots and then
#: cancelled before it ran again.
RACES = ("waiter-first", "release-first", "granted-then-cancelled")


async def _race(holder: asyncio.Future[Any], waiter: asyncio.Future[Any], order: str) -> None:
    """Cancels ``holder`` (which frees the slots) and ``waiter`` in ``order``; both end."""
    if order == "waiter-first":
        waiter.cancel()
        holder.cancel()
    elif order == "release-first":
        holder.cancel()  # its release runs first, the waiter's own step after it
        waiter.cancel()
    else:
        holder.cancel()
        # After the holder's step (which hands the waiter the slots), before the waiter's.
        asyncio.get_running_loop().call_soon(waiter.cancel)
    ended = await asyncio.gather(holder, waiter, return_exceptions=True)
    assert [type(e) for e in ended] == [asyncio.CancelledError] * 2, ended


_STEPS = StepCost(base_ms=10.0, per_sequence_ms=1.0, per_sequence_context_ms=0.0)
#: Per batching model: a latency that keeps its sequences running, and one that frees them.
_BATCHINGS = {
    "waves": (LatencyModel(fixed=3600, max_concurrent_sequences=3),
              LatencyModel(max_concurrent_sequences=3)),
    "continuous": (LatencyModel(step_cost=_STEPS, max_concurrent_sequences=3, length=(9.0, 0.0)),
                   LatencyModel(step_cost=_STEPS, max_concurrent_sequences=3)),
}  # fmt: skip


@pytest.mark.parametrize("batching", list(_BATCHINGS))
@pytest.mark.parametrize("order", RACES)
def test_a_waiter_cancelled_as_slots_free_loses_none_of_them(order: str, batching: str) -> None:
    slow, quick = _BATCHINGS[batching]
    engine = ReplayEngine(DATA, latency=slow)

    async def scenario() -> None:
        holder = asyncio.ensure_future(engine.generate(_request(n=3)))
        waiter = asyncio.ensure_future(engine.generate(_request(n=2)))
        while engine.load() != EngineLoad(3, running=3, waiting=2):
            await asyncio.sleep(0)
        await _race(holder, waiter, order)
        assert engine.load() == EngineLoad(3)
        engine.latency = quick
        samples = await asyncio.wait_for(engine.generate(_request(n=3)), 10.0)
        assert len(samples) == 3

    run_coroutine(scenario(), timeout=30.0)
    assert engine.stats.in_flight == 0 and engine.stats.sequences_in_flight == 0


def test_replay_data_is_read_within_a_line_and_a_file_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_jsonl, "LINE_BYTES", 64)
    monkeypatch.setattr(_jsonl, "FILE_BYTES", 4096)
    record = b'{"id": "a", "answers": ["1"]}\n'
    long = tmp_path / "long.jsonl"
    long.write_bytes(record + b'"' + b"x" * 64 + b'"\n')
    with pytest.raises(ValueError, match=r"long\.jsonl:2: a line longer than 64 bytes"):
        ReplayEngine(long)
    large = tmp_path / "large.jsonl"
    large.write_bytes(record * 200)
    with pytest.raises(ValueError, match=r"large\.jsonl: larger than 4,096 bytes"):
        ReplayEngine(large)
    # A pipe that never ends (its size unknown beforehand) is read up to the limit only.
    endless = tmp_path / "endless.jsonl"
    os.mkfifo(endless)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), endless.open("wb") as pipe:
            while True:
                pipe.write(record * 100)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with pytest.raises(ValueError, match=r"endless\.jsonl: larger than 4,096 bytes"):
        ReplayEngine(endless)
    writer.join(10)
    assert not writer.is_alive()


def test_a_replay_data_line_that_is_no_object_names_its_line(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"id": "a", "answers": ["1"]}\n\n[[["a"]]]\n')
    with pytest.raises(ValueError, match=r"data\.jsonl:3: not a JSON object"):
        ReplayEngine(data)
