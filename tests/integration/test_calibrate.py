"""``blendserve calibrate`` against fake upstreams of known cost, and its errors.

The known-cost upstream (``FakeState.step_cost``) answers a request of ``n``
samples and ``max_tokens`` T after ``T * (a + n * c)`` seconds: a decode step
of width ``n`` costs ``a + n * c``, which the profile must recover.
"""

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from blendserve.cli import main
from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample
from blendserve.engines.calibration import CalibrationError, Grid, Point, describe, measure
from blendserve.engines.config import Timeouts
from blendserve.engines.factory import EngineConfig
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.step_cost import load_step_cost
from blendserve.errors import UpstreamRejected
from blendserve.testing.fake_openai import FakeServer, FakeState

from tests.support.running import run_coroutine

#: Seconds of a step, and more seconds for each sequence in it.
PER_STEP, PER_SEQUENCE = 0.004, 0.001
WIDTHS = (1, 4, 16)
GRID = ["--widths", "1,4,16", "--contexts", "64,256", "--tokens", "5,25", "--reps", "2"]


def step_s(width: int) -> float:
    """The known cost of one step of ``width`` sequences."""
    return PER_STEP + width * PER_SEQUENCE


@pytest.fixture
def known_cost() -> Iterator[FakeServer]:
    server = FakeServer(FakeState(step_cost=(PER_STEP, PER_SEQUENCE), record=False)).start()
    yield server
    server.stop()


def calibrate(url: str | None, out: Path, *flags: str) -> int:
    upstream = [] if url is None else ["--upstream", url]
    return main(["calibrate", *upstream, "--out", str(out), *flags])


def test_the_profile_recovers_a_known_step_cost(
    known_cost: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "profile.jsonl"
    assert calibrate(known_cost.url, out, *GRID) == 0
    captured = capsys.readouterr()
    points = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(p["batch"], p["context"]) for p in points] == [
        (w, c) for c in (64, 256) for w in WIDTHS
    ]
    for point in points:
        assert point["tokens"] == [5, 25] and point["reps"] == 2
        assert point["engine"] == f"openai {known_cost.url}" and point["model"] == "fake-model"
        assert point["ms_min"] <= point["ms_median"]
        # the prompt's tokens (as the fake counts them) plus the 15 tokens made on average
        assert point["context"] * 0.8 < point["ctx"] - 15 < point["context"] * 1.25
    fit = load_step_cost(out)
    for point in points:
        predicted = fit.step_ms(point["batch"], point["ctx"]) / 1000
        assert predicted == pytest.approx(step_s(point["batch"]), rel=0.25), point
    assert "calibrating openai" in captured.err
    assert "widths 1,4,16 x contexts 64,256" in captured.err
    assert captured.err.count("ms per step") == len(points)
    assert "base_ms" in captured.out and "worst error" in captured.out
    assert "context 256: 1:" in captured.out
    assert "first step with its prompt, priced against measured" in captured.out


def test_a_requests_own_time_is_recorded_apart_from_its_steps(tmp_path: Path) -> None:
    state = FakeState(step_cost=(PER_STEP, PER_SEQUENCE), latency=0.2, record=False)
    server = FakeServer(state).start()
    try:
        out = tmp_path / "profile.jsonl"
        assert calibrate(server.url, out, "--widths", "1,8", "--contexts", "64,256",
                         "--tokens", "5,25", "--reps", "2") == 0  # fmt: skip
    finally:
        server.stop()
    for point in map(json.loads, out.read_text().splitlines()):
        # 200 ms a request, and what the service adds over loopback: not counted as steps
        assert 190 <= point["first_ms"] <= 300, point
        assert point["ms_median"] / 1000 == pytest.approx(step_s(point["batch"]), rel=0.25)


def test_measure_takes_any_engine(known_cost: FakeServer) -> None:
    async def scenario() -> tuple[list[float], str]:
        async with OpenAIEngine([known_cost.url], timeouts=Timeouts(call=30)) as engine:
            lines: list[str] = []
            points = await measure(
                engine, Grid((1, 8), (32, 64), tokens=(5, 25), reps=1), progress=lines.append
            )
            assert len(lines) == len(points) == 4
            return [p.ms_median for p in points if p.context == 32], describe(engine)

    (one, eight), name = run_coroutine(scenario())
    assert one == pytest.approx(1000 * step_s(1), rel=0.25)
    assert eight == pytest.approx(1000 * step_s(8), rel=0.25)
    assert name == f"openai {known_cost.url}"


def test_widths_over_the_capacity_are_skipped(known_cost: FakeServer) -> None:
    async def scenario() -> tuple[list[int], list[str]]:
        async with OpenAIEngine([known_cost.url], timeouts=Timeouts(call=30)) as engine:
            engine.capacity = 2
            lines: list[str] = []
            grid = Grid((1, 2, 64), (16, 32), tokens=(5, 15), reps=1)
            points = await measure(engine, grid, progress=lines.append)
            return [p.batch for p in points], lines

    widths, lines = run_coroutine(scenario())
    assert widths == [1, 2, 1, 2]
    assert "widths 64: skipped, over the engine's capacity of 2 sequences" in lines[0]


def test_an_upstream_that_ignores_n_is_measured_by_parallel_singles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = FakeState(step_cost=(PER_STEP, PER_SEQUENCE), honour_n=False, record=False)
    out = tmp_path / "profile.jsonl"
    with FakeServer(state) as server:
        code = calibrate(
            server.url, out, "--widths", "1,4", "--contexts", "32,64", "--tokens", "5,15",
            "--reps", "1",
        )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "ignores n" in err and "single requests in parallel" in err
    points = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(points) == 4 and all("parallel single requests" in p["engine"] for p in points)
    assert load_step_cost(out).step_ms(4, points[1]["ctx"]) > 0


class _NoIgnoreEos(Engine):
    """An engine that refuses ``ignore_eos`` and otherwise takes 2 ms a token."""

    name = "strict"

    def __init__(self) -> None:
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self.requests.append(request)
        if "ignore_eos" in request.params.extra:
            raise UpstreamRejected("unknown field 'ignore_eos'", 400)
        tokens = request.params.max_tokens or 16
        await asyncio.sleep(tokens * 0.002)
        return [Sample("1, 2", "length", 20, tokens, self.name)] * request.n

    async def health(self) -> EngineHealth:
        return EngineHealth(True)


def test_an_engine_that_rejects_ignore_eos_is_asked_without_it() -> None:
    engine = _NoIgnoreEos()
    lines: list[str] = []
    grid = Grid((1, 2), (16, 32), tokens=(5, 25), reps=1)
    points = run_coroutine(measure(engine, grid, progress=lines.append))
    assert len(points) == 4 and all(p.ms_median > 0 for p in points)
    assert sum("rejects ignore_eos" in line for line in lines) == 1
    assert ["ignore_eos" in r.params.extra for r in engine.requests] == [True] + [False] * 9


class _Stalling(Engine):
    """An engine that takes 5 ms a token, whose short requests after the warm-up stall
    for 1.5 s the first ``stalls`` times: a busy host's noise, larger than the steps."""

    name = "stalling"

    def __init__(self, stalls: int) -> None:
        self.stalls = stalls
        self.requests = 0

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self.requests += 1
        tokens = request.params.max_tokens or 16
        stall = self.requests > 1 and tokens == 5 and self.stalls > 0
        self.stalls -= stall
        await asyncio.sleep(tokens * 0.005 + 1.5 * stall)
        return [Sample("1, 2", "length", 20, tokens, self.name)] * request.n

    async def health(self) -> EngineHealth:
        return EngineHealth(True)


def test_a_point_lost_in_the_noise_is_measured_again_over_a_longer_span() -> None:
    lines: list[str] = []
    grid = Grid((1, 2), (16, 32), tokens=(5, 65), reps=1)
    points = run_coroutine(measure(_Stalling(stalls=1), grid, progress=lines.append))
    assert [p.tokens for p in points] == [(5, 125), (5, 65), (5, 65), (5, 65)]
    assert points[0].ms_median == pytest.approx(5, rel=0.5)
    assert (
        "width 1, context 16: the steps were lost in the noise; measuring again with 125 tokens"
        in lines
    )


def test_a_point_still_lost_in_the_noise_is_an_error() -> None:
    grid = Grid((1, 2), (16, 32), tokens=(5, 65), reps=1)
    with pytest.raises(CalibrationError, match="up to 245 tokens: the steps are lost in the noise"):
        run_coroutine(measure(_Stalling(stalls=3), grid))


def _one_line_error(capfd: pytest.CaptureFixture[str]) -> str:
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("blendserve calibrate: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_a_url_where_nothing_listens(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"  # bound, never listening
        out = tmp_path / "profile.jsonl"
        assert calibrate(url, out, *GRID) == 1
    assert f"nothing answers at {url}" in _one_line_error(capfd)
    assert not out.exists()


def test_an_upstream_that_times_out(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "profile.jsonl"
    with FakeServer(FakeState(latency=30.0, record=False)) as server:
        assert calibrate(server.url, out, *GRID, "--timeout", "0.5") == 1
    line = _one_line_error(capfd)
    assert "timed out at width 2, context 64" in line and "--timeout 0.5 s" in line
    assert not out.exists()


def test_an_upstream_that_fails(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "profile.jsonl"
    with FakeServer(FakeState(fail_next=1000, record=False)) as server:
        assert calibrate(server.url, out, *GRID) == 1
    line = _one_line_error(capfd)
    assert "the engine failed at width 2" in line and "answered 500" in line
    assert not out.exists()


def test_an_engine_that_stops_too_early(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # Without step_cost the fake reports 5 completion tokens a sample, however many asked.
    out = tmp_path / "profile.jsonl"
    with FakeServer(FakeState(record=False)) as server:
        assert calibrate(server.url, out, *GRID) == 1
    line = _one_line_error(capfd)
    assert "stops too early to be measured" in line and "--tokens" in line


@pytest.mark.parametrize(
    ("knobs", "says"),
    [
        # Counts past any model's (a billion times what was asked, 10**400 tokens) are
        # refused as the engine reads them, or by calibrate: one line either way.
        ({"token_scale": 10**9}, "tokens"),
        ({"prompt_tokens": 10**400}, "tokens"),
        # Counts an engine may hold but not for what was asked: calibrate's own check.
        ({"token_scale": 1000}, "reports 5,000 completion tokens for a sample of max_tokens 5"),
        ({"prompt_tokens": 10**6}, "reports 1,000,000 prompt tokens for a prompt of"),
    ],
    ids=["a-billion-times", "a-400-digit-prompt", "a-thousand-times", "a-million-prompt"],
)
def test_an_upstream_whose_token_counts_are_absurd(
    knobs: dict[str, int], says: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "profile.jsonl"
    state = FakeState(step_cost=(PER_STEP, PER_SEQUENCE), record=False, **knobs)
    with FakeServer(state) as server:
        assert calibrate(server.url, out, *GRID) == 1
    line = _one_line_error(capfd)
    assert says in line and "width 2, context 64 (5 tokens, warm-up)" in line, line
    assert len(line) < 300, line
    assert not out.exists()


def test_an_engine_whose_speed_changes_mid_point_is_warned_of(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Twentyfold faster from the 4th request: the warm-up and the first repetition of
    # the first point take 30 ms a step of width 1, its second 1.5 ms, as every later one.
    state = FakeState(step_cost=(0.02, 0.01), speed_change=(4, 1 / 20), record=False)
    out = tmp_path / "profile.jsonl"
    with FakeServer(state) as server:
        code = calibrate(server.url, out, "--widths", "1,4", "--contexts", "32,64",
                         "--tokens", "5,45", "--reps", "2")  # fmt: skip
    err = capfd.readouterr().err
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings, err
    first = warnings[0]
    assert first.startswith("warning: width 1, context 32: its 2 repetitions measured"), first
    assert "more than 3x apart: the engine's speed changed" in first
    assert len(out.read_text().splitlines()) == 4  # a warning, not a refusal


def test_points_of_no_measurable_step_are_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # What an engine inflating its counts, short of calibrate's bounds, would measure:
    # every step a femtosecond, 0 ms once written.
    points = [Point(w, c, c + 10.0, 1e-12, 1e-12, 5.0, 2, (5, 25), float(c))
              for c in (64, 256) for w in (1, 4)]  # fmt: skip

    async def measured(args: object, grid: object) -> tuple[list[Point], str, str]:
        return points, "fast", "m"

    monkeypatch.setattr("blendserve.engines.calibration.command._calibrate", measured)
    out = tmp_path / "profile.jsonl"
    assert calibrate("http://127.0.0.1:9/v1", out, *GRID) == 1
    line = _one_line_error(capfd)
    assert "the measured points make no profile: profile point 0: ms_median" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--tokens", "80,16"], "two increasing token counts"),
        (["--tokens", "16"], "two increasing token counts"),
        (["--widths", "1,x"], "not a list of positive integers"),
        (["--contexts", "0,256"], "not a list of positive integers"),
        (["--reps", "0"], "must be positive"),
        (["--embedded-threads", "0"], "must be positive"),
    ],
)
def test_bad_lists_are_bad_arguments(
    flags: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        calibrate("http://127.0.0.1:9/v1", tmp_path / "p.jsonl", *flags)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_the_embedded_default_is_calibrated_on_the_threads_it_serves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built: list[EngineConfig] = []

    async def refuse(config: EngineConfig) -> Engine:
        built.append(config)
        raise ValueError("not started in this test")

    monkeypatch.setattr("blendserve.engines.factory.build_engine", refuse)
    assert calibrate(None, tmp_path / "p.jsonl", "--embedded-threads", "2") == 1
    assert [config.embedded_threads for config in built] == [2]
    assert "not started in this test" in capsys.readouterr().err


def test_a_grid_too_small_to_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--widths", "1,4", "--contexts", "256"]
    assert calibrate("http://127.0.0.1:9/v1", tmp_path / "p.jsonl", *flags) == 2
    assert "the fit needs 4" in capsys.readouterr().err


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.timeout(600)  # its own server, then 24 requests: 110 s alone, 230 s next to tests
def test_the_embedded_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No engine flag: the embedded llama.cpp default, built as `blendserve serve` builds it
    # (its own server, not test_embedded_llama's: that path is what is tested; the model
    # file comes from the same cache).
    # Three repetitions of a 36-token span: the step is their median, and a point the other
    # test worker's noise still drowns is measured again over a longer span.
    out = tmp_path / "profile.jsonl"
    flags = ["--widths", "1,2", "--contexts", "64,128", "--tokens", "4,40", "--reps", "3"]
    code = calibrate(None, out, *flags, "--timeout", "120")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "calibrating embedded llama.cpp (qwen2.5-coder-0.5b)" in captured.err
    assert "single requests in parallel" in captured.err  # llama.cpp's server ignores n
    points = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(p["batch"], p["context"]) for p in points] == [(1, 64), (2, 64), (1, 128), (2, 128)]
    assert all(p["model"] == "qwen2.5-coder-0.5b" and p["ms_median"] > 0 for p in points)
    fit = load_step_cost(out)
    assert fit.step_ms(1, points[0]["ctx"]) > 0
