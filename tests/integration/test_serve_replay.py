"""``blendserve serve --engine replay``: the real command in a subprocess, on loopback."""

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

DATA = Path(__file__).parents[1] / "fixtures" / "replay_small.jsonl"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "stderr.log"
    command = [sys.executable, "-m", "blendserve.cli", "serve", "--engine", "replay",
               "--data", str(DATA), "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    stderr = log.open("w")
    process = subprocess.Popen(command, stderr=stderr, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        stderr.close()


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
