"""What an upstream's ``/metrics`` says never fails ``/health``, on a real server.

``blendserve serve --upstreams URL --engine-profile ...`` reads the upstream's
vLLM step-cost series every load reading and shows what it learns in
``/health``. The manifests use ``/health`` for readiness and liveness, so a
lying upstream must not turn it into a 500: an absurd reading is ignored, and
the cost ``/health`` shows stays finite and plausible.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from blendserve.engines.engine_cost import MAX_CONTEXT, EngineCost
from blendserve.engines.step_cost import SHIPPED
from blendserve.testing.command import serve_command
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import serve_engine
from blendserve.testing.waiting import wait_until

from tests.support.fake_engine import FakeEngine

LABELS = '{model_name="fake-model"}'


def _series(**values: float | str) -> str:
    """vLLM's request-length series (and steps) with these values, as ``/metrics`` writes them."""
    return "".join(f"vllm:{name}{LABELS} {value}\n" for name, value in values.items())


# What a vLLM that served two requests of 150 prompt and 50 generation tokens says.
HONEST = _series(
    iteration_tokens_total_sum=500,
    iteration_tokens_total_count=100,
    generation_tokens_total=100,
    request_prompt_tokens_sum=300,
    request_prompt_tokens_count=2,
    request_generation_tokens_sum=100,
    request_generation_tokens_count=2,
)


def _lie(**values: float | str) -> str:
    series = {
        "iteration_tokens_total_sum": 500,
        "iteration_tokens_total_count": 100,
        "generation_tokens_total": 100,
        "request_prompt_tokens_count": 2,
        "request_generation_tokens_count": 2,
        **values,
    }
    return _series(**series)


LIES = {
    # Finite but huge: their mean context overflows to infinity.
    "huge sums": _lie(
        request_prompt_tokens_sum=1.7e308,
        request_prompt_tokens_count=3,
        request_generation_tokens_sum=1.7e308,
        request_generation_tokens_count=3,
    ),
    # Opposite huge sums: their context is not a number.
    "opposite huge sums": _lie(
        request_prompt_tokens_sum=1.7e308,
        request_prompt_tokens_count=3,
        request_generation_tokens_sum=-1.7e308,
        request_generation_tokens_count=3,
    ),
    # A count that is no count: a context of about 1e303 tokens.
    "count 1e-300": _lie(
        request_prompt_tokens_sum=1300,
        request_prompt_tokens_count=2 + 1e-300,
        request_generation_tokens_sum=100,
    ),
    # Sums past any real counter, one more request: a context of about 1e15 tokens.
    "sums past any counter": _lie(
        request_prompt_tokens_sum=1e15,
        request_prompt_tokens_count=3,
        request_generation_tokens_sum=100,
        request_generation_tokens_count=3,
    ),
    "inf and nan": _lie(
        request_prompt_tokens_sum="+Inf",
        request_prompt_tokens_count="NaN",
        request_generation_tokens_sum="-Inf",
    ),
}


def _health_failure(url: str) -> str | None:
    """What is wrong with ``GET`` and ``HEAD /health`` now (None: both 200, the cost
    plausible)."""
    head = httpx.head(f"{url}/health", timeout=10)
    got = httpx.get(f"{url}/health", timeout=10)
    if (head.status_code, got.status_code) != (200, 200):
        return f"HEAD {head.status_code}, GET {got.status_code}: {got.text[:200]}"
    cost = got.json()["cost"]
    if cost is None or cost["profile"] != "qwen2.5-7b-h100":
        return f"no profile's cost: {cost}"
    if not 0 <= cost["context"] <= MAX_CONTEXT:
        return f"an absurd context: {cost}"
    if not all(0 < ms < 1e6 for ms in cost["step_ms"].values()):
        return f"absurd step times: {cost}"
    return None


def _read(state: FakeState, url: str, readings: int, failures: dict[str, str], what: str) -> None:
    """Asks ``/health`` until the service has read the upstream's ``/metrics`` ``readings``
    more times (the load readings come every half second), noting its first failure."""
    until = state.metrics_requests + readings

    def read() -> bool:
        failure = _health_failure(url)
        if failure is not None:
            failures.setdefault(what, failure)
        return state.metrics_requests >= until

    wait_until(read, 30, f"{readings} readings of {what}")


def test_a_lying_upstream_metrics_never_fails_health(tmp_path: Path) -> None:
    """After a /solve (the load readings start with the first request), the upstream's
    series turn into each lie in turn, honest again between two."""
    state = FakeState(record=False, extra_metrics=HONEST)
    failures: dict[str, str] = {}
    with (
        FakeServer(state) as upstream,
        serve_command(
            "--upstreams",
            upstream.url,
            "--engine-profile",
            "qwen2.5-7b-h100",
            stderr=tmp_path / "serve.log",  # a file: a full pipe would stall the server
        ) as (url, _),
    ):
        body = {"questions": [{"id": "q", "prompt": "What is 2+2?"}], "budget": 2, "policy": "sc"}
        assert httpx.post(f"{url}/solve", json=body, timeout=60).status_code == 200
        _read(state, url, 2, failures, "the honest series")
        for lie, text in LIES.items():
            state.extra_metrics = text
            _read(state, url, 4, failures, lie)
            state.extra_metrics = HONEST
            _read(state, url, 2, failures, f"the honest series after {lie}")
    assert failures == {}


class _BrokenCost(EngineCost):
    """A cost whose description has a bug."""

    def describe(self) -> dict[str, object] | None:
        raise OverflowError("cannot convert float infinity to integer")


def test_a_bug_describing_the_cost_is_logged_once_and_never_fails_health(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine({})
    with serve_engine(engine) as live:
        engine.cost = _BrokenCost(SHIPPED["qwen2.5-7b-h100"])
        for _ in range(3):
            assert httpx.head(f"{live.url}/health", timeout=10).status_code == 200
            got = httpx.get(f"{live.url}/health", timeout=10)
            assert got.status_code == 200 and got.json()["cost"] is None, got.text
    logged = [r for r in caplog.records if "step cost" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
