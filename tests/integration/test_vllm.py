"""vLLM end to end, on its CPU build: as an upstream and in-process (the vLLM lane of CI).

One vLLM OpenAI server for the module (about a minute to start on 2 cores), and one
``blendserve serve --engine vllm``. vLLM's own ``/metrics`` is the measure: its request
counts and token counters against what blendserve reports.
"""

import ast
import asyncio
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from blendserve.core.signals import Confidence, ConfidenceSpec
from blendserve.core.traces import LOW_CONFIDENCE
from blendserve.engines import GenerateRequest, Sample, SamplingParams
from blendserve.engines.config import Timeouts
from blendserve.engines.openai import OpenAIEngine
from blendserve.service import Settings, create_app
from blendserve.testing.command import free_port
from blendserve.testing.live import LiveServer
from blendserve.testing.vllm import ENV, STARTUP_S, group_alive, start
from blendserve.testing.waiting import wait_until

from tests.integration.test_docs_examples import page_blocks, substitute
from tests.support.confidence import assert_read
from tests.support.running import run_coroutine
from tests.support.vllm import (
    MODEL,
    MODEL_DIR,
    ROOT,
    Sizes,
    gauge,
    measure_speed,
    require_vllm,
    vllm_metric,
    vllm_server,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

QUESTION = "What is 6 times 7? End with the final number."
LONG = "Write the numbers from 1 to 3000, one per line."
SHORT = "Write one short sentence about the sea."
RUNNING = "vllm:num_requests_running"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_vllm()
    with vllm_server(tmp_path_factory.mktemp("vllm") / "vllm.log") as url:
        yield url


@pytest.fixture(scope="module")
def sizes(upstream: str) -> Sizes:
    """The costly tests' sizes, from the speed the module's vLLM decodes at on this host."""
    chosen = Sizes.for_speed(measure_speed(upstream))
    print(chosen.describe())
    return chosen


@pytest.fixture(scope="module")
def service(upstream: str) -> Iterator[str]:
    """blendserve in front of the module's vLLM, reading its load (``--engine-capacity``)."""
    app = create_app(Settings(upstreams=(upstream,), engine_capacity=32, group_wait_ms=0))
    with LiveServer(app, timeout=60) as live:
        yield live.url


def _solve(url: str, question: str, **body: Any) -> dict[str, Any]:
    request = {
        "questions": [{"messages": [{"role": "user", "content": question}]}],
        "answer": {"kind": "number"},
        **body,
    }
    response = httpx.post(f"{url}/solve", json=request, timeout=300)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _readme_examples() -> list[tuple[str, str]]:
    """The README's three examples (curl ``/solve``, the OpenAI SDK, the client): tag, text."""
    readme = ROOT / "README.md"
    lines = readme.read_text(encoding="utf-8").splitlines()
    start = lines.index("## Three examples") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("## ")) + 1
    blocks = page_blocks(readme)
    return [(b.tag, b.text) for b in blocks if start < b.line < end and b.tag in {"bash", "python"}]


def _answers_readme_examples(url: str, workspace: Path) -> None:
    """Runs the README's examples as written (the service's address aside) against ``url``;
    checks the answers they print (the README's: 144 for 12 * 12, 42 for 6 * 7)."""
    outputs = []
    for i, (tag, text) in enumerate(_readme_examples()):
        script = substitute(text, url, {})
        if tag == "bash":
            argv = ["bash", "-o", "pipefail", "-c", script]
        else:
            (workspace / f"example_{i}.py").write_text(script, encoding="utf-8")
            argv = [sys.executable, f"example_{i}.py"]
        done = subprocess.run(argv, cwd=workspace, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{text}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        outputs.append(done.stdout)
    solved, sdk, client = outputs
    result = json.loads(solved)
    assert result["status"] == "completed" and result["budget"]["spent"] <= 8
    assert [a["answer"] for a in result["answers"]] == ["7", "144"], result["answers"]
    assert ast.literal_eval(sdk.splitlines()[1])["answer"] == "144", sdk
    assert client.splitlines()[0].startswith("42 "), client


def test_readme_examples_through_vllm_upstream(service: str, tmp_path: Path) -> None:
    _answers_readme_examples(service, tmp_path)


async def _leave_once_running(url: str, upstream: str) -> None:
    """A /v1 request (4 choices) of long samples whose client leaves once vLLM runs them."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "n": 4,
            "max_tokens": 1500, "temperature": 0.8}  # fmt: skip
    metrics = f"{upstream.removesuffix('/v1')}/metrics"
    async with httpx.AsyncClient(timeout=600) as client:
        reply = asyncio.ensure_future(client.post(f"{url}/v1/chat/completions", json=body))
        deadline = time.monotonic() + 300  # a first wave of a new width may compile first
        while gauge((await client.get(metrics)).text, RUNNING) == 0:
            assert not reply.done(), "answered before vLLM was seen running it"
            assert time.monotonic() < deadline, "vLLM did not run the first wave"
            await asyncio.sleep(0.1)  # a poll with a deadline
        reply.cancel()
        await asyncio.gather(reply, return_exceptions=True)


def test_compose_and_kubernetes_flags_are_vllms() -> None:
    python = require_vllm()
    import subprocess

    help_text = subprocess.run(
        [str(python), "-m", "vllm.entrypoints.openai.api_server", "--help=all"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    known = set(re.findall(r"(--[a-z0-9-]+)", help_text))
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    kubernetes = [
        doc
        for doc in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "vllm.yaml").read_text())
        if doc and doc["kind"] == "Deployment"
    ]
    arguments = [str(a) for a in compose["services"]["vllm"]["command"]]
    for deployment in kubernetes:
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            arguments += [str(a) for a in container.get("args", [])]
    flags = {a.split("=")[0] for a in arguments if a.startswith("--")}
    assert "--enable-prefix-caching" in flags
    assert flags <= known, flags - known


def test_health_and_models(service: str, upstream: str) -> None:
    health = httpx.get(f"{service}/health", timeout=10)
    assert health.status_code == 200
    assert health.json()["engine"] == "openai" and health.json()["upstreams"] == {upstream: True}
    assert health.json()["capacity"] == 32  # --engine-capacity
    models = httpx.get(f"{service}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_solve_usage_is_vllms(service: str, upstream: str) -> None:
    before = {n: vllm_metric(upstream, f"vllm:{n}") for n in ("prompt_tokens_total",
              "generation_tokens_total", "request_success_total")}  # fmt: skip
    # A lone question's 4 samples, none cut (plain self-consistency never settles early).
    result = _solve(service, QUESTION, budget=4, concurrency=4, policy="sc",
                    sampling={"temperature": 0.7, "max_tokens": 40})  # fmt: skip
    after = {n: vllm_metric(upstream, f"vllm:{n}") for n in before}
    assert result["status"] == "completed" and result["budget"]["spent"] == 4
    usage = result["usage"]
    assert usage["prompt_tokens"] == after["prompt_tokens_total"] - before["prompt_tokens_total"]
    assert usage["completion_tokens"] == (
        after["generation_tokens_total"] - before["generation_tokens_total"]
    )
    assert after["request_success_total"] - before["request_success_total"] == 4


def test_v1_n_samples(service: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "n": 4,
            "max_tokens": 40, "temperature": 0.7}  # fmt: skip
    reply = httpx.post(f"{service}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["choices"] and data["usage"]["completion_tokens"] > 0


def test_a_question_that_settles_leaves_nothing_running(service: str, upstream: str) -> None:
    finished = vllm_metric(upstream, "vllm:request_success_total")
    # Sample by sample, so that only the budget bounds it: a dissent or two among the samples
    # must not run a plan's rounds out before the question settles.
    result = _solve(service, "What is 2 plus 2? Answer with just the number.", budget=32,
                    concurrency=8, max_rounds=0,
                    sampling={"temperature": 0.3, "max_tokens": 200})  # fmt: skip
    (answer,) = result["answers"]
    assert answer["answer"] == "4" and answer["settled_early"], answer
    assert result["budget"]["spent"] < 32
    # Whatever was still sampling when it settled was aborted, not run out (200 tokens, about
    # 16 s): vLLM runs nothing once its scheduler has seen the aborts.
    wait_until(lambda: vllm_metric(upstream, RUNNING) == 0, 3, "vLLM to abort the samples")
    assert vllm_metric(upstream, "vllm:request_success_total") - finished >= answer["samples"]


def test_a_client_that_leaves_aborts_its_samples(service: str, upstream: str) -> None:
    asyncio.run(_leave_once_running(service, upstream))
    left = time.monotonic()
    # 1,500 tokens would hold vLLM for minutes: the samples were aborted.
    wait_until(lambda: vllm_metric(upstream, RUNNING) == 0, 15, "vLLM to abort the samples")
    print(f"vLLM ran nothing {time.monotonic() - left:.1f} s after the client left")


def test_prefix_caching_is_on(upstream: str) -> None:
    prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 20)
    hits = vllm_metric(upstream, "vllm:prefix_cache_hits_total")
    for _ in range(2):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        assert httpx.post(f"{upstream}/completions", json=body, timeout=120).status_code == 200
    assert vllm_metric(upstream, "vllm:prefix_cache_hits_total") - hits >= 128


#: The cost model learns from a counting question in a plain prompt (a short prefill),
#: about 30 tokens a sample. vLLM's CPU build on two cores makes about 10 tokens a second
#: whatever the width.
COST_QUESTIONS = [{"id": "c0", "prompt": "Count from 1 to 10, separated by commas:\n"}]
SAMPLING = {"temperature": 0.8, "max_tokens": 96, "stop": ["\n"]}
WIDTH = 8


@pytest.fixture(scope="module")
def calibrated(upstream: str, sizes: Sizes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``blendserve calibrate`` of the module's vLLM at widths 1, 4 and 8: the profile (5
    repetitions where the host is fast enough: with 3, a shared 2-core host's noise put a
    point 50% off its neighbours; 3 on a slow host, where a step is longer than the noise)."""
    from blendserve.cli import main

    out = tmp_path_factory.mktemp("cost") / "vllm-cpu.jsonl"
    argv = ["calibrate", "--upstream", upstream, "--out", str(out), "--widths", "1,4,8",
            "--contexts", "32,128", "--tokens", f"8,{sizes.calibration_tokens}",
            "--reps", str(sizes.calibration_reps)]  # fmt: skip
    assert main(argv) == 0
    return out


def _context_counters(upstream: str) -> tuple[float, float]:
    """vLLM's finished requests' prompt and generation tokens, each summed, and their count."""
    text = httpx.get(f"{upstream.removesuffix('/v1')}/metrics", timeout=10).text
    prompt = gauge(text, "vllm:request_prompt_tokens_sum")
    generation = gauge(text, "vllm:request_generation_tokens_sum")
    return prompt + generation / 2, gauge(text, "vllm:request_prompt_tokens_count")


@pytest.mark.timeout(1800)  # the first to ask pays for vLLM's start and the calibration
def test_the_cost_learnt_from_vllms_metrics_converges_to_the_calibration(
    upstream: str, calibrated: Path
) -> None:
    """A service with no profile learns vLLM's step cost from a few minutes of traffic at
    widths 1, 4 and 8, near what ``blendserve calibrate`` measured: within 50% at widths 1
    and 8, and no faster at 8 than at 1. On a shared 2-core host the two moved 17-28% apart in
    runs minutes apart (docs/benchmarks.md), so a closer bound would time the host."""
    from blendserve.engines.step_cost import load_step_cost

    app = create_app(Settings(upstreams=(upstream,), engine_capacity=32, group_wait_ms=0))
    before = _context_counters(upstream)
    with LiveServer(app, timeout=60) as live:
        for n in (1, 4, WIDTH, 1, 4, WIDTH):
            body = {"questions": COST_QUESTIONS, "budget_per_question": n, "policy": "sc",
                    "sampling": SAMPLING}  # fmt: skip
            assert httpx.post(f"{live.url}/solve", json=body, timeout=600).status_code == 200
        cost = httpx.get(f"{live.url}/health", timeout=10).json()["cost"]
    after = _context_counters(upstream)
    context = (after[0] - before[0]) / (after[1] - before[1])
    calibration = load_step_cost(calibrated)
    assert cost["profile"] is None and cost["fit"] is not None, cost
    errors = {
        width: cost["step_ms"][str(width)] / calibration.step_ms(width, cost["context"]) - 1
        for width in (1, WIDTH)
    }
    print(f"live {cost['step_ms']} at context {cost['context']} (vLLM's: {context:.0f}), "
          f"{cost['live_observations']} observations; against the calibration: "
          f"{errors}")  # fmt: skip
    assert abs(cost["context"] / context - 1) <= 0.25, (cost, context)
    # Width costs at least nothing; on a CPU where it is nearly free (AVX-512) the live fit
    # may find no width term at all.
    assert cost["step_ms"]["1"] <= cost["step_ms"]["8"], cost
    assert all(abs(e) <= 0.5 for e in errors.values()), (cost, errors)


@pytest.mark.timeout(1800)  # the first to ask pays for vLLM's start and the calibration
def test_the_calibrated_profile_predicts_a_jobs_wall_time_and_sc32s(
    upstream: str, calibrated: Path, sizes: Sizes
) -> None:
    """The replay engine on the calibration predicts the wall time of a job of the default
    policy and of SC@32 through blendserve in front of vLLM, both 8 samples in flight (each
    the fastest of three measures, of one on a slow host: :class:`Sizes`, on the
    calibration's fastest repetitions): each within a factor of 2, their ratio within 25%.

    On a shared 2-core host the engine's own speed moves by a third between the calibration
    and the jobs (predictions measured at 0.69-1.35x), so the lane checks the model's shape
    (a job's rounds, widths and prompts priced), not its accuracy: that is a benchmark's
    (``bench/engines/cost_model.py``; docs/benchmarks.md, "Predicted against measured").

    The counting prompts are shorter than a cache block, so every sample computes its
    prompt in its first step: on vLLM's CPU build about a decode step's cost a token,
    a quarter of these jobs' time, which the model prices."""
    from blendserve.testing.cost_model import compare

    found = compare(upstream, calibrated, width=WIDTH, runs=sizes.cost_runs)
    print(found.describe())
    assert 0.5 <= found.sc_predicted / found.sc_measured <= 2, found
    assert 0.5 <= found.default_predicted / found.default_measured <= 2, found
    assert abs(found.ratio_error) <= 0.25, found


def _in_flight(url: str) -> float:
    """The samples blendserve at ``url`` has asked of its engine and not yet received."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return gauge(text, "blendserve_in_flight_samples")


@pytest.fixture(scope="module")
def in_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``blendserve serve --engine vllm`` on vLLM's CPU defaults: its URL and process."""
    python = require_vllm()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("in-process") / "serve.log"
    command = [str(python), "-m", "blendserve.cli", "serve", "--host", "127.0.0.1",
               "--port", str(port), "--engine", "vllm", "--vllm-model", str(MODEL_DIR),
               "--model", MODEL]  # fmt: skip
    with start(command, log, f"{url}/health", cwd=ROOT) as process:
        yield url, process


#: A prompt longer than a step's token budget (vLLM's default 2,048 on the CPU): its
#: prefill is split over steps. Digits are a token each.
SPLIT_PREFILL = " ".join(str(i) for i in range(900)) + "\nWhat is the last number above?"


def test_in_process_engine_survives_a_callers_seed(
    in_process: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """vLLM's CPU build kills its engine core on a seeded request whose prefill is split
    (its generator has no offset to rewind): the in-process engine does not pass it the
    caller's seed there, so the service answers, and still does after."""
    url, _ = in_process
    result = _solve(url, SPLIT_PREFILL, budget=2, concurrency=2, policy="sc",
                    sampling={"temperature": 0.7, "max_tokens": 8, "seed": 7})  # fmt: skip
    assert result["status"] == "completed" and result["budget"]["spent"] == 2, result
    assert result["usage"]["prompt_tokens"] > 2 * 2048, result["usage"]  # split, each sample
    health = httpx.get(f"{url}/health", timeout=10)
    assert health.status_code == 200, health.text
    after = _solve(url, QUESTION, budget=2, concurrency=2, sampling={"max_tokens": 16, "seed": 7})
    assert after["status"] == "completed", after


def test_in_process_engine_serves_cancels_and_shuts_down(
    in_process: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    url, process = in_process
    health = httpx.get(f"{url}/health", timeout=10).json()
    assert health["engine"] == "vllm" and health["capacity"] == 128  # max_num_seqs on the CPU
    (model,) = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]]
    assert model == MODEL  # --model: the name the README's examples ask for
    result = _solve(url, QUESTION, budget=4, concurrency=4,
                    sampling={"temperature": 0.7, "max_tokens": 40})  # fmt: skip
    assert result["status"] == "completed" and result["budget"]["spent"] == 4
    assert result["usage"]["completion_tokens"] > 0
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "n": 2,
            "max_tokens": 40, "temperature": 0.7}  # fmt: skip
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    _answers_readme_examples(url, tmp_path)
    # A client that leaves: its samples are aborted in vLLM, and come back at once.
    body = {"model": model, "messages": [{"role": "user", "content": LONG}], "n": 4,
            "max_tokens": 1500, "temperature": 0.8}  # fmt: skip
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=15)
    wait_until(lambda: _in_flight(url) == 0, 10, "the samples to be aborted")
    # vLLM's own series, read in this process, taught the service what a step costs: the
    # long samples kept the engine busy across many readings (the short answers above
    # may each end between two).
    cost = httpx.get(f"{url}/health", timeout=10).json()["cost"]
    assert cost is not None and cost["live_observations"] > 0, cost
    # Shutdown releases the engine: its engine-core and worker processes exit too.
    process.terminate()
    assert process.wait(90) == 0
    wait_until(lambda: not group_alive(process), 30, "vLLM's processes to exit")


#: Run by the vLLM venv's python: the in-process engine's stream, then one left early,
#: then ``blendserve calibrate``'s measurement of it.
_STREAM = """
import asyncio, json, sys, time
from blendserve.engines.base import GenerateRequest, SamplingParams
from blendserve.engines.vllm_inprocess import VLLMEngine
from blendserve.engines.calibration import Grid, measure

def ask(text, n, **params):
    messages = [{"role": "user", "content": text}]
    return GenerateRequest(messages=messages, n=n, params=SamplingParams(**params))

async def main():
    engine = VLLMEngine({"model": sys.argv[1], "max_model_len": 2048})
    short = ask(sys.argv[2], 8, temperature=1.0, max_tokens=96, seed=3)
    lengths, times = [], []
    async for sample in engine.stream(short):
        lengths.append(sample.completion_tokens)
        times.append(time.monotonic())
    stream = engine.stream(ask(sys.argv[3], 4, temperature=0.8, max_tokens=1500))
    waiting = asyncio.ensure_future(anext(stream))
    while not engine._engine.get_num_unfinished_requests():
        await asyncio.sleep(0.05)
    waiting.cancel()  # the caller left
    await asyncio.gather(waiting, return_exceptions=True)
    running = engine._engine.get_num_unfinished_requests()
    spread = times[-1] - times[0]
    # The median of 3 a point: one timing alone is at the mercy of the host.
    grid = Grid(widths=(1, 4), contexts=(32, 128), tokens=(8, 24), reps=3)
    profile = [p.record(engine="vllm") for p in await measure(engine, grid)]
    result = {"lengths": lengths, "spread": spread, "running": running, "profile": profile}
    print("RESULT", json.dumps(result))
    await engine.aclose()

asyncio.run(main())
"""


def test_in_process_stream_hands_samples_over_as_they_end_aborts_the_rest_and_calibrates() -> None:
    python = require_vllm()
    done = subprocess.run(
        [str(python), "-c", _STREAM, str(MODEL_DIR), SHORT, LONG],
        capture_output=True, text=True, timeout=STARTUP_S, env={**os.environ, **ENV}, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    lengths = result["lengths"]
    # Decoded side by side, the samples come in the order of their lengths (give or take the
    # step each of vLLM's child requests was scheduled at), each as it ends: not all at once.
    assert len(lengths) == 8 and lengths[0] < lengths[-1], lengths
    assert all(b >= a - 2 for a, b in itertools.pairwise(lengths)), lengths
    assert result["spread"] > 0.1, result
    assert result["running"] == 0  # aborted at once, not run out
    # blendserve calibrate's measurement on the in-process engine: a profile that fits.
    from blendserve.engines.step_cost import StepCost

    profile = result["profile"]
    assert sorted((p["batch"], p["context"]) for p in profile) == [(1, 32), (1, 128), (4, 32),
                                                                    (4, 128)], profile  # fmt: skip
    fit = StepCost.fit(profile)
    # Within a factor of each point: on a CPU where width is nearly free (AVX-512), width 4
    # may measure no slower than width 1, so the fit's width term can be nil.
    assert all(0.5 <= fit.step_ms(p["batch"], p["ctx"]) / p["ms_median"] <= 2 for p in profile), (
        fit,
        profile,
    )


#: Confidence read from the top 5 logprobs, over windows of 16 tokens and blocks of 5: a
#: sample of :data:`CONFIDENCE_TOKENS` (its end-of-sequence ignored) is two whole windows
#: and ends in a short block. Two such samples a request: a few seconds on 2 cores.
CONFIDENCE = ConfidenceSpec(top_logprobs=5, window=16, tail=16, block=5)
CONFIDENCE_TOKENS = 32
COUNTING = "Count from 1 to 100, separated by commas:"
#: Two samples of it differ, so a choice read twice shows: counting can repeat itself exactly.
OPEN_ENDED = "Write a short story about a lighthouse keeper."


def _fixed_length(
    chat: bool, n: int, max_tokens: int, prompt: str = COUNTING, **kwargs: Any
) -> GenerateRequest:
    """``n`` samples of exactly ``max_tokens``, ``kwargs`` the request's other fields."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.8, extra={"ignore_eos": True})
    if chat:
        messages = [{"role": "user", "content": prompt}]
        return GenerateRequest(messages=messages, n=n, params=params, **kwargs)
    return GenerateRequest(prompt=prompt, n=n, params=params, **kwargs)


@pytest.mark.parametrize("streamed", [False, True], ids=["unstreamed", "streamed"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_each_sample_has_its_confidence_read_from_vllms_logprobs(
    upstream: str, chat: bool, streamed: bool
) -> None:
    """Through vLLM's OpenAI server, one request of ``n=2``: each sample's own logprobs."""
    request = _fixed_length(chat, 2, CONFIDENCE_TOKENS, OPEN_ENDED, confidence=CONFIDENCE)

    async def scenario() -> tuple[list[Sample], list[Sample]]:
        engine = OpenAIEngine([upstream], stream=streamed, timeouts=Timeouts(call=300))
        async with engine:
            return await engine.generate(request), await engine.generate(_fixed_length(chat, 1, 4))

    read, (plain,) = run_coroutine(scenario(), timeout=600)
    assert len(read) == 2
    for sample in read:
        assert sample.completion_tokens == CONFIDENCE_TOKENS, sample
        assert_read(sample.confidence, sample.completion_tokens, CONFIDENCE)
    assert read[0].text != read[1].text, read
    assert read[0].confidence != read[1].confidence  # not one choice's logprobs twice
    assert plain.completion_tokens == 4 and plain.confidence is None


#: Run by the vLLM venv's python: the in-process engine's samples, all at once
#: (``FINAL_ONLY``) and as each ends (``DELTA``), with a confidence spec, then without one,
#: then one that ends on a stop string.
_CONFIDENCE_SCRIPT = """
import asyncio, dataclasses, json, sys
from blendserve.core.signals import ConfidenceSpec
from blendserve.engines.base import GenerateRequest, SamplingParams
from blendserve.engines.vllm_inprocess import VLLMEngine

spec, tokens = ConfidenceSpec(**json.loads(sys.argv[3])), int(sys.argv[4])

def fixed_length(chat, n, max_tokens, **kwargs):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.8, extra={"ignore_eos": True})
    if chat:
        messages = [{"role": "user", "content": sys.argv[2]}]
        return GenerateRequest(messages=messages, n=n, params=params, **kwargs)
    return GenerateRequest(prompt=sys.argv[2], n=n, params=params, **kwargs)

def described(samples):
    return [{"text": s.text, "completion_tokens": s.completion_tokens,
             "finish_reason": s.finish_reason, "stop_reason": s.stop_reason,
             "confidence": s.confidence and dataclasses.asdict(s.confidence)} for s in samples]

async def main():
    engine = VLLMEngine({"model": sys.argv[1], "max_model_len": 2048})
    together = await engine.generate(fixed_length(True, 2, tokens, confidence=spec))
    each = [s async for s in engine.stream(fixed_length(False, 2, tokens, confidence=spec))]
    plain = await engine.generate(fixed_length(True, 1, 4))
    stop = GenerateRequest(prompt="1, 2, 3, 4,", confidence=spec,
                           params=SamplingParams(max_tokens=16, temperature=0.0, stop=(" 6",)))
    stopped = await engine.generate(stop)
    result = {"together": described(together), "each": described(each),
              "plain": described(plain), "stopped": described(stopped)}
    print("RESULT", json.dumps(result))
    await engine.aclose()

asyncio.run(main())
"""


def test_in_process_samples_have_their_confidence_and_stop_reason() -> None:
    python = require_vllm()
    done = subprocess.run(
        [str(python), "-c", _CONFIDENCE_SCRIPT, str(MODEL_DIR), OPEN_ENDED,
         json.dumps(dataclasses.asdict(CONFIDENCE)), str(CONFIDENCE_TOKENS)],
        capture_output=True, text=True, timeout=STARTUP_S, env={**os.environ, **ENV}, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    for kind in ("together", "each"):
        samples = result[kind]
        assert len(samples) == 2, result
        for sample in samples:
            assert sample["completion_tokens"] == CONFIDENCE_TOKENS, sample
            read = Confidence(
                **{**sample["confidence"], "groups": tuple(sample["confidence"]["groups"])}
            )
            assert_read(read, sample["completion_tokens"], CONFIDENCE)
        assert samples[0]["text"] != samples[1]["text"], samples
        assert samples[0]["confidence"] != samples[1]["confidence"], samples
    (plain,) = result["plain"]
    assert plain["completion_tokens"] == 4 and plain["confidence"] is None, plain
    (stopped,) = result["stopped"]
    # Greedy after "1, 2, 3, 4,": " 5, 6" stops at " 6" (vLLM reports the stop string).
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == " 6", stopped
    assert stopped["confidence"]["tokens"] == stopped["completion_tokens"], stopped


#: A cut trace's window: 16 tokens read from the top 5 logprobs.
CUT_SPEC = ConfidenceSpec(top_logprobs=5, window=16, tail=16, block=4)
#: What the cut trace would run to uncut: minutes on 2 cores.
CUT_MAX_TOKENS = 64 * CUT_SPEC.window


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_a_trace_below_the_bar_is_cut_mid_stream_and_leaves_vllm(upstream: str, chat: bool) -> None:
    """A bar above any window's confidence: the streamed trace is cut at its first full
    window, its response closed, and vLLM drops it: nothing runs, it is not among the
    requests vLLM finished (vLLM 0.32 counts a client's abort in no series), and it
    generated a sliver of its ``max_tokens``."""
    request = _fixed_length(chat, 1, CUT_MAX_TOKENS, confidence=CUT_SPEC, cut_below=1e9)
    series = ("vllm:generation_tokens_total", "vllm:request_success_total")
    before = {name: vllm_metric(upstream, name) for name in series}

    async def scenario() -> list[Sample]:
        async with OpenAIEngine([upstream], stream=True, timeouts=Timeouts(call=300)) as engine:
            return await engine.generate(request)

    started = time.monotonic()
    (sample,) = run_coroutine(scenario(), timeout=600)
    cut_s = time.monotonic() - started
    assert sample.finish_reason == LOW_CONFIDENCE, sample
    assert sample.completion_tokens == CUT_SPEC.window, sample
    assert sample.confidence is not None and sample.confidence.tokens == CUT_SPEC.window
    assert sample.prompt_tokens > 0  # counted by a one-token probe: the stream sent no usage
    left_s = wait_until(lambda: vllm_metric(upstream, RUNNING) == 0, 10, "vLLM to drop the trace")
    after = {name: vllm_metric(upstream, name) for name in series}
    generated, finished = (after[name] - before[name] for name in series)
    print(
        f"cut after {sample.completion_tokens} tokens in {cut_s:.2f} s; vLLM ran nothing "
        f"{left_s:.2f} s later, having generated {generated:.0f} of {CUT_MAX_TOKENS}"
    )
    assert finished == 1, finished  # the probe alone: the trace never finished
    assert generated < CUT_MAX_TOKENS / 4, generated


#: Run by the vLLM venv's python: a request of 2 whose bar every window is under, through
#: the in-process engine; then what the engine still runs.
_CUT_SCRIPT = """
import asyncio, json, sys, time
from blendserve.core.signals import ConfidenceSpec
from blendserve.engines.base import GenerateRequest, SamplingParams
from blendserve.engines.vllm_inprocess import VLLMEngine

async def main():
    engine = VLLMEngine({"model": sys.argv[1], "max_model_len": 2048})
    spec = ConfidenceSpec(**json.loads(sys.argv[3]))
    params = SamplingParams(max_tokens=int(sys.argv[4]), temperature=0.8,
                            extra={"ignore_eos": True})
    request = GenerateRequest(prompt=sys.argv[2], n=2, params=params, confidence=spec,
                              cut_below=1e9)
    started = time.monotonic()
    samples = await engine.generate(request)
    seconds = time.monotonic() - started
    await asyncio.sleep(0)  # the aborts sent as the singles ended
    running = engine._engine.get_num_unfinished_requests()
    result = {"samples": [[s.finish_reason, s.completion_tokens, s.confidence.tokens]
                          for s in samples], "seconds": seconds, "running": running}
    print("RESULT", json.dumps(result))
    await engine.aclose()

asyncio.run(main())
"""


def test_in_process_a_trace_below_the_bar_is_cut_and_aborted() -> None:
    python = require_vllm()
    done = subprocess.run(
        [str(python), "-c", _CUT_SCRIPT, str(MODEL_DIR), COUNTING,
         json.dumps(dataclasses.asdict(CUT_SPEC)), str(CUT_MAX_TOKENS)],
        capture_output=True, text=True, timeout=STARTUP_S, env={**os.environ, **ENV}, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    print(f"in-process: 2 traces cut in {result['seconds']:.2f} s")
    assert result["samples"] == [[LOW_CONFIDENCE, CUT_SPEC.window, CUT_SPEC.window]] * 2, result
    assert result["running"] == 0, result  # aborted, not run on to max_tokens
