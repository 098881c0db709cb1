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


def _samples(answers: list[object], tokens: list[int]) -> list[dict[str, object]]:
    pairs = zip(answers, tokens, strict=True)
    return [{"answer": a, "tokens": t, "finish": "stop"} for a, t in pairs]


def test_a_recording_reads_as_its_answers_do_and_keeps_each_answers_samples(
    tmp_path: Path,
) -> None:
    answers = ["b", "a", None, "a", "c", "a", "b", "a", "a", "a"]
    tokens = [30, 10, 99, 12, 40, 14, 50, 16, 18, 20]
    old = load_jsonl(_write(tmp_path, [_record("q1", answers)]))
    line = {"id": "q1", "samples": _samples(answers, tokens)}
    new = load_jsonl(_write(tmp_path, [json.dumps(line)]))
    assert new.ids == old.ids and new.num_dropped == old.num_dropped
    np.testing.assert_array_equal(new.probs[0], old.probs[0])
    assert old.recorded is not None and old.mean_tokens() is None  # older data: no lengths
    assert new.recorded is not None
    (by_answer,) = new.recorded
    # Aligned with probs: the mode first, then by count, ties in the order first seen.
    assert [{s.answer for s in samples} for samples in by_answer] == [{"a"}, {"b"}, {"c"}]
    assert [[s.tokens for s in samples] for samples in by_answer] == [
        [10, 12, 14, 16, 18, 20], [30, 50], [40],
    ]  # fmt: skip
    # The null answer's sample is never drawn, and its tokens are not charged.
    mean = new.mean_tokens()
    assert mean is not None
    np.testing.assert_allclose(mean, [(sum(tokens) - 99) / 9])


def test_lines_of_one_id_are_one_question(tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "q", "samples": _samples(["a"] * 3 + ["b"] * 2, [5] * 5)}),
        _record("other", ["x"] * 8),
        json.dumps({"id": "q", "samples": _samples(["a"] * 2 + ["b"], [8] * 3)}),
    ]
    data = load_jsonl(_write(tmp_path, lines))
    assert data.ids == ["q", "other"] and data.num_dropped == 0
    np.testing.assert_allclose(data.probs[0], [5 / 8, 3 / 8])
    # "other" was recorded without lengths: the set has no tokens figure.
    assert data.mean_tokens() is None
    alone = load_jsonl(_write(tmp_path, [lines[0], lines[2]]))
    mean = alone.mean_tokens()
    assert mean is not None and mean.tolist() == [(5 * 5 + 8 * 3) / 8]


@pytest.mark.parametrize(
    "sample,message",
    [
        ({"answer": "a", "tokens": -1}, r"answers\.jsonl:2: samples\[1\]\.tokens: must be a count"),
        ({"answer": "a", "confidence": {"mean": "high"}}, r"answers\.jsonl:2: samples\[1\]: "),
        ("a", r"answers\.jsonl:2: samples\[1\]: not an object"),
    ],
)
def test_a_bad_sample_names_its_file_and_line(tmp_path: Path, sample: object, message: str) -> None:
    bad = {"id": "q", "samples": [{"answer": "a"}, sample]}
    lines = [_record("ok", ["a"] * 9), json.dumps(bad)]
    with pytest.raises(DataError, match=message):
        load_jsonl(_write(tmp_path, lines))
