"""Phases of ``python -m bench.load.abuse`` for hostile input, against a ``blendserve serve``.

It starts the real command (``bench/load/abuse/server.py``) on loopback over a fake
upstream started in this process (:mod:`blendserve.testing.fake_openai`: a real HTTP
server that runs no model and records the bodies it receives), and measures:

* ``extra``: a ``/solve`` of 100 questions whose ``sampling.extra`` holds 2 MiB,
  and a voted ``/v1`` request with a 2 MiB field it does not declare. Every
  upstream request re-sends them: unbounded, the job made 100 upstream requests
  of about 2 MiB each (about 200 MiB in 2 s). Each must be refused (413 or 422)
  with nothing sent upstream; the same job with a small ``extra`` is the control.
* ``auth``: ``--api-keys`` set, voted ``/v1`` requests with two ``Authorization``
  headers, the valid key second after a made-up one (each was a fresh client,
  its pacing reset at will) and first before one. Each must be a 400 whatever
  the order, with nothing sent upstream; one header with the key is the control.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
from blendserve.testing.fake_openai import FakeServer, FakeState

from bench.load.abuse.server import serve

__all__ = ["PHASES"]

MIB = 1 << 20


def _upstream_bytes(bodies: list[dict[str, Any]]) -> int:
    """Bytes of the request bodies an upstream received, as compact UTF-8 JSON (as sent)."""
    return sum(
        len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()) for body in bodies
    )


def _send(
    url: str,
    body: dict[str, Any],
    fake: FakeServer,
    headers: list[tuple[str, str]] | None = None,
) -> tuple[int, float, int, int, str]:
    """Status, seconds, upstream requests and bytes of one request, and its error if any."""
    before = len(fake.state.bodies)
    started = time.monotonic()
    try:
        reply = httpx.post(url, json=body, headers=headers, timeout=300)
        status, text = reply.status_code, reply.text
    except httpx.HTTPError as exc:
        status, text = 0, f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - started
    sent = fake.state.bodies[before:]
    error = ""
    try:
        reply_body = json.loads(text)
    except ValueError:
        error = text[:100]
    else:
        if isinstance(reply_body, dict) and isinstance(reply_body.get("error"), dict):
            found = reply_body["error"]
            error = f"param {found.get('param')!r}: {found.get('message')!r}"[:160]
        elif isinstance(reply_body, dict) and "status" in reply_body:
            error = f"job {reply_body['status']}"
    return status, took, len(sent), _upstream_bytes(sent), error


def extra(questions: int = 100, extra_mib: float = 2.0) -> bool:
    """Large ``sampling.extra`` / unknown ``/v1`` fields: refused, nothing sent upstream."""
    fake = FakeServer(FakeState(name="extra", answers=("42",), record=True)).start()
    pad = "x" * int(extra_mib * MIB)
    asked = [{"id": f"q{i}", "prompt": f"What is {i} + 1?"} for i in range(questions)]
    solve = {"questions": asked, "budget": questions, "answer": {"kind": "number"}}
    chat = _chat()
    cases: dict[str, tuple[str, dict[str, Any]]] = {
        f"/solve, {questions} questions, sampling.extra {extra_mib:g} MiB": (
            "/solve",
            {**solve, "sampling": {"extra": {"pad": pad}}},
        ),
        f"/v1 voted, unknown field {extra_mib:g} MiB": (
            "/v1/chat/completions",
            {**chat, "pad": pad},
        ),
        f"control: /solve, {questions} questions, sampling.extra 1 KiB": (
            "/solve",
            {**solve, "sampling": {"extra": {"pad": "x" * 1024}}},
        ),
    }
    results: dict[str, tuple[int, float, int, int, str]] = {}
    try:
        with serve(["--upstreams", fake.url]) as served:
            for name, (route, body) in cases.items():
                results[name] = _send(f"{served.url}{route}", body, fake)
    finally:
        fake.kill()
    lines = [
        f"  {name}: {status} in {took:.2f} s, {requests} upstream requests, "
        f"{sent / MIB:.1f} MiB upstream{f' ({error})' if error else ''}"
        for name, (status, took, requests, sent, error) in results.items()
    ]
    print("extra: fields re-sent with every upstream request\n" + "\n".join(lines))
    *refused, control = results.values()
    nothing_sent = all(
        status in (413, 422) and requests == 0 for status, _, requests, _, _ in refused
    )
    return nothing_sent and control[0] == 200 and control[2] > 0


def _chat() -> dict[str, Any]:
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "What is 6 * 7?"}],
        "blendserve": {"answer": "number", "budget_per_question": 8},
    }


def auth(requests: int = 50) -> bool:
    """Two ``Authorization`` headers: a 400 in either order, nothing upstream; one: 200."""
    key = "key-good"
    fake = FakeServer(FakeState(name="auth", answers=("42",), record=True)).start()
    orders: dict[str, Callable[[int], list[tuple[str, str]]]] = {
        "made-up key, then the valid one": lambda i: [
            ("authorization", f"Bearer made-up-{i}"),
            ("authorization", f"Bearer {key}"),
        ],
        "valid key, then a made-up one": lambda i: [
            ("authorization", f"Bearer {key}"),
            ("authorization", f"Bearer made-up-{i}"),
        ],
        "control: the valid key once": lambda i: [("authorization", f"Bearer {key}")],
    }
    results: dict[str, list[tuple[int, float, int, int, str]]] = {}
    try:
        with serve(["--upstreams", fake.url, "--api-keys", key]) as served:
            url = f"{served.url}/v1/chat/completions"
            for name, headers in orders.items():
                results[name] = [_send(url, _chat(), fake, headers(i)) for i in range(requests)]
    finally:
        fake.kill()
    lines = []
    for name, sent in results.items():
        statuses = Counter(status for status, *_ in sent)
        upstream = sum(requests for _, _, requests, _, _ in sent)
        lines.append(
            f"  {name}: statuses {dict(statuses)}, {upstream} upstream requests, "
            f"max {max(took for _, took, *_ in sent) * 1000:.0f} ms ({sent[0][4]})"
        )
    print(f"auth: {requests} voted /v1 requests each, --api-keys set\n" + "\n".join(lines))
    *twice, once = results.values()
    refused = all(status == 400 and n == 0 for sent in twice for status, _, n, _, _ in sent)
    return refused and all(status == 200 for status, *_ in once)


PHASES: dict[str, Callable[[], bool]] = {"extra": extra, "auth": auth}
