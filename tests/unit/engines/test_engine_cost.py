"""EngineCost: a profile, refined by vLLM's own step-cost series; parse_cost reads them."""

from __future__ import annotations

import pytest
from blendserve.engines.engine_cost import MIN_STEPS, CostPoint, EngineCost
from blendserve.engines.openai._upstreams import parse_cost
from blendserve.engines.step_cost import SHIPPED, StepCost
from blendserve.stats import Stats

# A CPU engine: 60 ms a step plus 6 ms a sequence, whatever the context.
TRUE = StepCost(60.0, 6.0, 0.0, name="true")


class Counters:
    """vLLM's cumulative series of an engine whose steps cost what ``cost`` says, and its clock."""

    def __init__(self, cost: StepCost, prompt: int = 200, generation: int = 100) -> None:
        self.cost = cost
        self.prompt, self.generation = prompt, generation
        self.values: dict[str, float] = {}
        self.at = 1000.0  # monotonic seconds

    def run(
        self, batch: int, steps: int, computed: int = 0, prompt_ms: float | None = None
    ) -> dict[str, float]:
        """``steps`` decode steps of ``batch`` sequences (the first also computing ``computed``
        prompt tokens, ``prompt_ms`` each: None, a sequence's cost), ``batch`` requests then
        finishing; the series after them."""
        ctx = self.prompt + self.generation / 2
        per_prompt = self.cost.per_sequence_ms if prompt_ms is None else prompt_ms
        ms = steps * self.cost.step_ms(batch, ctx) + computed * per_prompt
        self.at += ms / 1000
        add = {
            "vllm:iteration_tokens_total_count": steps,
            "vllm:iteration_tokens_total_sum": steps * batch + computed,
            "vllm:generation_tokens_total": steps * batch,
            "vllm:request_prompt_tokens_sum": batch * self.prompt,
            "vllm:request_prompt_tokens_count": batch,
            "vllm:request_generation_tokens_sum": batch * self.generation,
            "vllm:request_generation_tokens_count": batch,
        }
        for key, value in add.items():
            self.values[key] = self.values.get(key, 0.0) + value
        return dict(self.values)


def observe(
    cost: EngineCost, counters: Counters, source: str = "a", busy_since: float | None = 0.0
) -> CostPoint | None:
    """One reading of ``counters`` now, the engine kept busy since ``busy_since``."""
    return cost.observe(source, dict(counters.values), counters.at, busy_since)


class Recorder(Stats):
    def __init__(self) -> None:
        self.reports: list[tuple[dict[int, float], int]] = []

    def engine_step_cost(self, seconds_by_width: dict[int, float], observations: int) -> None:
        self.reports.append((dict(seconds_by_width), observations))


def feed(cost: EngineCost, counters: Counters, widths: list[int], rounds: int = 3) -> None:
    observe(cost, counters)
    for _ in range(rounds):
        for width in widths:
            counters.run(width, 50)
            observe(cost, counters)


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
    observe(cost, counters)
    counters.run(2, MIN_STEPS - 1)
    assert observe(cost, counters) is None
    counters.run(2, 1)
    point = observe(cost, counters)  # the two readings merged
    assert point is not None and point.steps == MIN_STEPS and point.batch == 2
    assert point.ms == pytest.approx(TRUE.step_ms(2, 250))
    restarted = Counters(TRUE)
    restarted.run(4, 5)
    assert observe(cost, restarted) is None  # went down: restarted
    counters.run(4, 50)
    assert observe(cost, counters) is not None


def test_only_time_the_engine_was_kept_busy_counts() -> None:
    cost = EngineCost()
    counters = Counters(TRUE)
    observe(cost, counters)
    counters.run(4, 50)
    counters.at += 30.0  # idle half a minute, then busy again
    busy_since = counters.at
    counters.run(4, 50)
    assert observe(cost, counters, busy_since=busy_since) is None  # a break since the last
    counters.run(8, 50)
    assert observe(cost, counters, busy_since=None) is None  # idle now: nothing was kept
    counters.at += 0.5
    busy_since = counters.at
    counters.run(8, 50)
    assert observe(cost, counters, busy_since=busy_since) is None  # starts the next one
    counters.run(8, 50)
    point = observe(cost, counters, busy_since=busy_since)
    assert point is not None and point.ms == pytest.approx(TRUE.step_ms(8, 250))


def test_prompts_computed_in_a_step_are_priced_apart_from_its_sequences() -> None:
    """A job's first step computes its prompts, alone or beside decoding sequences, a prompt
    token here at a third of a sequence's cost: each step counts once, and the line is the
    engine's own for its decoding sequences."""
    cost = EngineCost()
    counters = Counters(TRUE)
    observe(cost, counters)
    for width, prompts in ((1, 30), (4, 120), (8, 240), (16, 480), (2, 300)):
        counters.run(0, 1, computed=prompts, prompt_ms=2.0)  # a job's prompts, engine idle
        counters.run(width, 40, computed=prompts, prompt_ms=2.0)  # another's, beside decoding
        observe(cost, counters)
    fit = cost.current
    assert fit is not None and fit.name == "live"
    for width in (1, 8, 32):
        assert fit.step_ms(width, 250) == pytest.approx(TRUE.step_ms(width, 250), rel=0.01)


def test_replicas_apart() -> None:
    cost = EngineCost()
    a, b = Counters(TRUE), Counters(TRUE)
    observe(cost, a, "a")
    observe(cost, b, "b")
    a.run(1, 50)
    b.run(16, 50)
    assert observe(cost, a, "a") is not None
    assert observe(cost, b, "b") is not None
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
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="m"} 3.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 15.0
vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 5.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 3.0
vllm:iteration_tokens_total_count{engine="1",model_name="m"} 4.0
vllm:iteration_tokens_total_sum_other 9.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
"""
    assert parse_cost(text) == {
        "vllm:iteration_tokens_total_sum": 20.0,
        "vllm:iteration_tokens_total_count": 7.0,
    }
    assert parse_cost('vllm:iteration_tokens_total_count{x="1"} one\n') == {}  # malformed
    assert parse_cost("vllm:iteration_tokens_total_count NaN\n") == {}


def test_the_context_is_of_the_requests_finished_since_the_first_reading() -> None:
    cost = EngineCost()
    counters = Counters(TRUE, prompt=30, generation=20)
    observe(cost, counters)
    running = dict(counters.run(4, 50))
    for name in [k for k in running if k.startswith("vllm:request_")]:
        running[name] = 0.0  # none finished yet: the context is not known from these
    cost.observe("a", running, counters.at, 0.0)
    counters.run(16, 50)
    observe(cost, counters)
    described = cost.describe()
    assert described is not None and described["context"] == 40  # 30 + 20 / 2


def test_values_no_counter_holds_leave_their_series_out() -> None:
    text = """\
vllm:iteration_tokens_total_count{engine="0"} 3.0
vllm:iteration_tokens_total_sum{engine="0"} 1.7e308
vllm:iteration_tokens_total_sum{engine="1"} 1.7e308
vllm:request_prompt_tokens_count 1e-300
vllm:request_prompt_tokens_sum -5
vllm:request_generation_tokens_count{engine="0"} 2
vllm:request_generation_tokens_count{engine="1"} +Inf
vllm:request_generation_tokens_sum 9007199254740993
vllm:generation_tokens_total 12
"""
    assert parse_cost(text) == {
        "vllm:iteration_tokens_total_count": 3.0,
        "vllm:generation_tokens_total": 12.0,
    }


def test_a_lying_reading_never_makes_the_context_absurd_and_learning_goes_on() -> None:
    """A one-off jump of the prompt tokens (a mean context of a hundred million tokens)
    starts over, as a restart does: the context stays plausible, and the readings after
    it are observed as before."""
    cost = EngineCost(TRUE)
    counters = Counters(TRUE, prompt=30, generation=20)
    feed(cost, counters, [4], rounds=1)
    counters.values["vllm:request_prompt_tokens_sum"] += 1e8
    counters.run(4, 50)
    assert observe(cost, counters) is None
    described = cost.describe()
    assert described is not None and described["context"] == 1024  # none finished since
    counters.run(4, 50)
    point = observe(cost, counters)
    assert point is not None and point.ms == pytest.approx(TRUE.step_ms(4, 40))
    described = cost.describe()
    assert described is not None and described["context"] == 40  # 30 + 20 / 2


def test_a_step_count_that_lies_makes_no_observation() -> None:
    cost = EngineCost()
    counters = Counters(TRUE)
    observe(cost, counters)
    counters.run(4, 50)
    counters.values["vllm:iteration_tokens_total_count"] += 1e12  # a million steps a ms
    assert observe(cost, counters) is None and not cost.points
    counters.run(4, 50)
    assert observe(cost, counters) is not None  # it starts the next one
