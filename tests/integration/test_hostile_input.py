"""Hostile input a loopback probe found getting through: two ``Authorization`` headers, lone
surrogates, ``sampling.extra`` and unknown ``/v1`` fields re-sent with every upstream
request, stream types refused with ``q=0``, an overflowing chunk size and a
``stream_options.include_usage`` that is no boolean.

A real uvicorn server on loopback (the service's own connection protocol), over the
replay engine or the OpenAI engine in front of the fake upstream
(:mod:`blendserve.testing.fake_openai`, a real HTTP server that records what reaches it), and
the real ``blendserve solve`` command in a subprocess.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.replay import ReplayEngine
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer, serve_engine

from tests.support.errors import error_body

pytestmark = pytest.mark.slow

RECORDS = [{"id": "q", "prompt": "What is 6 times 7?", "answers": ["42"] * 4 + ["41"]}]
KEYS = ("key-one", "key-two")
MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]
SOLVE = {"questions": [{"id": "q", "prompt": "x"}], "budget": 3, "answer": {"kind": "number"}}
CHAT = {"model": "fake-model", "messages": MESSAGES, "blendserve": {"budget_per_question": 2}}
OFF = {"blendserve": {"enabled": False}}
#: The default bound on the JSON of the fields re-sent with every upstream request.
EXTRA_LIMIT = 64 << 10


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer(FakeState(name="up", answers=("42",), record=True)).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def upstream(fake: FakeServer) -> Iterator[LiveServer]:
    """The service in front of ``fake``."""
    with serve_engine(OpenAIEngine([fake.url])) as live:
        yield live


# --- two Authorization headers: refused whatever their order ----------------------------


@pytest.fixture(scope="module")
def guarded() -> Iterator[str]:
    with serve_engine(ReplayEngine(RECORDS, seed=1), api_keys=KEYS) as live:
        yield live.url


@pytest.mark.parametrize(
    "values",
    [
        ["Bearer key-one", "Bearer made-up"],
        ["Bearer made-up", "Bearer key-one"],
        ["Bearer key-one", "Bearer key-two"],
        ["Bearer key-one", "Bearer key-one"],
        ["Bearer made-up", "Bearer other"],
    ],
    ids=["good-bad", "bad-good", "two-good", "same-twice", "two-bad"],
)
@pytest.mark.parametrize("path", ["/solve", "/v1/chat/completions"])
def test_two_authorization_headers_are_refused_the_same_way_whatever_their_order(
    guarded: str, path: str, values: list[str]
) -> None:
    body = SOLVE if path == "/solve" else {**CHAT, "model": "replay"}
    headers = [("Authorization", value) for value in values]
    response = httpx.post(f"{guarded}{path}", json=body, headers=headers, timeout=30)
    error = error_body(response, 400)
    assert "Authorization" in error["message"] and "more than one" in error["message"]
    one = httpx.post(f"{guarded}{path}", json=body, headers=[headers[0]], timeout=30)
    assert one.status_code == (200 if values[0] == "Bearer key-one" else 401), one.text


# --- lone surrogates: a 422 naming the field, before anything reaches an engine ---------

#: (route, body with ``\ud800`` written as JSON writes it, the field named at fault)
SURROGATES = {
    "solve chat content": (
        "/solve",
        r'{"questions": [{"messages": [{"role": "user", "content": "a\ud800"}]}], "budget": 2}',
        "questions.0.messages.0.content",
    ),
    "solve prompt": (
        "/solve",
        r'{"questions": [{"prompt": "\ud800"}], "budget": 2}',
        "questions.0.prompt",
    ),
    "solve stop": (
        "/solve",
        r'{"questions": [{"prompt": "x"}], "budget": 2, "sampling": {"stop": "\udfff"}}',
        "sampling.stop",
    ),
    "solve extra": (
        "/solve",
        r'{"questions": [{"prompt": "x"}], "budget": 2,'
        r' "sampling": {"extra": {"logit_bias": {"\ud800": 1}}}}',
        "sampling.extra.logit_bias.\\ud800",  # the key at fault, as JSON escapes it
    ),
    "v1 completions prompt": (
        "/v1/completions",
        r'{"model": "fake-model", "prompt": "\ud800"}',
        "prompt",
    ),
    "v1 completions prompt list": (
        "/v1/completions",
        r'{"model": "fake-model", "prompt": ["a", "b\udc00c"]}',
        "prompt.1",
    ),
    "v1 completions passed through": (
        "/v1/completions",
        r'{"model": "fake-model", "prompt": "\ud800", "blendserve": {"enabled": false}}',
        "prompt",
    ),
    "v1 chat content": (
        "/v1/chat/completions",
        r'{"model": "fake-model", "messages": [{"role": "user", "content": "\ud800"}]}',
        "messages.0.content",
    ),
    "v1 unknown field": (
        "/v1/chat/completions",
        r'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}],'
        r' "foo": ["\ud800"]}',
        "foo.0",
    ),
}


@pytest.mark.parametrize("case", SURROGATES)
def test_a_lone_surrogate_is_a_422_naming_the_field_and_nothing_goes_upstream(
    fake: FakeServer, upstream: LiveServer, case: str
) -> None:
    path, raw, param = SURROGATES[case]
    started = time.monotonic()
    response = httpx.post(
        f"{upstream.url}{path}",
        content=raw.encode(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    error = error_body(response, 422)
    assert time.monotonic() - started < 2, "answered after engine retries"
    assert error["param"] == param
    assert "surrogate" in error["message"], error
    assert fake.state.requests == 0, "the request went upstream"
    fine = raw.replace(r"\ud800", "é").replace(r"\udfff", "é").replace(r"\udc00", "é")
    served = httpx.post(
        f"{upstream.url}{path}",
        content=fine.encode(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert served.status_code == 200, served.text


def test_a_lone_surrogate_never_reaches_the_upstream_tokenizer() -> None:
    fake = FakeServer(FakeState(name="up", tokenizer=True)).start()
    try:
        with serve_engine(OpenAIEngine([fake.url])) as live:
            raw = r'{"model": "fake-model", "prompt": "a\ud800"}'
            headers = {"Content-Type": "application/json"}
            refused = httpx.post(f"{live.url}/tokenize", content=raw, headers=headers)
            error = error_body(refused, 422)
            assert error["param"] == "prompt" and "surrogate" in error["message"]
            fine = httpx.post(f"{live.url}/tokenize", content=raw.replace(r"\ud800", "é"))
            assert fine.status_code == 200, fine.text
    finally:
        fake.kill()


@pytest.mark.parametrize(
    ("line", "lineno"),
    [
        (r'{"prompt": "a\ud800"}', 1),
        (r'{"messages": [{"role": "user", "content": "\udc00"}]}', 2),
        (r'"\ud800"', 2),
        (r'{"\ud800": "x", "prompt": "y"}', 2),
    ],
)
def test_the_solve_command_names_the_line_of_a_lone_surrogate(
    line: str, lineno: int, tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    first = "" if lineno == 1 else '{"prompt": "fine"}\n'
    questions.write_text(first + line + "\n")
    command = [sys.executable, "-m", "blendserve.cli", "solve", str(questions), "--budget", "4"]
    done = subprocess.run(
        [*command, "--url", "http://127.0.0.1:1"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    assert f"q.jsonl:{lineno}: " in lines[0] and "surrogate" in lines[0]


# --- sampling.extra and unknown /v1 fields: bounded, since every upstream request re-sends them


def _pad(size: int) -> str:
    return "x" * size


def test_a_large_sampling_extra_is_refused_before_anything_goes_upstream(
    fake: FakeServer, upstream: LiveServer
) -> None:
    questions = [{"id": str(i), "prompt": f"What is {i} + 1?"} for i in range(100)]
    body = {"questions": questions, "budget": 100, "sampling": {"extra": {"pad": _pad(100_000)}}}
    response = httpx.post(f"{upstream.url}/solve", json=body, timeout=30)
    error = error_body(response, 422)
    assert error["param"] == "sampling.extra"
    assert str(EXTRA_LIMIT) in error["message"], error
    assert fake.state.requests == 0, "the request went upstream"
    # At the limit: served, and sent with every upstream request.
    at_limit = {"pad": _pad(EXTRA_LIMIT - len('{"pad":""}'))}
    body = {**body, "questions": questions[:2], "budget": 2, "sampling": {"extra": at_limit}}
    served = httpx.post(f"{upstream.url}/solve", json=body, timeout=30)
    assert served.status_code == 200 and served.json()["status"] == "completed", served.text
    assert fake.state.bodies and all(b["pad"] == at_limit["pad"] for b in fake.state.bodies)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"model": "fake-model", "prompt": ["a", "b", "c"]}),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
    ],
    ids=["chat", "completions-batch", "chat-streamed"],
)
def test_a_large_unknown_v1_field_is_refused_naming_it(
    fake: FakeServer, upstream: LiveServer, path: str, body: dict[str, Any]
) -> None:
    padded = {**body, "small": 1, "guided_json": {"pad": _pad(100_000)}}
    response = httpx.post(f"{upstream.url}{path}", json=padded, timeout=30)
    error = error_body(response, 422)
    assert error["param"] == "guided_json"
    assert str(EXTRA_LIMIT) in error["message"], error
    assert fake.state.requests == 0, "the request went upstream"


def test_a_passed_through_request_is_sent_once_and_keeps_its_large_fields(
    fake: FakeServer, upstream: LiveServer
) -> None:
    body = {**CHAT, **OFF, "guided_json": {"pad": _pad(100_000)}}
    response = httpx.post(f"{upstream.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert fake.state.requests == 1
    assert fake.state.bodies[0]["guided_json"] == body["guided_json"]


def test_the_bound_is_a_setting(fake: FakeServer) -> None:
    with serve_engine(OpenAIEngine([fake.url]), max_extra_bytes=100) as live:
        body = {**CHAT, "logit_bias": {str(i): 1 for i in range(20)}}
        response = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=30)
        error = error_body(response, 422)
        assert error["param"] == "logit_bias" and "at most 100" in error["message"]
        solve = {**SOLVE, "sampling": {"extra": {"top_a": 0.5}}}
        assert httpx.post(f"{live.url}/solve", json=solve, timeout=30).status_code == 200
    assert fake.state.requests >= 1


# --- degraded: Accept with q=0, an overflowing chunk size, include_usage ------------------


@pytest.fixture(scope="module")
def replay() -> Iterator[LiveServer]:
    with serve_engine(ReplayEngine(RECORDS, seed=1)) as live:
        yield live


@pytest.mark.parametrize(
    ("accept", "media_type"),
    [
        ("text/event-stream;q=0, application/x-ndjson;q=0", "application/json"),
        ("application/x-ndjson;q=0", "application/json"),
        ("application/x-ndjson; q=0.0, text/event-stream;q=0", "application/json"),
        ("application/json, application/x-ndjson;q=0", "application/json"),
        ("text/event-stream;q=0, application/x-ndjson", "application/x-ndjson"),
        ("application/x-ndjson;q=0, text/event-stream", "text/event-stream"),
        ("application/x-ndjson;q=0.2, text/event-stream;q=0.9", "text/event-stream"),
        ("text/event-stream, application/x-ndjson", "application/x-ndjson"),
        ("Application/X-NDJSON", "application/x-ndjson"),
    ],
)
def test_a_stream_type_refused_with_q_0_is_not_streamed(
    replay: LiveServer, accept: str, media_type: str
) -> None:
    response = httpx.post(f"{replay.url}/solve", json=SOLVE, headers={"Accept": accept})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].split(";")[0] == media_type
    if media_type == "application/json":
        assert response.json()["status"] == "completed"


def _raw_request(url: str, request: bytes, timeout: float = 5.0) -> bytes:
    """What the server answers ``request`` with, up to its closing the connection."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize(
    "size",
    [b"F" * 16, b"1" + b"0" * 19, b"F" * 40, b"%x" % ((16 << 20) + 1024)],
    ids=["2^64-1", "16^19", "40 digits", "over-the-limit"],
)
@pytest.mark.parametrize("split", [False, True], ids=["one-write", "chunk-later"])
def test_an_overflowing_chunk_size_is_answered_at_once(
    replay: LiveServer, size: bytes, split: bool
) -> None:
    head = (
        b"POST /solve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    started = time.monotonic()
    port = int(replay.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        if split:
            time.sleep(0.2)  # the application is waiting for the body by now
        sock.sendall(size + b'\r\n{"questions": ')
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    status = received.split(b"\r\n", 1)[0].split(b" ")[1:2]
    assert status == ([b"400"] if len(size) > 20 else [b"413"]), received[:300]
    assert time.monotonic() - started < 3
    # The service goes on serving.
    assert httpx.post(f"{replay.url}/solve", json=SOLVE, timeout=30).status_code == 200


def test_a_chunked_body_within_the_limit_is_served(replay: LiveServer) -> None:
    body = json.dumps(SOLVE).encode()
    request = (
        b"POST /solve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + b"%x\r\n" % len(body[:10])
        + body[:10]
        + b"\r\n%x\r\n" % len(body[10:])
        + body[10:]
        + b"\r\n0\r\n\r\n"
    )
    received = _raw_request(replay.url, request)
    assert received.startswith(b"HTTP/1.1 200 OK"), received[:300]


@pytest.mark.parametrize("value", ["yes", "true", 1, 0, "no"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_include_usage_must_be_a_boolean(replay: LiveServer, path: str, value: object) -> None:
    asked: dict[str, Any] = {"model": "replay", "stream": True}
    asked |= {"messages": MESSAGES} if "chat" in path else {"prompt": "What is 6 times 7?"}
    body = {**asked, "stream_options": {"include_usage": value}}
    response = httpx.post(f"{replay.url}{path}", json=body, timeout=30)
    error = error_body(response, 422)
    assert error["param"] == "stream_options.include_usage"
    assert "boolean" in error["message"]
    usage = {**asked, "stream_options": {"include_usage": True}}
    streamed = httpx.post(f"{replay.url}{path}", json=usage, timeout=30)
    assert streamed.status_code == 200 and '"usage": {' in streamed.text, streamed.text
