"""The benchmarks' named presets (``python -m bench``): each one's module takes its
arguments, the runner builds, prints and runs their commands, and nothing under bench/
imports the tests."""

from __future__ import annotations

import argparse
import ast
import runpy
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn
from unittest import mock

import pytest

from bench.__main__ import main
from bench.presets import (
    BY_NAME,
    DATA,
    DATA_ENV,
    DATA_KINDS,
    PRESETS,
    SHIPPED,
    MissingData,
    Preset,
    command,
    table,
)

ROOT = Path(__file__).parents[2]
BENCH = ROOT / "bench"


class _Parsed(Exception):
    """A module's parser read its command line: the program itself does not run."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = namespace


def _parse_only(module: str, argv: Sequence[str]) -> argparse.Namespace:
    """Runs ``module`` as ``__main__`` until its argparse parser has read ``argv``: the
    namespace it made (its parser's error as an AssertionError)."""
    parse = argparse.ArgumentParser.parse_args

    def parse_and_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        raise _Parsed(parse(self, *args, **kwargs))

    def error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        raise AssertionError(f"{module} {' '.join(argv)}: {message}")

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse_and_stop),
        mock.patch.object(argparse.ArgumentParser, "error", error),
        mock.patch.object(sys, "argv", [module, *argv]),
        warnings.catch_warnings(),
    ):
        # runpy warns when the module was imported before (by another benchmark)
        warnings.filterwarnings("ignore", "'bench.*found in sys.modules", RuntimeWarning)
        try:
            runpy.run_module(module, run_name="__main__")
        except _Parsed as parsed:
            return parsed.namespace
    raise AssertionError(f"{module} returned without parsing its arguments")


@pytest.mark.parametrize("preset", PRESETS, ids=lambda preset: preset.name)
def test_each_presets_module_takes_its_arguments(preset: Preset, tmp_path: Path) -> None:
    words = command(preset, data=tmp_path)
    assert words[:3] == ["python", "-m", preset.module]
    assert not any(DATA in word for word in words)
    _parse_only(preset.module, words[3:])


def test_a_module_that_refuses_an_argument_fails_the_check() -> None:
    with pytest.raises(AssertionError, match="unrecognized arguments: --no-such-flag"):
        _parse_only("bench.overhead.selection", ["--no-such-flag"])
    namespace = _parse_only("bench.overhead.selection", ["--samples-per-question", "8"])
    assert namespace.samples_per_question == 8


def test_presets_say_what_data_they_need() -> None:
    assert len(BY_NAME) == len(PRESETS)
    assert {"readme", "readme-full", "paper-table", "latency-idle", "latency-http",
            "latency-load", "online", "traces", "traces-service", "deepconf",
            "overhead-selection", "overhead-scheduler", "answers", "load", "abuse",
            "stragglers", "cost-model", "logprobs"} <= set(BY_NAME)  # fmt: skip
    for preset in PRESETS:
        assert preset.data in DATA_KINDS, preset
        takes_data = any(DATA in arg for arg in preset.args)
        assert takes_data == (preset.data == "recorded"), preset
        assert preset.figure and "\n" not in preset.figure, preset
        if SHIPPED in preset.args:
            assert preset.data == "shipped"
    assert (ROOT / SHIPPED).is_dir()
    assert BY_NAME["readme-full"].args[1:] == BY_NAME["readme"].args[1:]
    with pytest.raises(MissingData, match=DATA_ENV):
        command(BY_NAME["readme-full"])


def test_the_readme_shows_the_presets_table() -> None:
    assert table() in (BENCH / "README.md").read_text("utf-8")


def test_the_runner_lists_and_prints_commands(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert all(f"`{preset.name}`" in listing for preset in PRESETS)

    monkeypatch.delenv(DATA_ENV, raising=False)
    assert main(["--dry-run", "answers", "--repeat", "2"]) == 0
    assert capsys.readouterr().out == "python -m bench.overhead.answers --repeat 2\n"
    with pytest.raises(SystemExit):
        main(["--dry-run", "readme-full"])
    assert "needs the recorded sets" in capsys.readouterr().err

    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    assert main(["--dry-run", "overhead-scheduler"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[3] == f"{tmp_path.resolve()}/esc_lastletters_gpt35.jsonl"
    assert main(["--dry-run", "--data", str(tmp_path / "given"), "readme-full"]) == 0
    assert capsys.readouterr().out.split()[3] == str((tmp_path / "given").resolve())
    with pytest.raises(SystemExit):
        main(["--data", str(tmp_path / "absent"), "readme-full"])
    assert "no folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["no-such-preset"])
    assert "no preset 'no-such-preset'" in capsys.readouterr().err


def test_the_runner_runs_a_preset_with_the_arguments_passed_through(
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert main(["overhead-selection", "--questions", "20", "--samples-per-question", "2"]) == 0
    out, err = capfd.readouterr()
    assert "python -m bench.overhead.selection --questions 20" in err
    assert "| blend | 20 | 40 |" in out  # 20 questions, 2 samples each


def test_nothing_under_bench_imports_the_tests() -> None:
    importing = []
    for path in BENCH.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(name == "tests" or name.startswith("tests.") for name in names):
                importing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not importing
