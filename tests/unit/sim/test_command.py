import json
from pathlib import Path

import pytest
from blendserve.cli import main
from blendserve.sim.command import split_methods


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "rec.jsonl"
    lines = []
    for i in range(30):
        answers = ["a"] * (6 + i % 5) + ["b"] * (3 + i % 4) + ["c"] * 2 + [None]
        lines.append(json.dumps({"id": f"q{i}", "gold": "a", "answers": answers}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_json_output_has_the_pinned_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "table.json"
    code = main([
        "simulate", "--data", str(_data(tmp_path)), "--targets", "8", "--reps", "2",
        "--methods", "sc,asc:cap=16,blend", "--jobs", "1", "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    table = json.loads(out.read_text())
    row = table["targets"]["8"]
    assert isinstance(row["sc_error"], float)
    assert set(row["methods"]) == {"sc", "asc:cap=16", "blend"}
    for result in row["methods"].values():
        assert result["samples"] * result["ratio"] == pytest.approx(8)
    assert "SC@8" in capsys.readouterr().out


def test_plot_and_scaling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "curves.png"
    code = main([
        "simulate", "--synthetic", "d1", "--questions", "80", "--targets", "4", "--reps", "1",
        "--methods", "sc,ppr,blend", "--jobs", "1", "--plot", str(plot), "--scaling",
    ])  # fmt: skip
    assert code == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "SC scaling: reducible error ~ x^-" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--methods", "sc,nope"], "unknown policy 'nope'"),
        (["--targets", "0"], "at least 1 sample per question"),
        (["--targets", "abc"], "whole numbers"),
        (["--reps", "0"], "at least 1"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["simulate", "--data", str(_data(tmp_path)), "--jobs", "1", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_bad_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"answers": ["a"]}\n{oops\n')
    for path, message in [
        (empty, "empty"),
        (broken, "broken.jsonl:2"),
        (tmp_path / "no", "cannot read"),
    ]:
        assert main(["simulate", "--data", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_a_method_keeps_every_option_after_its_colon() -> None:
    assert split_methods("asc:cap=16,window=8, blend,online:cap=4,first=0,,sc") == [
        "asc:cap=16,window=8",
        "blend",
        "online:cap=4,first=0",
        "sc",
    ]
