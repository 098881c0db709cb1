"""The continuously batching engine model and the decode-step cost it is priced by.

Modelled time runs on the simulator's virtual clock: exact, and no real wait.
"""

import asyncio
import json
from pathlib import Path

import pytest
from blendserve.engines import GenerateRequest
from blendserve.engines.continuous import ContinuousBatch, first_step_ms
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.engines.step_cost import SHIPPED, StepCost, load_step_cost
from blendserve.sim.clock import run_virtual

#: 10 ms a step plus 1 ms a sequence, whatever the context: easy to add up.
FLAT = StepCost(base_ms=10.0, per_sequence_ms=1.0, per_sequence_context_ms=0.0)


async def _drain(batch: ContinuousBatch, prompt_tokens: int, lengths: list[int]) -> None:
    """Decodes the sequences until every one has ended."""
    async for _ in batch.ends(prompt_tokens, lengths):
        pass


def _ends_with_prompts(
    batch: ContinuousBatch, requests: list[tuple[float, int, list[int]]]
) -> list[float]:
    """When each request (its arrival, prompt tokens and samples' lengths) ends, in
    modelled seconds; each prompt its own, uncached."""

    async def one(i: int, at: float, prompt_tokens: int, lengths: list[int]) -> float:
        await asyncio.sleep(at)
        async for _ in batch.ends(prompt_tokens, lengths, f"prompt {i}"):
            pass
        return asyncio.get_running_loop().time()

    async def scenario() -> list[float]:
        return list(await asyncio.gather(*(one(i, *r) for i, r in enumerate(requests))))

    ends, _ = run_virtual(scenario())
    return ends


def _ends(batch: ContinuousBatch, requests: list[tuple[float, list[int]]]) -> list[float]:
    """When each request (its arrival, its samples' lengths) ends, in modelled seconds."""
    return _ends_with_prompts(batch, [(at, 0, lengths) for at, lengths in requests])


def test_a_lone_sequence_pays_a_step_a_token() -> None:
    assert _ends(ContinuousBatch(FLAT), [(0, [100])]) == pytest.approx([100 * 0.011])


def test_width_is_cheap_and_each_sample_ends_at_its_own_time() -> None:
    # Four samples of one request end when the longest does; alone, each would take 1.1 s.
    assert _ends(ContinuousBatch(FLAT), [(0, [100, 100, 100, 100])]) == pytest.approx([1.4])
    # A short sample leaves after 10 steps of two; the long one goes on alone, faster.
    short, long = _ends(ContinuousBatch(FLAT), [(0, [10]), (0, [100])])
    assert short == pytest.approx(10 * 0.012)
    assert long == pytest.approx(10 * 0.012 + 90 * 0.011)


def test_sequences_join_as_slots_free() -> None:
    first, second = _ends(ContinuousBatch(FLAT, capacity=1), [(0, [10]), (0, [10])])
    assert (first, second) == pytest.approx((0.11, 0.22))
    # Arriving mid-way, a sequence joins the running one at once where there is room.
    early, late = _ends(ContinuousBatch(FLAT, capacity=2), [(0, [100]), (0.055, [10])])
    assert late == pytest.approx(0.055 + 10 * 0.012)
    assert early == pytest.approx(0.055 + 10 * 0.012 + (100 - 5 - 10) * 0.011)


def test_a_cancelled_request_frees_its_slots_at_once() -> None:
    batch = ContinuousBatch(FLAT, capacity=1, scale=2.0)

    async def scenario() -> float:
        hog = asyncio.ensure_future(_drain(batch, 0, [1000]))
        queued = asyncio.ensure_future(_drain(batch, 0, [10]))
        await asyncio.sleep(0.1)
        assert batch.load().running == 1 and batch.load().waiting == 1
        hog.cancel()
        await queued
        return asyncio.get_running_loop().time()

    ended, _ = run_virtual(scenario())
    assert ended == pytest.approx(0.1 + 10 * 0.022)  # scale 2: 22 ms a step
    assert batch.load().running == batch.load().waiting == 0


def test_a_cancelled_waiting_request_gives_its_turn_to_the_next() -> None:
    batch = ContinuousBatch(FLAT, capacity=1)

    async def scenario() -> float:
        running = asyncio.ensure_future(_drain(batch, 0, [10]))
        given_up = asyncio.ensure_future(_drain(batch, 0, [1000]))
        queued = asyncio.ensure_future(_drain(batch, 0, [10]))
        await asyncio.sleep(0.05)
        assert batch.load().waiting == 2
        given_up.cancel()
        with pytest.raises(asyncio.CancelledError):
            await given_up
        assert batch.load().running == 1 and batch.load().waiting == 1
        await asyncio.gather(running, queued)
        return asyncio.get_running_loop().time()

    ended, _ = run_virtual(scenario())
    assert ended == pytest.approx(2 * 10 * 0.011)  # the cancelled one never ran
    assert batch.load().running == batch.load().waiting == 0


def test_context_makes_steps_longer() -> None:
    cost = StepCost(base_ms=10.0, per_sequence_ms=0.0, per_sequence_context_ms=0.001)
    (short_prompt,) = _ends(ContinuousBatch(cost), [(0, [10])])
    batch = ContinuousBatch(cost)

    async def long_prompt() -> float:
        await _drain(batch, 4000, [10])
        return asyncio.get_running_loop().time()

    ended, _ = run_virtual(long_prompt())
    assert short_prompt == pytest.approx(0.1, rel=0.01)
    assert ended == pytest.approx(10 * 0.014, rel=0.01)


def test_a_sequences_first_step_computes_its_prompt_less_the_cached_blocks() -> None:
    batch = ContinuousBatch(FLAT)

    async def request(prompt_tokens: int, n: int, prefix: str) -> float:
        started = asyncio.get_running_loop().time()
        async for _ in batch.ends(prompt_tokens, [10] * n, prefix):
            pass
        return asyncio.get_running_loop().time() - started

    async def scenario() -> list[float]:
        return [
            await request(100, 1, "a"),  # 100 prompt tokens in the first step, then 9 steps
            await request(100, 1, "a"),  # its 6 full blocks cached: 4 tokens left
            await request(40, 4, "b"),  # the first computes 40; its siblings 8 each
            await request(10, 4, "c"),  # shorter than a block: never cached
            await request(10, 4, "c"),
        ]

    took, _ = run_virtual(scenario())
    assert took == pytest.approx([
        0.010 + 0.100 + 9 * 0.011,
        0.010 + 0.004 + 9 * 0.011,
        0.010 + 0.064 + 9 * 0.014,
        0.010 + 0.040 + 9 * 0.014,
        0.010 + 0.040 + 9 * 0.014,
    ])  # fmt: skip
    assert first_step_ms(FLAT, 40, 4) == pytest.approx(10 + 64)  # as calibrate prices it


def test_a_prompt_joining_a_running_batch_slows_that_step_for_all() -> None:
    # A 90-token prompt joins a lone sequence after 5 of its steps: their next step
    # computes 91 tokens (101 ms), then both go on at 12 ms a step for 9, and the
    # first alone at 11 ms for its last 5.
    batch = ContinuousBatch(FLAT)
    running, joining = _ends_with_prompts(batch, [(0, 0, [20]), (0.055, 90, [10])])
    assert joining == pytest.approx(0.055 + 0.101 + 9 * 0.012)
    assert running == pytest.approx(joining + 5 * 0.011)


def test_a_fit_recovers_the_cost_it_was_made_from() -> None:
    truth = StepCost(6.0, 0.02, 1e-5, 2e-4)
    points = [
        {"batch": b, "ctx": c, "ms_median": truth.step_ms(b, c)}
        for b in (1, 8, 64, 256)
        for c in (512, 2048, 8192)
    ]
    fitted = StepCost.fit(points)
    assert fitted.worst_error(points) < 1e-6
    with pytest.raises(ValueError, match="at least 4 points"):
        StepCost.fit(points[:3])
    with pytest.raises(ValueError, match="point 0 lacks"):
        StepCost.fit([{"batch": 1}])


def test_a_fit_of_noisy_points_takes_no_negative_term() -> None:
    # A CPU engine calibrated at two contexts (vLLM's CPU build, measured): least squares
    # unbounded fit these with a negative base and attention term.
    measured = [(1, 44, 124), (2, 44, 244), (4, 43, 510), (8, 44, 902),
                (1, 163, 196), (2, 163, 253), (4, 162, 422), (8, 161, 847)]  # fmt: skip
    points = [{"batch": b, "ctx": c, "ms_median": ms} for b, c, ms in measured]
    fitted = StepCost.fit(points)
    terms = (fitted.base_ms, fitted.per_sequence_ms, fitted.per_sequence_context_ms,
             fitted.per_context_ms)  # fmt: skip
    assert min(terms) >= 0 and fitted.worst_error(points) < 0.2, fitted
    assert fitted.step_ms(1, 100) < fitted.step_ms(8, 100) < fitted.step_ms(8, 1000)


def test_profiles_by_shipped_name_or_file(tmp_path: Path) -> None:
    h100 = load_step_cost("qwen2.5-7b-h100")
    assert h100 is SHIPPED["qwen2.5-7b-h100"]
    # The H100's 7B shape: width nearly free up to a few dozen sequences, then about linear.
    one = h100.step_ms(1, 512)
    assert 6 < one < 7.5 and h100.step_ms(32, 512) < 1.25 * one
    assert 4 < h100.step_ms(1024, 512) / one < 7
    profile = tmp_path / "mine.jsonl"
    lines = [{"model": "m", "batch": b, "ctx": c, "ms_median": 5 + b * 0.1 + c * 0.001}
             for b in (1, 4, 16) for c in (100, 1000)]  # fmt: skip
    profile.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    assert load_step_cost(profile, model="m").step_ms(16, 1000) == pytest.approx(7.6)
    with pytest.raises(ValueError, match="not a shipped profile"):
        load_step_cost(tmp_path / "missing.jsonl")
    profile.write_text("[1]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=":1: not a JSON object"):
        load_step_cost(profile)
    profile.write_text("\n" + "[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=":2: JSON nested too deep"):
        load_step_cost(profile)


def test_the_replay_engine_batches_continuously_on_a_profile() -> None:
    latency = LatencyModel(step_cost=FLAT, max_concurrent_sequences=8, length=(4.6, 0.0))
    engine = ReplayEngine([{"id": "q", "answers": ["1", "2"]}], latency=latency)

    async def scenario() -> tuple[list[int], float]:
        samples = await engine.generate(GenerateRequest(prompt="q", n=4, question_id="q"))
        return [s.completion_tokens for s in samples], asyncio.get_running_loop().time()

    (tokens, ended), _ = run_virtual(scenario())
    assert tokens == [99, 99, 99, 99]  # e^4.6, rounded
    assert ended == pytest.approx(99 * 0.014)
    assert engine.load().capacity == 8 and engine.load().running == 0
