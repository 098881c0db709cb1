"""A bad decode-step profile given to ``blendserve serve`` is one line and exit code 2.

``--engine-profile FILE`` (an upstream's cost model) is read before serving, as
``--replay-profile FILE`` is: the real command in a subprocess, on loopback, with a
fake upstream behind it.
"""

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from blendserve.testing.command import free_port, serve_command
from blendserve.testing.fake_openai import FakeServer, FakeState

DATA = Path(__file__).parents[1] / "fixtures" / "replay_small.jsonl"
GOOD = [
    {"batch": b, "ctx": c, "ms_median": 5 + b * 0.1 + c * 0.001}
    for b in (1, 4)
    for c in (100, 1000)
]
RANGE_MS = ":5: ms_median must be a number from 1e-06 to 60,000 ms, got"
RANGE_BATCH = ":5: batch must be an integer from 1 to 1,048,576, got"

#: Each bad file's bad fifth point after four good ones (or one line nested too deep),
#: and what the error line says of it after the file's name.
BAD = {
    "nested": (b"[" * 100_000, ":1: JSON nested too deep"),
    "nan": (b'{"batch": 1, "ctx": 10, "ms_median": "nan"}', f'{RANGE_MS} "nan"'),
    "nan-literal": (b'{"batch": 1, "ctx": NaN, "ms_median": 5}', ":5: ctx must be a number"),
    "inf": (b'{"batch": 1, "ctx": 10, "ms_median": "inf"}', f'{RANGE_MS} "inf"'),
    "negative": (b'{"batch": 1, "ctx": 10, "ms_median": -5}', f"{RANGE_MS} -5"),
    "zero-batch": (b'{"batch": 0, "ctx": 10, "ms_median": 5}', f"{RANGE_BATCH} 0"),
    "400-digit-batch": (
        b'{"batch": 1' + b"0" * 399 + b', "ctx": 10, "ms_median": 5}',
        f"{RANGE_BATCH} 1000",
    ),
    "1e308-ms": (b'{"batch": 1, "ctx": 10, "ms_median": 1e308}', f"{RANGE_MS} 1e+308"),
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeServer]:
    with FakeServer(FakeState(record=False)) as server:
        yield server


def _bad_file(tmp_path: Path, case: str) -> tuple[Path, str]:
    content, says = BAD[case]
    profile = tmp_path / "bad.jsonl"
    good = b"".join(json.dumps(p).encode() + b"\n" for p in GOOD)
    profile.write_bytes((content if case == "nested" else good + content) + b"\n")
    return profile, f"{profile}{says}"


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "blendserve.cli", "serve",
               "--host", "127.0.0.1", "--port", str(free_port()), *args]  # fmt: skip
    # A file that is let through serves for ever: the timeout fails the test.
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def _one_line(done: subprocess.CompletedProcess[str], starts: str, says: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), done.stderr
    assert says in lines[0] and len(lines[0]) < 300 + len(says), lines[0]


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_engine_profile_is_one_line_and_exit_2(
    case: str, upstream: FakeServer, tmp_path: Path
) -> None:
    profile, says = _bad_file(tmp_path, case)
    done = _serve("--upstreams", upstream.url, "--engine-profile", str(profile))
    _one_line(done, "blendserve serve: error: engine profile: ", says)
    assert upstream.state.requests == 0


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_replay_profile_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    profile, says = _bad_file(tmp_path, case)
    done = _serve("--engine", "replay", "--data", str(DATA), "--replay-profile", str(profile))
    _one_line(done, "blendserve serve: error: replay: ", says)


def test_a_good_engine_profile_is_served(upstream: FakeServer, tmp_path: Path) -> None:
    # The check reads the profile as the engine does: a good one passes it, and serves.
    profile = tmp_path / "good.jsonl"
    profile.write_text("".join(json.dumps(p) + "\n" for p in GOOD), encoding="utf-8")
    with serve_command("--upstreams", upstream.url, "--engine-profile", str(profile)) as (url, _):
        cost = httpx.get(f"{url}/health", timeout=10).json()["cost"]
    assert cost["profile"] == "good.jsonl" and cost["step_ms"], cost
