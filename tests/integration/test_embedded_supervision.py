"""The embedded engine's child process dies: seen, said, failed fast, restarted.

The service runs for real on loopback over an :class:`EmbeddedEngine` whose
server is a stand-in child process (the fake OpenAI upstream, run as a
program), so that it can be killed, made to die by ``SIGILL`` as a llama.cpp
built for another CPU does, or kept from starting again.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from blendserve.engines.embedded import EmbeddedEngine, run_embedded
from blendserve.engines.llama_server import EmbeddedLlamaServer, ServerExit
from blendserve.errors import EngineUnavailable
from blendserve.service import Settings, create_app
from blendserve.stats import Stats
from blendserve.testing.live import KEYS, LiveServer
from blendserve.testing.waiting import wait_until

from tests.support.running import run_coroutine

ROOT = Path(__file__).resolve().parents[2]
QUESTION = {"messages": [{"role": "user", "content": "2+2?"}]}
SOLVE = {"questions": [QUESTION], "budget": 2, "answer": {"kind": "exact"}}


def stand_in(*args: str) -> list[str]:
    """The fake upstream as a child program, with ``args``."""
    return [sys.executable, "-m", "blendserve.testing.fake_openai", *args]


class Gate:
    """A server command that starts the stand-in while open, else a child that exits at once."""

    def __init__(self, *args: str) -> None:
        self.open = True
        self.args = args

    def __call__(self, port: int) -> Sequence[str]:
        if self.open:
            return stand_in("--port", str(port), *self.args)
        return [sys.executable, "-c", "raise SystemExit(3)"]


def _serve(server: EmbeddedLlamaServer) -> LiveServer:
    async def factory() -> EmbeddedEngine:
        return await run_embedded(server, timeout=30)

    settings = Settings(default_concurrency=2, group_wait_ms=0)
    return LiveServer(create_app(settings, engine_factory=factory, answer_keys=KEYS))


def _server(
    command: Callable[[int], Sequence[str]],
    *,
    restart_backoff: float = 1.0,
    max_restarts: int = 5,
    stable_s: float = 60.0,
) -> EmbeddedLlamaServer:
    return EmbeddedLlamaServer(
        Path("unused.gguf"),
        model_name="stand-in",
        command=command,
        restart_backoff=restart_backoff,
        max_restarts=max_restarts,
        stable_s=stable_s,
    )


@pytest.fixture(autouse=True)
def _checkout_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The stand-in imports tests.support from the checkout, whatever the working directory.
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    yield


def _health(url: str) -> httpx.Response:
    return httpx.get(f"{url}/health", timeout=10)


def test_a_killed_server_is_seen_failed_fast_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="blendserve.engines.llama_server")
    gate = Gate()
    server = _server(gate, restart_backoff=0.05, max_restarts=10)
    with _serve(server) as live:
        assert _health(live.url).json()["status"] == "ok"
        assert httpx.post(f"{live.url}/solve", json=SOLVE, timeout=30).json()["status"] == (
            "completed"
        )
        gate.open = False  # the restarts fail until the gate opens again
        assert server._process is not None
        os.kill(server._process.pid, signal.SIGKILL)
        wait_until(lambda: _health(live.url).status_code == 503, 5, "/health to turn 503")
        health = _health(live.url).json()
        assert health["status"] == "unavailable"
        assert "killed by SIGKILL" in health["detail"]

        solved = httpx.post(f"{live.url}/solve", json=SOLVE, timeout=30)
        assert solved.status_code == 503
        assert "killed by SIGKILL" in solved.json()["error"]["message"]
        chat = {"model": "stand-in", **QUESTION}
        completed = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=30)
        assert completed.status_code == 503
        assert "SIGKILL" in completed.json()["error"]["message"]

        gate.open = True
        wait_until(lambda: _health(live.url).status_code == 200, 30, "the server to come back")
        assert _health(live.url).json()["detail"] is None
        again = httpx.post(f"{live.url}/solve", json=SOLVE, timeout=30).json()
        assert again["status"] == "completed" and again["budget"]["spent"] == 2
    assert server.launches >= 3  # the first, a failed restart or more, the one that came back
    assert "restarting the embedded llama.cpp server" in caplog.text
    assert "is back on port" in caplog.text


def test_health_shows_the_servers_slots_and_the_profile_it_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``serve`` with no engine setting: the embedded default, built as ``serve`` builds it
    (the stand-in started in place of llama.cpp), says what it knows in ``/health``."""
    server = _server(Gate())

    async def embedded(*, sink: Stats, **settings: object) -> EmbeddedEngine:
        return await run_embedded(server, timeout=30, sink=sink)

    monkeypatch.setattr("blendserve.engines.embedded.create_embedded_engine", embedded)
    settings = Settings(engine_profile="qwen2.5-7b-h100", default_concurrency=2, group_wait_ms=0)
    with LiveServer(create_app(settings, answer_keys=KEYS)) as live:
        health = _health(live.url).json()
        solved = httpx.post(f"{live.url}/solve", json=SOLVE, timeout=30).json()
    assert health["engine"] == "embedded" and health["status"] == "ok"
    assert health["capacity"] == server.slots == 1
    assert health["cost"]["profile"] == "qwen2.5-7b-h100"
    assert health["cost"]["step_ms"]["1"] > 0
    assert solved["status"] == "completed" and solved["budget"]["spent"] == 2
    assert not server.running


def test_a_server_dying_by_sigill_fails_its_job_at_once_and_names_the_fix() -> None:
    server = _server(
        lambda port: stand_in("--port", str(port), "--die-by", "SIGILL"),
        restart_backoff=0.05,
        max_restarts=1,
        stable_s=3600,
    )
    with _serve(server) as live:
        assert _health(live.url).status_code == 200  # it lists its model, as llama.cpp did
        result = httpx.post(f"{live.url}/solve", json=SOLVE, timeout=30).json()
        assert result["status"] == "failed"
        assert "killed by SIGILL" in result["error"] and "GGML_NATIVE=OFF" in result["error"]
        assert "times in a row" not in result["error"]  # not retried behind a breaker

        # Restarted once; the next request kills it again and the row is used up.
        wait_until(lambda: _health(live.url).status_code == 200, 30, "the restart")
        httpx.post(f"{live.url}/solve", json=SOLVE, timeout=30)
        wait_until(lambda: server.gave_up, 10, "the server to be given up")
        health = _health(live.url)
        assert health.status_code == 503
        assert "did not come back after 1 restarts" in health.json()["detail"]
        refused = httpx.post(f"{live.url}/solve", json=SOLVE, timeout=30)
        assert refused.status_code == 503 and "SIGILL" in refused.json()["error"]["message"]
    assert not server.running


def test_a_server_that_cannot_start_says_how_it_ended() -> None:
    server = _server(lambda port: [sys.executable, "-c", "print('bad model'); raise SystemExit(7)"])

    with pytest.raises(EngineUnavailable, match=r"exited with code 7(.|\n)*bad model"):
        run_coroutine(server.start())
    assert not server.running


@pytest.mark.parametrize(
    ("returncode", "said"),
    [
        (-signal.SIGILL, "killed by SIGILL (Illegal instruction): llama.cpp was built for"),
        (-signal.SIGKILL, "killed by SIGKILL (Killed): killed from outside"),
        (2, "exited with code 2"),
    ],
)
def test_an_exit_is_described_with_its_cause(returncode: int, said: str) -> None:
    ended = ServerExit(returncode, "line one\nggml: loading\n", 0.0)
    assert said in ended.describe()
    assert ended.describe().endswith("Its last lines: line one | ggml: loading")
