"""``/v1`` requests name a model of ``GET /v1/models``, else a 404 in OpenAI's shape.

Real uvicorn servers on loopback, over the replay engine (which serves ``replay``) and over a
fake OpenAI upstream (which serves ``fake-model``); ``allow_model_aliases`` accepts any name.
"""

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.replay import ReplayEngine
from blendserve.testing.fake_openai import FakeServer, FakeState
from blendserve.testing.live import LiveServer, serve_engine

RECORDS = [{"id": "three", "prompt": "Three?", "answers": ["3", "3", "4"]}]
MESSAGES: Any = [{"role": "user", "content": "Three?"}]
SC = {"blendserve": {"budget_per_question": 3}}
OFF = {"blendserve": {"enabled": False}}
UNKNOWN = "Qwen/Qwen2.5-7B-Instruct"
ROUTES = [
    ("/v1/chat/completions", {"messages": MESSAGES}),
    ("/v1/completions", {"prompt": "Three?"}),
]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with serve_engine(ReplayEngine(RECORDS, seed=2)) as live:
        yield live


@pytest.fixture
def upstream() -> Iterator[FakeServer]:
    with FakeServer(FakeState(name="up", answers=("3",))) as fake:
        yield fake


def _not_found(body: Any, model: str, served: str) -> None:
    """OpenAI's ``model_not_found`` error body, naming the model asked for and the one served."""
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert repr(model) in error["message"] and repr(served) in error["message"]


def test_models_lists_the_served_name(server: LiveServer) -> None:
    listed = httpx.get(f"{server.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in listed["data"]] == ["replay"]


@pytest.mark.parametrize("options", [SC, OFF, {**SC, "stream": True}], ids=["sc", "off", "stream"])
@pytest.mark.parametrize(("path", "body"), ROUTES, ids=["chat", "completions"])
def test_an_unknown_model_is_a_404_over_http(
    server: LiveServer, path: str, body: dict[str, Any], options: dict[str, Any]
) -> None:
    request = {"model": UNKNOWN, **body, **options}
    response = httpx.post(f"{server.url}{path}", json=request, timeout=30)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    _not_found(response.json(), UNKNOWN, "replay")


def test_an_unknown_model_is_not_found_for_the_openai_sdk(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as chat:
        client.chat.completions.create(model=UNKNOWN, messages=MESSAGES, extra_body=SC)
    with pytest.raises(openai.NotFoundError) as completion:
        client.completions.create(model="gpt-4o", prompt="Three?", stream=True, extra_body=SC)
    client.close()
    assert chat.value.code == completion.value.code == "model_not_found"
    assert chat.value.param == completion.value.param == "model"
    _not_found({"error": chat.value.body}, UNKNOWN, "replay")
    _not_found({"error": completion.value.body}, "gpt-4o", "replay")


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=["chat", "completions"])
def test_the_served_name_or_none_is_accepted(
    server: LiveServer, path: str, body: dict[str, Any]
) -> None:
    for named in ({"model": "replay"}, {}):
        response = httpx.post(f"{server.url}{path}", json={**named, **body, **SC}, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "replay"


def test_aliases_allowed_run_on_the_served_model() -> None:
    with serve_engine(ReplayEngine(RECORDS, seed=2), allow_model_aliases=True) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
        chat = client.chat.completions.create(model=UNKNOWN, messages=MESSAGES, extra_body=SC)
        completion = client.completions.create(model="gpt-4o", prompt="Three?", extra_body=OFF)
        client.close()
    assert chat.model == completion.model == "replay"
    assert chat.choices[0].message.content and completion.choices[0].text


def test_an_upstream_engine_serves_its_upstreams_models(upstream: FakeServer) -> None:
    with serve_engine(OpenAIEngine([upstream.url])) as live:
        listed = httpx.get(f"{live.url}/v1/models", timeout=10).json()
        for options in (SC, OFF):
            refused = httpx.post(
                f"{live.url}/v1/chat/completions",
                json={"model": UNKNOWN, "messages": MESSAGES, **options},
                timeout=30,
            )
            assert refused.status_code == 404
            _not_found(refused.json(), UNKNOWN, "fake-model")
        assert upstream.state.requests == 0  # refused before any upstream request
        body = {"model": "fake-model", "messages": MESSAGES, **SC}
        served = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=30)
    assert [m["id"] for m in listed["data"]] == ["fake-model"]
    assert served.status_code == 200 and served.json()["blendserve"]["answer"] == "3"
    assert {b["model"] for b in upstream.state.bodies} == {"fake-model"}


def test_an_alias_reaches_the_upstream_as_its_model(upstream: FakeServer) -> None:
    with serve_engine(OpenAIEngine([upstream.url]), allow_model_aliases=True) as live:
        for options in (SC, OFF):
            body = {"model": UNKNOWN, "messages": MESSAGES, **options}
            response = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=30)
            assert response.status_code == 200, response.text
    assert upstream.state.bodies and {b["model"] for b in upstream.state.bodies} == {"fake-model"}
