"""``blendserve record``: a questions file's samples written to a recording, resumed where
it stops; and the recording format, old and new shapes (a fake engine, which runs no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from blendserve.cli import main
from blendserve.core.signals import Confidence, ConfidenceSpec
from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample, SamplingParams
from blendserve.recordings import merge, parse_record
from blendserve.recordings.recorder import RecordPlan, read_questions, record, recorded
from blendserve_client.cli import read_questions as solve_questions

from tests.support.running import run_coroutine


class CountingFake(Engine):
    """A fake engine: the n-th sample it makes answers ``n % 3`` in ``n`` tokens, every
    fifth cut at ``max_tokens``; it keeps every request, and fails from the ``fail_at``-th
    request on."""

    name = "fake"

    def __init__(self, fail_at: int | None = None) -> None:
        self.requests: list[GenerateRequest] = []
        self.made = 0
        self.fail_at = fail_at

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        self.requests.append(request)
        if self.fail_at is not None and len(self.requests) >= self.fail_at:
            raise RuntimeError("the fake engine stops here")
        samples = []
        for _ in range(request.n):
            self.made += 1
            confidence = None
            if request.confidence is not None:
                confidence = Confidence(1.0, 0.5, 2.0, self.made, 4, 2, (1.0,) * self.made)
            text = f"so the answer is {self.made % 3}"
            finish = "length" if self.made % 5 == 0 else "stop"
            samples.append(Sample(text, finish, 3, self.made, "fake", confidence=confidence))
        return samples

    async def health(self) -> EngineHealth:
        return EngineHealth(True)


def _questions(tmp_path: Path, count: int = 3) -> Path:
    path = tmp_path / "questions.jsonl"
    lines = [{"id": f"q{i}", "prompt": f"what is {i}?", "gold": str(i)} for i in range(count)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


PLAN = RecordPlan(samples=4, answer_format="number", confidence=ConfidenceSpec(), concurrency=2)


def test_every_sample_is_recorded_with_its_length_and_confidence(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    engine = CountingFake()
    added = run_coroutine(record(engine, read_questions(_questions(tmp_path)), out, PLAN))
    assert added == 12
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == ["q0", "q1", "q2"]
    tokens = sorted(s["tokens"] for line in lines for s in line["samples"])
    assert tokens == list(range(1, 13))
    for line in lines:
        assert line["gold"] == line["id"][1:] and line["prompt"].startswith("what is")
        for sample in line["samples"]:
            cut = sample["tokens"] % 5 == 0
            assert sample["finish"] == ("length" if cut else "stop")
            # a cut sample never votes, whatever its text holds
            assert sample["answer"] == (None if cut else str(sample["tokens"] % 3))
            assert sample["confidence"]["tokens"] == sample["tokens"]
            assert sample["groups"] == [1.0] * sample["tokens"]
    # chat by default: a prompt goes as one user message, every request asks confidence
    assert all(r.messages and r.confidence == ConfidenceSpec() for r in engine.requests)


def test_a_run_resumes_asking_only_what_the_recording_lacks(tmp_path: Path) -> None:
    questions = read_questions(_questions(tmp_path))
    out = tmp_path / "out.jsonl"
    plan = RecordPlan(samples=4, answer_format="number", per_request=2, concurrency=1)
    with pytest.raises(RuntimeError, match="stops here"):
        run_coroutine(record(CountingFake(fail_at=4), questions, out, plan))
    assert sum(len(q.samples) for q in recorded(out).values()) == 6  # three requests of 2
    # a write cut mid-line by the interruption is dropped, and asked for again
    out.write_bytes(out.read_bytes() + b'{"id": "q2", "samp')
    engine = CountingFake()
    added = run_coroutine(record(engine, questions, out, plan))
    assert added == 6
    have = recorded(out)
    assert [len(have[q.id].samples) for q in questions] == [4, 4, 4]
    # only the missing ones were asked for: q1's last two and q2's four
    assert [(r.question_id, r.n) for r in engine.requests] == [("q1", 2), ("q2", 2), ("q2", 2)]
    assert all(line.startswith("{") for line in out.read_text().splitlines())
    assert run_coroutine(record(CountingFake(fail_at=1), questions, out, plan)) == 0


def test_seeds_carry_on_from_the_samples_a_question_has(tmp_path: Path) -> None:
    questions = read_questions(_questions(tmp_path, 1))
    out = tmp_path / "out.jsonl"
    engine = CountingFake()
    plan = RecordPlan(samples=4, per_request=2, params=SamplingParams(seed=5))
    run_coroutine(record(engine, questions, out, plan))
    first, second = (r.params.seed for r in engine.requests)
    assert first is not None and second == first + 2


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], "repeats"),
        (['{"id": "a"}'], "exactly one of prompt"),
        (['{"prompt": "x", "answer_format": "roman"}'], "unknown answer kind"),
        (["[1, 2]"], "expected an object or a string"),
        ([""], "no questions"),
    ],
)
def test_a_bad_questions_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[str], message: str
) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["record", str(path), str(tmp_path / "out.jsonl")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("blendserve record: error:") and message in error


def test_old_and_new_lines_read_alike_and_repeated_ids_merge() -> None:
    old = parse_record({"id": "q", "answers": ["1", None, {"a": 1}]}, "f:1")
    assert old.answers == ["1", None, '{"a": 1}']
    assert all(s.tokens is None and s.confidence is None for s in old.samples)
    new = parse_record(
        {
            "id": "q",
            "gold": 1,
            "samples": [
                {
                    "answer": "1",
                    "tokens": 7,
                    "finish": "stop",
                    "confidence": {"mean": 2.0, "lowest_group": 1.0, "tail": 3.0, "block": 4},
                    "groups": [2.0, 2.0],
                }
            ],
        },
        "f:2",
    )
    assert new.gold == "1" and new.samples[0].confidence is not None
    [merged] = merge([old, new])
    assert merged.answers == ["1", None, '{"a": 1}', "1"] and merged.gold == "1"
    again = parse_record(json.loads(merged.dumps()), "f:3")
    assert again == merged


@pytest.mark.parametrize(
    ("record_line", "message"),
    [
        ([1], "not a JSON object"),
        ({"id": "q"}, "'samples' or an 'answers' list"),
        ({"samples": [3]}, r"samples\[0\]: not an object"),
        ({"samples": [{"answer": "1", "tokens": -1}]}, "tokens"),
        ({"samples": [{"answer": "1", "confidence": {"mean": 1}}]}, "lowest_group"),
        ({"samples": [{"answer": "1", "confidence": [], "groups": 1}]}, "confidence"),
    ],
)
def test_a_bad_recording_line_names_its_place(record_line: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_record(record_line, "rec.jsonl:9")
    assert str(caught.value).startswith("rec.jsonl:9")


def test_the_solve_command_sends_a_recordings_questions_without_its_samples(
    tmp_path: Path,
) -> None:
    """A questions file or recording replays through ``blendserve solve`` as it is: its
    answer keys and samples are not part of a question, and are not sent."""
    path = tmp_path / "recording.jsonl"
    path.write_text('{"id": "a", "prompt": "x", "gold": "1", "samples": []}\n"plain"\n')
    assert solve_questions(path) == [{"id": "a", "prompt": "x"}, "plain"]
