import re
from pathlib import Path

import pytest
from blendserve.cli import build_parser
from blendserve.engines.factory import build_engine
from blendserve.service import Settings
from blendserve.service.command import read_settings
from blendserve.service.configuration import reference
from pydantic import ValidationError

from tests.support.running import run_coroutine


@pytest.mark.parametrize("policy", ["blend", "asc:cap=16", "esc:window=3"])
def test_a_servable_default_policy_is_taken(policy: str) -> None:
    assert Settings(sc_policy=policy).sc_policy == policy


@pytest.mark.parametrize("policy", ["esc:window=0", "asc:cap=nan", "oracle", "fancy"])
def test_a_default_policy_no_job_could_run_is_refused_at_start(policy: str) -> None:
    with pytest.raises(ValidationError, match="sc_policy"):
        Settings(sc_policy=policy)


def _serve(*argv: str) -> Settings:
    return read_settings(build_parser().parse_args(["serve", *argv]))


def test_the_configuration_reference_is_the_settings_page() -> None:
    page = Path(__file__).parents[3] / "docs" / "configuration.md"
    assert page.read_text(encoding="utf-8") == reference(), (
        "docs/configuration.md is stale: "
        "python -m blendserve.service.configuration > docs/configuration.md"
    )


def test_serve_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", capsys.readouterr().out))
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in flags


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLENDSERVE_PORT", "7000")
    monkeypatch.setenv("BLENDSERVE_MAX_BODY_BYTES", "4096")
    monkeypatch.setenv("BLENDSERVE_METRICS_AUTH", "true")
    settings = _serve(
        "--port", "9001", "--upstreams", "http://a/v1,http://b/v1", "--upstream", "http://c/v1",
        "--no-metrics-auth", "--default-concurrency", "3",
    )  # fmt: skip
    assert settings.port == 9001
    assert settings.max_body_bytes == 4096
    assert settings.upstreams == ("http://a/v1", "http://b/v1", "http://c/v1")
    assert not settings.metrics_auth
    assert settings.default_concurrency == 3


def test_a_flag_out_of_range_is_refused() -> None:
    with pytest.raises(ValidationError, match="group_max"):
        _serve("--group-max", "0")


def test_the_embedded_servers_threads_reach_its_engine() -> None:
    assert _serve().engine_config().embedded_threads is None  # half the cores
    assert _serve("--embedded-threads", "3").engine_config().embedded_threads == 3
    with pytest.raises(ValidationError, match="embedded_threads"):
        _serve("--embedded-threads", "0")


def test_paths_under_home_are_expanded() -> None:
    assert _serve("--model-cache-dir", "~/models").model_cache_dir == Path.home() / "models"


def test_capacity_flags_reach_the_engine(tmp_path: Path) -> None:
    data = tmp_path / "replay.jsonl"
    data.write_text('{"id": "q", "answers": ["1"]}\n')
    settings = _serve(
        "--engine", "replay", "--data", str(data), "--replay-capacity", "32",
        "--replay-per-token-latency-s", "0.01", "--engine-capacity", "512",
    )  # fmt: skip
    engine = run_coroutine(build_engine(settings.engine_config()))
    assert engine.latency.per_token == 0.01  # type: ignore[attr-defined]
    assert engine.load().capacity == 32  # the replay engine's own batch
    assert engine.capacity == 512
    assert _serve("--default-max-rounds", "0").default_max_rounds == 0
    with pytest.raises(ValidationError, match="default_max_rounds"):
        _serve("--default-max-rounds", "65")
