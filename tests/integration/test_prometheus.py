"""The dashboard's queries against a real Prometheus scraping a live blendserve.

Prometheus (Debian's package; ``.ci/run`` installs it) scrapes the service
and our fake OpenAI upstream (which exports vLLM's metric names) on loopback
while jobs run; then every PromQL expression of the shipped dashboard must
parse and return data. ``promtool`` checks the shipped Prometheus config.
"""

import json
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from blendserve.engines.config import RetryPolicy
from blendserve.engines.engine_cost import EngineCost
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.step_cost import SHIPPED
from blendserve.service import Settings, create_app
from blendserve.testing.command import PORT_TAKEN, free_port
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer
from blendserve.testing.waiting import wait_until

from tests.support.tools import require

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "blendserve-overview.json"
RATE_INTERVAL = "1m"  # what Grafana puts for $__rate_interval; wide enough for the whole test


def _binary(name: str) -> str:
    return require(name, "apt-get install prometheus (Debian's package)")


def _expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Prometheus on loopback; the test writes its targets into ``targets.json``."""
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: test\n    file_sd_configs:\n"
        f"      - files: ['{targets}']\n        refresh_interval: 1s\n"
    )
    for attempt in range(3):  # another process may take the free port before Prometheus does
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = tmp_path / "prometheus.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [
                    _binary("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            try:
                wait_until(partial(_up_or_exited, process, url), 30, "prometheus to start")
                if process.poll() is None:
                    yield url, targets
                    return
            finally:
                process.terminate()
                process.wait(20)
        if PORT_TAKEN not in log_path.read_text() or attempt == 2:
            raise AssertionError(f"prometheus exited:\n{log_path.read_text()}")


def _up_or_exited(process: subprocess.Popen[bytes], url: str) -> bool:
    return process.poll() is not None or _ready(url)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _query(url: str, expr: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body: dict[str, Any] = response.json()
    return body


def _scraped_after(url: str, moment: float) -> bool:
    result = _query(url, "timestamp(up)")["data"]["result"]
    return len(result) == 2 and all(float(r["value"][1]) > moment for r in result)


def test_every_dashboard_query_returns_data(prometheus: tuple[str, Path]) -> None:
    url, targets = prometheus
    upstream = FakeServer(FakeState(name="up", latency=0.05, fail_next=2)).start()

    async def factory() -> OpenAIEngine:
        engine = OpenAIEngine([upstream.url], retry=RetryPolicy(backoff_base=0.01))
        engine.cost = EngineCost(SHIPPED["qwen2.5-7b-h100"])  # --engine-profile's step gauges
        return engine

    try:
        with LiveServer(create_app(Settings(), engine_factory=factory)) as live:
            hosts = [live.url.removeprefix("http://"), f"127.0.0.1:{upstream.port}"]
            targets.write_text(json.dumps([{"targets": hosts}]))
            started = time.time()
            wait_until(lambda: _scraped_after(url, started), 30, "first scrapes")
            body = {
                "questions": [{"prompt": f"question {i}"} for i in range(4)],
                "budget": 48,
                "answer": {"kind": "exact"},
                "concurrency": 4,
            }
            solved = httpx.post(f"{live.url}/solve", json=body, timeout=60)
            assert solved.status_code == 200 and solved.json()["status"] == "completed"
            chat = {
                "model": "fake-model",
                "messages": [{"role": "user", "content": "hi"}],
                "blendserve": {"budget_per_question": 4, "answer": "exact"},
            }
            assert httpx.post(f"{live.url}/v1/chat/completions", json=chat).status_code == 200
            finished = time.time()
            wait_until(lambda: _scraped_after(url, finished + 2), 30, "scrapes after the jobs")
            # Queried while both targets are up: a gone target's gauges turn stale.
            empty = []
            for expr in _expressions():
                answer = _query(url, expr.replace("$__rate_interval", RATE_INTERVAL))
                assert answer["status"] == "success", (expr, answer)
                if not answer["data"]["result"]:
                    empty.append(expr)
    finally:
        upstream.stop()
    assert not empty, f"queries without data: {empty}"


def test_the_shipped_prometheus_config_is_valid() -> None:
    config = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    checked = subprocess.run(
        [_binary("promtool"), "check", "config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dashboard_follows_the_conventions() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "blendserve-overview" and "vllm" in dashboard["tags"]
    (variable,) = dashboard["templating"]["list"]
    assert variable["name"] == "datasource" and variable["type"] == "datasource"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert "rate(" not in target["expr"] or "[$__rate_interval]" in target["expr"]
    exprs = " ".join(_expressions())
    for name in (
        "samples_per_question",
        "answer_vote_share",
        "budget_unspent",
        "in_flight",
        "upstream_request_duration",
        "completion_tokens",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "engine_step_seconds",
    ):
        assert name in exprs, name
