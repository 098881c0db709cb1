"""``blendserve serve --engine replay``: the real command in a subprocess, on loopback."""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from blendserve.testing.command import serve_command

pytestmark = pytest.mark.slow

DATA = Path(__file__).parents[1] / "fixtures" / "replay_small.jsonl"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve") / "stderr.log"
    with serve_command("--engine", "replay", "--data", str(DATA), stderr=log) as (url, _):
        yield url


def test_solve_on_the_replay_engine(service: str) -> None:
    body = {
        "questions": [{"id": "q-easy", "prompt": "x"}, {"id": "q-split", "prompt": "y"},
                      {"id": "q-letters", "prompt": "z"}],
        "budget": 60,
        "answer": {"kind": "number"},
    }  # fmt: skip
    result = httpx.post(f"{service}/solve", json=body, timeout=30).json()
    answers = {a["id"]: a for a in result["answers"]}
    assert answers["q-easy"]["answer"] == "42"
    assert answers["q-split"]["answer"] == "7"
    assert result["budget"] == {"total": 60, "spent": 60, "unspent": 0}
    assert answers["q-split"]["samples"] > sum(answers["q-split"]["votes"].values())  # nulls


def test_models_and_health(service: str) -> None:
    assert httpx.get(f"{service}/v1/models").json()["data"][0]["id"] == "replay"
    assert httpx.get(f"{service}/health").json()["engine"] == "replay"


def test_bad_settings_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "blendserve.cli", "serve", "--port", "99999"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "port" in done.stderr
