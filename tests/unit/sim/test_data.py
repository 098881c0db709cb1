import json
from pathlib import Path

import numpy as np
import pytest
from blendserve.sim import DataError, load_jsonl, synthetic


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "answers.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _record(qid: str, answers: list[object]) -> str:
    return json.dumps({"id": qid, "gold": "x", "answers": answers})


def test_distribution_is_the_frequency_of_non_null_answers(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record("q1", ["a"] * 6 + ["b"] * 3 + [None] * 5 + ["c"])])
    data = load_jsonl(path)
    assert data.ids == ["q1"]
    np.testing.assert_allclose(data.probs[0], [0.6, 0.3, 0.1])


def test_too_few_answers_or_a_tied_mode_are_dropped(tmp_path: Path) -> None:
    lines = [
        _record("few", ["a"] * 7 + [None] * 10),
        _record("tied", ["a"] * 4 + ["b"] * 4),
        _record("kept", ["a"] * 5 + ["b"] * 3),
    ]
    data = load_jsonl(_write(tmp_path, lines))
    assert data.ids == ["kept"] and data.num_dropped == 2


def test_malformed_line_reports_its_number(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record("ok", ["a"] * 9), "{not json", _record("x", [])])
    with pytest.raises(DataError, match=r"answers.jsonl:2: not valid JSON"):
        load_jsonl(path)


def test_record_without_answers_list(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r":1: expected an object"):
        load_jsonl(_write(tmp_path, ['{"id": 1, "answers": "a"}']))


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match="empty"):
        load_jsonl(path)


@pytest.mark.parametrize("family", ["d1", "d2", "llm"])
def test_synthetic_families_have_a_unique_mode(family: str) -> None:
    data = synthetic(family, 300, seed=1)
    assert data.num_questions > 250
    for p in data.probs:
        assert p.sum() == pytest.approx(1.0)
        assert len(p) == 1 or p[0] > p[1]
        assert np.all(np.diff(p) <= 1e-12)


def test_d2_weights_confident_questions_more_than_d1() -> None:
    top_two = {f: np.mean([p[0] + p[1] for p in synthetic(f, 2000, 0).probs]) for f in ("d1", "d2")}
    assert top_two["d2"] > top_two["d1"] + 0.05


def test_unknown_family() -> None:
    with pytest.raises(ValueError, match="unknown synthetic family"):
        synthetic("d9")
