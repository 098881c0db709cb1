"""Bearer API keys: OpenAI's 401 on every route but ``/health`` (and ``/metrics`` unless asked).

A real uvicorn server on loopback over the replay engine, and the real
``blendserve serve`` command in a subprocess for the environment and file keys.
"""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from blendserve.engines.replay import ReplayEngine
from blendserve.testing.command import serve_command
from blendserve.testing.live import LiveServer, serve_engine

pytestmark = pytest.mark.slow

DATA = Path(__file__).parents[1] / "fixtures" / "replay_small.jsonl"
REPLAY = ("--engine", "replay", "--data", str(DATA))  # blendserve serve's arguments
RECORDS = [{"id": "q", "prompt": "What is 6 times 7?", "answers": ["42"] * 4 + ["41"]}]
KEYS = ("key-one", "key-two")
SOLVE = {"questions": [{"id": "q", "prompt": "x"}], "budget": 3, "answer": {"kind": "number"}}
CHAT = {
    "model": "replay",
    "messages": [{"role": "user", "content": "What is 6 times 7?"}],
    "blendserve": {"answer": "number", "budget_per_question": 3},
}
COMPLETION = {
    "model": "replay",
    "prompt": "What is 6 times 7?",
    "blendserve": {"answer": "number", "budget_per_question": 3},
}
# (method, path, JSON body): every route that asks for a key
GUARDED = [
    ("POST", "/solve", SOLVE),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", COMPLETION),
    ("GET", "/v1/models", None),
]


def _serve(**settings: Any) -> LiveServer:
    return serve_engine(ReplayEngine(RECORDS, seed=1), **settings)


@pytest.fixture(scope="module")
def guarded() -> Iterator[str]:
    with _serve(api_keys=KEYS) as live:
        yield live.url


def _call(url: str, method: str, path: str, body: Any, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=30)


def _assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert "API key" in error["message"]


def test_no_keys_leaves_every_route_open() -> None:
    with _serve() as live:
        for method, path, body in GUARDED:
            assert _call(live.url, method, path, body).status_code == 200, path
        assert httpx.get(f"{live.url}/metrics").status_code == 200
        assert httpx.get(f"{live.url}/health").status_code == 200


@pytest.mark.parametrize(("method", "path", "body"), GUARDED)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", "Bearer key-one-and-more", "Bearer", "Basic key-one", "key-one"],
)
def test_a_missing_or_wrong_key_is_refused(
    guarded: str, method: str, path: str, body: Any, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = httpx.request(method, f"{guarded}{path}", json=body, headers=headers)
    _assert_401(response)


@pytest.mark.parametrize(("method", "path", "body"), GUARDED)
def test_each_configured_key_opens_the_routes(
    guarded: str, method: str, path: str, body: Any
) -> None:
    for key in KEYS:
        response = _call(guarded, method, path, body, key)
        assert response.status_code == 200, response.text
    scheme_in_lower_case = {"Authorization": f"bearer {KEYS[0]}"}
    response = httpx.request(method, f"{guarded}{path}", json=body, headers=scheme_in_lower_case)
    assert response.status_code == 200, response.text


def test_solve_with_the_right_key_answers(guarded: str) -> None:
    result = _call(guarded, "POST", "/solve", SOLVE, KEYS[1]).json()
    assert result["status"] == "completed" and result["answers"][0]["samples"] == 3


def test_health_is_open_and_metrics_open_by_default(guarded: str) -> None:
    health = httpx.get(f"{guarded}/health")
    assert health.status_code == 200 and health.json()["engine"] == "replay"
    metrics = httpx.get(f"{guarded}/metrics")
    assert metrics.status_code == 200 and "blendserve_" in metrics.text


def test_metrics_auth_asks_for_a_key_on_metrics() -> None:
    with _serve(api_keys=KEYS, metrics_auth=True) as live:
        _assert_401(httpx.get(f"{live.url}/metrics"))
        _assert_401(httpx.get(f"{live.url}/metrics", headers={"Authorization": "Bearer no"}))
        ok = httpx.get(f"{live.url}/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"})
        assert ok.status_code == 200 and "blendserve_" in ok.text
        assert httpx.get(f"{live.url}/health").status_code == 200


def test_the_openai_client_raises_authentication_error_on_a_wrong_key(guarded: str) -> None:
    with openai.OpenAI(base_url=f"{guarded}/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as raised:
            client.chat.completions.create(
                model="replay",
                messages=CHAT["messages"],
                extra_body={"blendserve": CHAT["blendserve"]},
            )
        assert raised.value.status_code == 401
        assert raised.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client.models.list()


def test_the_openai_client_works_with_the_right_key(guarded: str) -> None:
    with openai.OpenAI(base_url=f"{guarded}/v1", api_key=KEYS[0], max_retries=0) as client:
        reply = client.chat.completions.create(
            model="replay",
            messages=CHAT["messages"],
            extra_body={"blendserve": CHAT["blendserve"]},
        )
        assert reply.choices[0].message.content
        assert [m.id for m in client.models.list()] == ["replay"]


# --- the real command ------------------------------------------------------------


def _solve_on(url: str, key: str | None) -> httpx.Response:
    body = {**SOLVE, "questions": [{"id": "q-easy", "prompt": "x"}]}
    return _call(url, "POST", "/solve", body, key)


def test_keys_from_the_environment() -> None:
    with serve_command(*REPLAY, env={"BLENDSERVE_API_KEYS": " env-a, env-b ,"}) as (url, _):
        _assert_401(_solve_on(url, None))
        _assert_401(_solve_on(url, "env-a, env-b"))
        assert _solve_on(url, "env-a").status_code == 200
        assert _solve_on(url, "env-b").json()["answers"][0]["answer"] == "42"
        _assert_401(_call(url, "GET", "/v1/models", None))
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/metrics").status_code == 200


def test_keys_from_a_file_and_the_environment_together(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("\n  file-a  \n\nfile-b\n")
    env = {"BLENDSERVE_API_KEYS": "env-a"}
    with serve_command(*REPLAY, "--api-key-file", str(keys), "--metrics-auth", env=env) as (url, _):
        _assert_401(_solve_on(url, None))
        _assert_401(_solve_on(url, "file-c"))
        for key in ("file-a", "file-b", "env-a"):
            assert _solve_on(url, key).status_code == 200, key
        _assert_401(httpx.get(f"{url}/metrics"))
        assert httpx.get(f"{url}/health").status_code == 200


@pytest.mark.parametrize("problem", ["missing", "directory", "empty", "binary"])
def test_an_unusable_key_file_is_one_line_and_exit_2(tmp_path: Path, problem: str) -> None:
    keys = tmp_path / "keys"
    if problem == "directory":
        keys.mkdir()
    elif problem == "empty":
        keys.write_text("\n  \n")
    elif problem == "binary":
        keys.write_bytes(b"\xff\xfe\x00key")
    done = subprocess.run(
        [sys.executable, "-m", "blendserve.cli", "serve", "--engine", "replay",
         "--data", str(DATA), "--port", "0", "--api-key-file", str(keys)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blendserve serve: error: api key file:")
    assert str(keys) in lines[0]
