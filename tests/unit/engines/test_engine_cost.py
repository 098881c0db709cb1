"""EngineCost: a profile, refined by vLLM's own step-cost series; parse_cost reads them."""

from __future__ import annotations

import pytest
from blendserve.engines._upstreams import parse_cost
from blendserve.engines.engine_cost import MIN_STEPS, EngineCost
from blendserve.engines.step_cost import SHIPPED, StepCost
from blendserve.stats import Stats

# A CPU engine: 60 ms a step plus 6 ms a sequence, whatever the context.
TRUE = StepCost(60.0, 6.0, 0.0, name="true")


class Counters:
    """vLLM's cumulative series of an engine whose steps cost what ``cost`` says."""

    def __init__(self, cost: StepCost, prompt: int = 200, generation: int = 100) -> None:
        self.cost = cost
        self.prompt, self.generation = prompt, generation
        self.values: dict[str, float] = {}

    def run(self, batch: int, steps: int, name: str = "vllm:inter_token_latency_seconds") -> dict:
        """``steps`` decode steps of ``batch`` sequences, ``batch`` requests then finishing."""
        ms = self.cost.step_ms(batch, self.prompt + self.generation / 2)
        add = {
            f"{name}_sum": steps * batch * ms / 1000,
            f"{name}_count": steps * batch,
            "vllm:iteration_tokens_total_count": steps,
            "vllm:iteration_tokens_total_sum": steps * batch,
            "vllm:request_prompt_tokens_sum": batch * self.prompt,
            "vllm:request_prompt_tokens_count": batch,
            "vllm:request_generation_tokens_sum": batch * self.generation,
            "vllm:request_generation_tokens_count": batch,
        }
        for key, value in add.items():
            self.values[key] = self.values.get(key, 0.0) + value
        return dict(self.values)


class Recorder(Stats):
    def __init__(self) -> None:
        self.reports: list[tuple[dict[int, float], int]] = []

    def engine_step_cost(self, seconds_by_width: dict[int, float], observations: int) -> None:
        self.reports.append((dict(seconds_by_width), observations))


def feed(cost: EngineCost, counters: Counters, widths: list[int], rounds: int = 3) -> None:
    cost.observe("a", counters.run(1, 0))
    for _ in range(rounds):
        for width in widths:
            cost.observe("a", counters.run(width, 50))


def test_without_a_profile_the_traffic_alone_gives_the_engines_cost() -> None:
    cost = EngineCost()
    assert cost.current is None and cost.describe() is None
    feed(cost, Counters(TRUE), [1, 4, 16, 32])
    fit = cost.current
    assert fit is not None and fit.name == "live"
    for width in (1, 4, 16, 32, 64):
        assert fit.step_ms(width, 250) == pytest.approx(TRUE.step_ms(width, 250), rel=0.01)
    described = cost.describe()
    assert described is not None and described["context"] == 250
    assert described["live_observations"] == 12 and described["profile"] is None


def test_a_wrong_profile_gives_way_to_what_the_engine_measures() -> None:
    prior = SHIPPED["qwen2.5-7b-h100"]  # an H100: about 7 ms a step, not 60
    cost = EngineCost(prior)
    assert cost.current is prior
    feed(cost, Counters(TRUE), [1, 8, 32])
    fit = cost.current
    assert fit is not None and fit.name == "live"
    for width in (1, 8, 32):
        assert fit.step_ms(width, 250) == pytest.approx(TRUE.step_ms(width, 250), rel=0.01)


def test_one_width_scales_the_profile_to_the_engines_speed() -> None:
    prior = StepCost(6.0, 0.6, 0.0, name="slow-by-10")  # the right shape, 10x too fast
    cost = EngineCost(prior)
    feed(cost, Counters(TRUE), [4])
    fit = cost.current
    assert fit is not None and fit.name == "slow-by-10 x 10"
    assert fit.step_ms(256, 250) == pytest.approx(TRUE.step_ms(256, 250))


def test_one_width_alone_without_a_profile_fits_nothing() -> None:
    cost = EngineCost()
    feed(cost, Counters(TRUE), [8])
    assert cost.current is None
    described = cost.describe()
    assert described is not None and described["fit"] is None and described["live_observations"]


def test_too_few_steps_wait_for_the_next_reading_and_a_restart_starts_over() -> None:
    cost = EngineCost()
    counters = Counters(TRUE)
    cost.observe("a", counters.run(1, 0))
    assert cost.observe("a", counters.run(2, MIN_STEPS - 1)) is None
    point = cost.observe("a", counters.run(2, 1))  # the two readings merged
    assert point is not None and point.steps == MIN_STEPS and point.batch == 2
    assert point.ms == pytest.approx(TRUE.step_ms(2, 250))
    assert cost.observe("a", Counters(TRUE).run(4, 5)) is None  # went down: restarted
    assert cost.observe("a", counters.run(4, 50)) is not None


def test_older_vllm_names_and_replicas_apart() -> None:
    cost = EngineCost()
    a, b = Counters(TRUE), Counters(TRUE)
    name = "vllm:time_per_output_token_seconds"
    cost.observe("a", a.run(1, 0, name))
    cost.observe("b", b.run(1, 0, name))
    assert cost.observe("a", a.run(1, 50, name)) is not None
    assert cost.observe("b", b.run(16, 50, name)) is not None
    fit = cost.current
    assert fit is not None and fit.step_ms(16, 250) == pytest.approx(TRUE.step_ms(16, 250))


def test_the_sink_hears_the_step_times() -> None:
    sink = Recorder()
    cost = EngineCost(TRUE, sink=sink)
    assert sink.reports[-1][0][8] == pytest.approx(TRUE.step_ms(8, 1024) / 1000)
    feed(cost, Counters(TRUE), [1, 16])
    assert sink.reports[-1][1] == 6


def test_parse_cost_reads_vllms_histograms_summed_over_label_sets() -> None:
    text = """\
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 3.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 1.5
vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 0.5
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 30.0
vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 10.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 7.0
vllm:iteration_tokens_total_sum_other 9.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
"""
    assert parse_cost(text) == {
        "vllm:inter_token_latency_seconds_sum": 2.0,
        "vllm:inter_token_latency_seconds_count": 40.0,
        "vllm:iteration_tokens_total_count": 7.0,
    }
    assert parse_cost('vllm:iteration_tokens_total_count{x="1"} one\n') == {}  # malformed
    assert parse_cost("vllm:iteration_tokens_total_count NaN\n") == {}


def test_the_context_is_of_the_requests_finished_since_the_first_reading() -> None:
    cost = EngineCost()
    counters = Counters(TRUE, prompt=30, generation=20)
    cost.observe("a", counters.run(1, 0))
    running = dict(counters.run(4, 50))
    for name in [k for k in running if k.startswith("vllm:request_")]:
        running[name] = 0.0  # none finished yet: the context is not known from these
    cost.observe("a", running)
    cost.observe("a", counters.run(16, 50))
    described = cost.describe()
    assert described is not None and described["context"] == 40  # 30 + 20 / 2
