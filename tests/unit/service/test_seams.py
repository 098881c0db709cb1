"""The service's shared seams: job specs from defaults plus options, keyers, admission."""

import asyncio
from pathlib import Path
from typing import Any

import pytest
from blendserve import answers
from blendserve.answers import make_keyer
from blendserve.engines.base import SamplingParams
from blendserve.engines.replay import ReplayEngine
from blendserve.errors import ServiceOverloaded
from blendserve.scheduler import Question
from blendserve.service.admission import admitted
from blendserve.service.disconnect import ClientGone
from blendserve.service.jobs import JobDefaults, JobMaker, JobOptions
from blendserve.service.limits import NO_SAMPLES, Admission, JobLimits

DATA = Path(__file__).parents[2] / "fixtures" / "replay_small.jsonl"
DEFAULTS = JobDefaults(concurrency=8, in_flight_per_question=0.25, request_timeout=3.0)
MAKER = JobMaker(ReplayEngine(DATA), DEFAULTS)


def test_a_job_takes_the_request_options_over_the_defaults() -> None:
    options = JobOptions(policy="asc", answer_kind="number", concurrency=2, settle_delta=0.1)
    spec = MAKER.job(options, [Question("a", prompt="?")], 5).spec
    assert (spec.policy.name, spec.settle_delta) == ("asc", 0.1)
    assert (spec.concurrency, spec.in_flight_per_question) == (2, 0.25)
    assert (spec.request_timeout, spec.failure_timeout, spec.budget) == (3.0, 5.0, 5)


def test_a_pool_shares_the_defaults_and_options() -> None:
    sampling = SamplingParams(temperature=0.5)
    options = JobOptions(answer_kind="math", sampling=sampling, model="m")
    pool = MAKER.pool(options, "p", budget_per_question=None, target=0.1, max_cap=32)
    spec = pool.spec
    assert (spec.target, spec.max_cap, spec.concurrency, spec.model) == (0.1, 32, 8, "m")
    assert spec.sampling is sampling and spec.request_timeout == 3.0


def test_jobs_and_pools_see_the_engine_in_their_answer_format() -> None:
    exact = MAKER.job(JobOptions(answer_kind="exact"), [Question("q-easy", prompt="?")], 3)
    pool = MAKER.pool(JobOptions(answer_kind="math"), "p", budget_per_question=3)

    async def first_texts() -> list[str]:
        request = Question("q-easy", prompt="?").request(1, 0, exact.spec)
        return [(await engine.generate(request))[0].text for engine in (exact.engine, pool.engine)]

    bare, boxed = asyncio.run(first_texts())
    assert bare in ("41", "42") and "\\boxed{" in boxed


def test_options_that_differ_do_not_share_a_key() -> None:
    assert JobOptions().key() == JobOptions().key()
    assert JobOptions().key() != JobOptions(model="m").key()


def test_a_keyer_keys_with_the_state_it_is_given() -> None:
    keys = answers.AnswerKeys()
    try:
        keyer = make_keyer("number", None, keys)
        assert asyncio.run(keyer("so the answer is 1,000")) == ("1,000", "1000")
        assert asyncio.run(make_keyer("choice", None)("The answer is (b)")) == ("B", "B")
    finally:
        keys.shutdown()


class _State:
    def __init__(self, max_jobs: int) -> None:
        self.limits = JobLimits(10, 100, 10.0, 1000)
        self.admission = Admission(max_jobs, 100)
        self.engine = ReplayEngine([{"id": "q", "answers": ["1"]}])  # up: admission asks


class _Request:
    """What admitted() reads of a request."""

    def __init__(self, state: _State, gone: bool = False) -> None:
        self.app: Any = type("App", (), {"state": type("State", (), {"service": state})()})()
        self._gone = gone

    async def is_disconnected(self) -> bool:
        return self._gone


def _prompts(count: int) -> dict[str, str]:
    return {f"questions.{i}.prompt": "?" for i in range(count)}


def test_admission_is_given_back_when_the_block_ends_however_it_ends() -> None:
    state = _State(max_jobs=1)

    async def scenario() -> None:
        async with admitted(_Request(state), _prompts(2), NO_SAMPLES, param="questions") as held:  # type: ignore[arg-type]
            assert (state.admission.jobs, state.admission.questions) == (1, 2)
            held.slot.answered()
            assert state.admission.questions == 1
            with pytest.raises(ServiceOverloaded):
                async with admitted(_Request(state), _prompts(1), NO_SAMPLES, param="questions"):  # type: ignore[arg-type]
                    pass
        assert (state.admission.jobs, state.admission.questions) == (0, 0)
        gone: list[bool] = []
        with pytest.raises(ClientGone):
            async with admitted(
                _Request(state, gone=True), _prompts(1), NO_SAMPLES, param="q"
            ) as held:  # type: ignore[arg-type]
                await held.wait(asyncio.sleep(5), on_gone=lambda: gone.append(True))
        assert gone == [True] and state.admission.jobs == 0

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_a_stream_holds_its_admission_past_the_block() -> None:
    state = _State(max_jobs=1)

    async def body() -> Any:
        yield "x"

    async def scenario() -> None:
        async with admitted(_Request(state), _prompts(1), NO_SAMPLES, param="q") as held:  # type: ignore[arg-type]
            held.stream(body())
        assert state.admission.jobs == 1

    asyncio.run(scenario())
