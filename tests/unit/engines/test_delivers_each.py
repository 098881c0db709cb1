"""Which engines hand each sample over as it ends (``delivers_each``), which a request's
samples together: a job plans fewer, larger waves only on the first kind."""

import asyncio
from typing import Literal

import pytest
from blendserve.engines.base import GenerateRequest
from blendserve.engines.embedded import EmbeddedEngine
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.engines.step_cost import StepCost
from blendserve.engines.vllm_inprocess import VLLMEngine
from blendserve.sim import run_virtual

from tests.support.fake_engine import FakeEngine
from tests.support.running import run_coroutine

COST = StepCost(base_ms=10.0, per_sequence_ms=0.0, per_sequence_context_ms=0.0)
RECORDS = [{"id": "q", "answers": ["7"]}]


@pytest.mark.parametrize("continuous", [True, False])
def test_the_replay_engine_delivers_each_sample_on_its_continuous_batch_alone(
    continuous: bool,
) -> None:
    latency = LatencyModel(fixed=1.0, length=(4.0, 1.0))
    if continuous:
        latency = LatencyModel(step_cost=COST, length=(4.0, 1.0))
    engine = ReplayEngine(RECORDS, latency=latency, seed=1)
    assert engine.delivers_each is continuous
    assert engine.rendering("exact").delivers_each is continuous  # the view forwards it

    async def ends() -> list[float]:
        loop = asyncio.get_running_loop()
        request = GenerateRequest(prompt="q", n=4, question_id="q")
        return [loop.time() async for _ in engine.stream(request)]

    times, _ = run_virtual(ends())
    assert (len(set(times)) > 1) is continuous  # as the flag says


@pytest.mark.parametrize(("n_support", "each"), [("auto", True), ("no", True), ("yes", False)])
def test_the_openai_engine_delivers_each_sample_unless_told_the_upstream_takes_n(
    n_support: Literal["auto", "yes", "no"], each: bool
) -> None:
    engine = OpenAIEngine(["http://a.test/v1"], n_support=n_support)
    assert engine.delivers_each is each
    run_coroutine(engine.aclose())


def test_vllm_in_process_delivers_each_the_embedded_server_and_the_default_do_not() -> None:
    assert VLLMEngine.delivers_each  # its DELTA outputs
    assert not EmbeddedEngine.delivers_each  # the default stream: generate's samples
    assert not FakeEngine({}).delivers_each
