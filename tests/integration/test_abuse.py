"""What a hostile client tries: slowloris, trickled bodies, endless bodies, streams it
never reads, patterns that explode, values that can never be sent upstream.

A real uvicorn server on loopback with the service's own connection protocol
(short deadlines here) over the replay engine, and real client sockets.
"""

import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from blendserve.engines.replay import LatencyModel, ReplayEngine
from blendserve.testing.live import LiveServer, serve_engine
from blendserve.testing.waiting import wait_until

pytestmark = pytest.mark.slow

RECORDS = [
    {"id": str(i), "prompt": f"What is {i} plus one?", "answers": [str(i + 1)] * 3 + ["0"]}
    for i in range(6)
]
DEADLINES = {"header_timeout_s": 0.5, "body_timeout_s": 1.0, "write_timeout_s": 1.0}


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    engine = ReplayEngine(RECORDS, seed=1, latency=LatencyModel(fixed=0.02))
    with serve_engine(engine, max_body_bytes=1 << 20, **DEADLINES) as server:
        yield server


def _connect(url: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf is not None:  # before connecting, so that the window stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    return sock


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Reads until the server closes the connection; False if it is still open after ``within``."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            break
        try:
            if not sock.recv(65536):
                return True
        except ConnectionError:
            return True
    return False


def _health_ms(url: str) -> float:
    start = time.monotonic()
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    return (time.monotonic() - start) * 1000


# --- slowloris: connections that never finish their request --------------------------


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(
    live: LiveServer,
) -> None:
    with _connect(live.url) as sock:
        start = time.monotonic()
        assert _closed_by_server(sock, 5), "an idle new connection stayed open"
        assert 0.4 < time.monotonic() - start < 3


def test_headers_trickled_byte_by_byte_are_cut_at_the_header_deadline(live: LiveServer) -> None:
    with _connect(live.url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        closed = False
        while not closed and time.monotonic() - start < 5:
            try:
                sock.sendall(b"X")  # never a complete header line
            except ConnectionError:
                break
            closed = _closed_by_server(sock, 0.1)
        assert time.monotonic() - start < 3, "a trickling client kept its connection"
        assert _health_ms(live.url) < 1000


def test_a_body_trickled_byte_by_byte_is_cut_at_the_body_deadline(live: LiveServer) -> None:
    with _connect(live.url) as sock:
        sock.sendall(
            b"POST /solve HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100000\r\n\r\n{"
        )
        start = time.monotonic()
        closed = False
        while not closed and time.monotonic() - start < 7:
            try:
                sock.sendall(b" ")
            except ConnectionError:
                break
            closed = _closed_by_server(sock, 0.1)
        assert 0.9 < time.monotonic() - start < 5, "a trickled body kept its connection"
    wait_until(lambda: live.service.admission.jobs == 0, 5, "no job to be running")


def test_a_kept_alive_connection_is_not_cut_between_requests(live: LiveServer) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with _connect(live.url) as sock:
        for _ in range(2):
            sock.sendall(request)
            assert b"200 OK" in sock.recv(65536)
            # idle for longer than the header deadline: keep-alive's own 75 s apply
            assert not _closed_by_server(sock, 0.8)


def test_a_chunked_body_over_the_limit_is_413_and_the_rest_is_never_read(
    live: LiveServer,
) -> None:
    chunk = b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16))
    sent = 0
    reply = b""
    with _connect(live.url) as sock:
        sock.sendall(
            b"POST /solve HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        sock.settimeout(5)
        try:
            while sent < 256 << 20:  # the server reading on and on
                sock.sendall(chunk)
                sent += len(chunk)
                ready, _, _ = select.select([sock], [], [], 0)
                if ready:
                    reply += sock.recv(65536)
        except ConnectionError:
            pass
        if not reply:
            reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:100]
    assert b"connection: close" in reply.lower()
    # 1 MiB accepted, then at most what the socket buffers took
    assert sent < 64 << 20, f"{sent >> 20} MiB sent before the server stopped reading"


# --- clients that never read their stream ----------------------------------------------


def test_a_stream_never_read_is_cut_and_frees_its_admission() -> None:
    engine = ReplayEngine(RECORDS, seed=2)
    settings: dict[str, Any] = {**DEADLINES, "max_queued_questions": 10_000}
    with serve_engine(engine, default_concurrency=64, **settings) as live:
        questions = [{"id": str(i % 6), "prompt": f"q{i}"} for i in range(10_000)]
        body = json.dumps(
            {"questions": questions, "budget": 10_000, "answer": {"kind": "number"}, "stream": True}
        ).encode()
        admission = live.service.admission
        with _connect(live.url, rcvbuf=4096) as sock:
            sock.sendall(
                b"POST /solve HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            wait_until(lambda: admission.jobs == 1, 10, "the job to start")
            # The whole question limit is held until the write deadline cuts the
            # client that reads nothing (before: for as long as the client stayed).
            assert admission.questions > 0
            wait_until(lambda: admission.jobs == 0, 10, "the stalled stream to be cut")
            assert admission.questions == 0
            assert _closed_by_server(sock, 5)
        response = httpx.post(
            f"{live.url}/solve",
            json={"questions": [{"id": "1", "prompt": "x"}], "budget": 2},
            timeout=10,
        )
        assert response.status_code == 200, response.text


def test_answered_questions_give_their_admission_back_while_the_job_runs() -> None:
    engine = ReplayEngine(RECORDS, seed=3, latency=LatencyModel(fixed=0.1))
    with serve_engine(engine, default_concurrency=1) as live:
        admission = live.service.admission
        body = {
            "questions": [{"id": str(i), "prompt": "x"} for i in range(6)],
            "budget": 6,
            "answer": {"kind": "number"},
            "stream": True,
        }
        held: list[int] = []
        with httpx.stream("POST", f"{live.url}/solve", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line == "event: answer":
                    held.append(admission.questions)
        assert len(held) == 6
        # each answer has given its question back before the next one is sent
        assert held[0] <= 5 and held[-1] <= 1, held
        wait_until(lambda: admission.jobs == 0, 5, "the job's slot given back")
        assert admission.questions == 0


# --- bad values refused at once ------------------------------------------------------


def test_a_regex_pattern_that_unrolls_huge_is_422_at_once(live: LiveServer) -> None:
    for pattern in ("(a{10000}){700}", "(a{1000000}){1000}"):
        start = time.monotonic()
        response = httpx.post(
            f"{live.url}/solve",
            json={
                "questions": [{"prompt": "x"}],
                "budget": 1,
                "answer": {"kind": "regex", "pattern": pattern},
            },
            timeout=30,
        )
        assert response.status_code == 422, response.text
        assert response.json()["error"]["param"] == "answer"
        assert "counted repeats" in response.json()["error"]["message"]
        assert time.monotonic() - start < 1
    ok = {
        "questions": [{"prompt": "x"}],
        "budget": 1,
        "answer": {"kind": "regex", "pattern": r"(\d{1,9})"},
    }
    assert httpx.post(f"{live.url}/solve", json=ok, timeout=30).status_code == 200


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ('{"n": 2}', "sampling.extra"),
        ('{"logit_bias": {"50256": NaN}}', "sampling.extra"),
        ('{"repetition_penalty": Infinity}', "sampling.extra"),
    ],
)
def test_extra_fields_that_can_never_be_sent_are_422_at_once(
    live: LiveServer, extra: str, param: str
) -> None:
    head = b'{"questions": [{"prompt": "x"}], "budget": 2, "sampling": {"extra": '
    body = head + extra.encode() + b"}}"
    start = time.monotonic()
    response = httpx.post(
        f"{live.url}/solve", content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == param
    assert time.monotonic() - start < 1


def test_a_nan_among_the_v1_fields_passed_upstream_is_422_at_once(live: LiveServer) -> None:
    body = (
        b'{"model": "replay", "messages": [{"role": "user", "content": "What is 1 plus one?"}],'
        b' "repetition_penalty": NaN}'
    )
    start = time.monotonic()
    response = httpx.post(
        f"{live.url}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "repetition_penalty"
    assert time.monotonic() - start < 1


@pytest.mark.parametrize("keys", [" , ", ","])
def test_an_api_key_list_without_a_key_refuses_to_start(keys: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "blendserve.cli", "serve", "--engine", "replay", "--port", "0"],
        env={"BLENDSERVE_API_KEYS": keys, "PYTHONPATH": ":".join(sys.path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "api_keys" in result.stderr and "no key" in result.stderr
