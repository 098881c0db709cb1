"""Engines under abuse: an upstream ``/metrics`` of many label sets, cancellations that
race the replay engine's releases, and replay data too deep or too large to read.

The real service on loopback: in this process (:mod:`blendserve.testing.live`) where a test
looks inside, else the real ``blendserve serve`` command.
"""

import asyncio
import contextlib
import logging
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from blendserve.engines.openai import _upstreams
from blendserve.service import Settings, create_app
from blendserve.testing.command import serve_command
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer
from blendserve.util import jsonl as _jsonl

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is 6 * 7?"}]
#: vLLM's running gauge in 100,000 label sets: 3.7 MiB, under the cap on a ``/metrics`` body.
MANY_LABEL_SETS = "".join(f'vllm:num_requests_running{{x="{i}"}} 0\n' for i in range(100_000))


def _solve(questions: int, budget: int, **options: Any) -> dict[str, Any]:
    asked = [{"id": f"q{i}", "messages": MESSAGES} for i in range(questions)]
    return {"questions": asked, "budget": budget, "answer": {"kind": "number"}, **options}


# --- an upstream /metrics of many label sets --------------------------------------------


@pytest.fixture
def labelled() -> Iterator[FakeServer]:
    state = FakeState(name="labels", answers=("42",), record=False, extra_metrics=MANY_LABEL_SETS)
    server = FakeServer(state).start()
    try:
        yield server
    finally:
        server.kill()


def test_an_upstream_metrics_of_many_label_sets_is_parsed_off_the_loop_and_read_as_none(
    labelled: FakeServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It stalled the loop 2-4 s every half second: a 4-question /solve took 6-7 s."""
    on_a_loop: list[bool] = []
    parse_queue = _upstreams.parse_queue

    def recorded(text: str) -> tuple[int, int] | None:
        try:
            asyncio.get_running_loop()
            on_a_loop.append(True)
        except RuntimeError:
            on_a_loop.append(False)
        return parse_queue(text)

    monkeypatch.setattr(_upstreams, "parse_queue", recorded)
    caplog.set_level(logging.INFO, logger=_upstreams.__name__)
    config = Settings(
        upstreams=(labelled.url,), engine_capacity=32, default_concurrency=4, group_wait_ms=0
    )
    with LiveServer(create_app(config), connections=config.connection_timeouts()) as live:
        warm = httpx.post(f"{live.url}/solve", json=_solve(1, 1), timeout=60)
        assert warm.status_code == 200, warm.text
        started = time.monotonic()
        reply = httpx.post(f"{live.url}/solve", json=_solve(4, 16), timeout=60)
        took = time.monotonic() - started
        assert reply.status_code == 200 and reply.json()["status"] == "completed", reply.text
        assert took < 3.0, f"a 4-question /solve took {took:.2f} s"
        health = httpx.get(f"{live.url}/health", timeout=60)
        assert health.status_code == 200
    assert on_a_loop and not any(on_a_loop), "a /metrics reading was parsed on the event loop"
    said = [r for r in caplog.records if "label sets" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO], said  # logged once
    assert labelled.url.removesuffix("/v1") + "/metrics" in said[0].getMessage()
    assert labelled.state.metrics_requests == 1  # left alone since: no gauges there


# --- the replay engine's batch: cancellations racing releases ----------------------------


@pytest.mark.parametrize("leave", [False, True], ids=["finished", "client-left"])
def test_replay_capacity_survives_jobs_whose_samples_are_cancelled_as_others_end(
    leave: bool, tmp_path: Path
) -> None:
    """At --replay-capacity 3 a settled max_rounds-1 job lost slots: later ones hung for good."""
    data = tmp_path / "answers.jsonl"
    data.write_text("".join(f'{{"id": "q{i}", "answers": ["1", "2", "1"]}}\n' for i in range(4)))
    args = ["--engine", "replay", "--data", str(data), "--replay-capacity", "3"]
    with serve_command(*args) as (url, _):
        for _ in range(10):
            big = _solve(1, 1000, max_rounds=1)
            if leave:
                with contextlib.suppress(httpx.TimeoutException):  # it leaves mid-way
                    httpx.post(f"{url}/solve", json=big, timeout=0.02)
            else:
                done = httpx.post(f"{url}/solve", json=big, timeout=30)
                assert done.status_code == 200 and done.json()["status"] == "completed"
            later = httpx.post(f"{url}/solve", json=_solve(1, 1), timeout=10)
            assert later.status_code == 200 and later.json()["status"] == "completed", later.text


# --- replay data too deep or too large ---------------------------------------------------


def _two_gib() -> None:
    """A reader without a limit fails here instead of taking the machine's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000 + b"\n", "data.jsonl:1: JSON nested too deep"),
        (b'{"id": "q", "answers": ["1"]}\n[[[[1]]]]\n', "data.jsonl:2: not a JSON object"),
        (b"/dev/zero", "/dev/zero:1: a line longer than 16 MiB"),
        (b'{"id": "q", "answers": ["1"]}\n' + b" " * (17 << 20) + b"\n", "longer than 16 MiB"),
        (b"sparse", "larger than 256 MiB"),
    ],
    ids=["nested", "not-an-object", "dev-zero", "long-line", "large-file"],
)
def test_replay_data_too_deep_or_too_large_is_one_line_and_exit_2(
    content: bytes, says: str, tmp_path: Path
) -> None:
    data = tmp_path / "data.jsonl"
    if content == b"/dev/zero":
        data = Path("/dev/zero")
    elif content == b"sparse":
        with data.open("wb") as sparse:  # no disk taken: a hole
            sparse.truncate(_jsonl.FILE_BYTES + 1)
    else:
        data.write_bytes(content)
    command = [sys.executable, "-m", "blendserve.cli", "serve", "--port", "1"]
    done = subprocess.run(
        [*command, "--engine", "replay", "--data", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_two_gib,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blendserve serve: error: replay: "), lines
    assert says in lines[0]
