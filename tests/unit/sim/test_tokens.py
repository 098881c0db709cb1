"""The simulator's tokens figure on recordings with lengths: each sample charged its
question's mean recorded tokens; nothing changes on data without lengths."""

import json
from pathlib import Path

import pytest
from blendserve.cli import main
from blendserve.sim import load_jsonl, sample_efficiency

METHODS = ["sc", "asc", "default", "online"]


def _answers(i: int) -> list[str | None]:
    """Question ``i``'s answers: every fourth contested, the others near unanimous."""
    if i % 4 == 0:
        return ["a"] * 5 + ["b"] * 4 + ["c"] * 3 + [None]
    return ["a"] * 11 + ["b"] + [None]


def _recording(tmp_path: Path, tokens: object, name: str = "rec") -> Path:
    """40 questions; ``tokens(i)`` the length of each sample of question i (None: the
    older ``answers`` shape)."""
    lines = []
    for i in range(40):
        answers = _answers(i)
        if tokens is None:
            line: dict[str, object] = {"id": f"q{i}", "answers": answers}
        else:
            length = tokens(i)  # type: ignore[operator]
            samples = [{"answer": a, "tokens": length, "finish": "stop"} for a in answers]
            line = {"id": f"q{i}", "samples": samples}
        lines.append(json.dumps(line))
    path = tmp_path / f"{name}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_with_one_length_every_method_spends_its_samples_times_that(tmp_path: Path) -> None:
    data = load_jsonl(_recording(tmp_path, lambda i: 250))
    (row,) = sample_efficiency(data, [8], METHODS, reps=2, jobs=1)
    for label, result in row.methods.items():
        assert result.tokens == pytest.approx(250 * result.samples), label


def test_adaptive_methods_spend_more_tokens_a_sample_where_contested_questions_are_longer(
    tmp_path: Path,
) -> None:
    # Contested questions run long; near unanimous ones short: a method that gives the
    # contested ones more samples pays more per sample than SC, which spreads them evenly.
    data = load_jsonl(_recording(tmp_path, lambda i: 1000 if i % 4 == 0 else 100))
    (row,) = sample_efficiency(data, [8], METHODS, reps=2, jobs=1)
    sc = row.methods["sc"]
    assert sc.tokens == pytest.approx(8 * (1000 + 3 * 100) / 4)
    for label in ("asc", "default", "online"):
        result = row.methods[label]
        assert result.reached and result.samples < sc.samples, label
        assert result.tokens is not None
        assert result.tokens / result.samples > 1.2 * sc.tokens / sc.samples, label


def test_data_without_lengths_prints_and_writes_the_table_it_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def simulate(path: Path) -> tuple[str, dict[str, object]]:
        out = path.with_suffix(".json")
        args = ["--targets", "4,8", "--reps", "2", "--methods", ",".join(METHODS), "--jobs", "1"]
        assert main(["simulate", "--data", str(path), *args, "--json", str(out)]) == 0
        return capsys.readouterr().out, json.loads(out.read_text())

    old_text, old_json = simulate(_recording(tmp_path, None, "same"))
    # The same answers as samples recorded without lengths: the same table, no tokens.
    unmeasured_text, unmeasured_json = simulate(_recording(tmp_path, lambda i: None, "same2"))
    assert old_text.replace("same:", "") == unmeasured_text.replace("same2:", "")
    assert old_json == unmeasured_json
    assert "tokens" not in old_text and "tokens" not in json.dumps(old_json)
    measured_text, measured_json = simulate(_recording(tmp_path, lambda i: 300, "measured"))
    assert "tokens" in measured_text.splitlines()[2]
    methods = measured_json["targets"]["8"]["methods"]  # type: ignore[index]
    assert methods["sc"]["tokens"] == pytest.approx(8 * 300)
    # Every other number is the one the data without lengths gave.
    for label, result in methods.items():
        del result["tokens"]
        assert result == old_json["targets"]["8"]["methods"][label]  # type: ignore[index]
