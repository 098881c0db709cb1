"""``--record``: every question's samples appended as a recording line, off the event loop,
never failing a request; ``--confidence-logprobs``: every job's and pool's engine request
asks for confidence."""

import asyncio
import errno
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from blendserve.core.signals import Confidence, ConfidenceSpec
from blendserve.recordings.format import RecordedQuestion, parse_record
from blendserve.recordings.recorder import recorded
from blendserve.scheduler import Question
from blendserve.scheduler.ballots import SeenSample
from blendserve.service import Settings, create_app
from blendserve.service import app as app_module
from blendserve.service.recording import RecordingWriter, recorded_question
from blendserve.testing.live import KEYS
from fastapi.testclient import TestClient

from tests.support.fake_engine import FakeSignalEngine
from tests.support.running import run_coroutine

CONFIDENCE = Confidence(1.25, 0.5, 1.5, tokens=40, window=16, block=20, groups=(1.0, 1.5))
SEEN = [
    SeenSample("42", 40, "stop", None, CONFIDENCE),
    SeenSample(None, 64, "length"),
    SeenSample("41", 12, "stop", "</answer>", CONFIDENCE),
]


def _lines(path: Path) -> list[RecordedQuestion]:
    raw = path.read_text(encoding="utf-8")
    assert raw.endswith("\n")
    return [parse_record(json.loads(line), f"line {i}") for i, line in enumerate(raw.splitlines())]


def _hand(writer: RecordingWriter, ids: range) -> None:
    for i in ids:
        writer.question_done(Question(f"q{i}", prompt=f"question {i}"), SEEN[: 1 + i % 3])


def test_a_line_is_a_question_and_its_samples_in_the_recording_format(tmp_path: Path) -> None:
    out = tmp_path / "seen.jsonl"
    writer = RecordingWriter(out)
    chat = [{"role": "user", "content": "What is 6 times 7?"}]
    writer.question_done(Question("q1", prompt="What is 6 times 7?"), SEEN)
    writer.question_done(Question("3:0", messages=chat), SEEN[:1])
    writer.question_done(Question("ids", prompt=[1, 2, 3]), SEEN[1:2])
    run_coroutine(writer.aclose())

    lines = recorded(out)  # the reader `blendserve record` resumes with
    assert list(lines) == ["q1", "3:0", "ids"] and writer.written == 3 and writer.lost == 0
    first = lines["q1"]
    assert first.prompt == "What is 6 times 7?" and first.messages is None
    assert first.answers == ["42", None, "41"]
    assert [s.tokens for s in first.samples] == [40, 64, 12]
    assert [s.finish for s in first.samples] == ["stop", "length", "stop"]
    assert [s.stop for s in first.samples] == [None, None, "</answer>"]
    assert first.samples[0].confidence == CONFIDENCE and first.samples[1].confidence is None
    assert lines["3:0"].messages == chat and lines["3:0"].prompt is None
    assert lines["ids"].prompt == "[1, 2, 3]"
    assert lines["q1"] == recorded_question(Question("q1", prompt="What is 6 times 7?"), SEEN)


def test_questions_answered_together_each_get_one_whole_line(tmp_path: Path) -> None:
    out = tmp_path / "seen.jsonl"
    writer = RecordingWriter(out)

    async def answered(i: int) -> None:
        await asyncio.sleep(0)  # each on its own turn of the loop, interleaved
        _hand(writer, range(i, i + 1))

    async def run() -> None:
        await asyncio.gather(*(answered(i) for i in range(600)))
        await writer.aclose()

    run_coroutine(run())
    lines = _lines(out)
    assert sorted(q.id for q in lines) == sorted(f"q{i}" for i in range(600))
    assert all(len(q.samples) == 1 + int(q.id[1:]) % 3 for q in lines)
    assert writer.written == 600 and writer.lost == 0


def test_a_file_that_ends_mid_line_keeps_it_and_lines_follow_on_their_own(tmp_path: Path) -> None:
    out = tmp_path / "seen.jsonl"
    out.write_text('{"id": "old", "answers": ["1"]}\n{"id": "cut", "ans', encoding="utf-8")
    writer = RecordingWriter(out)
    _hand(writer, range(2))
    run_coroutine(writer.aclose())
    raw = out.read_text(encoding="utf-8").splitlines()
    assert raw[:2] == ['{"id": "old", "answers": ["1"]}', '{"id": "cut", "ans']
    assert [json.loads(line)["id"] for line in raw[2:]] == ["q0", "q1"]


class FakeFullDisk(RecordingWriter):
    """A writer whose first append writes half its lines, then fails as a full disk does."""

    def __init__(self, path: Path, **options: Any) -> None:
        self.failed = threading.Event()
        super().__init__(path, **options)

    def _append(self, data: bytes) -> None:
        if self.failed.is_set():
            super()._append(data)
            return
        super()._append(data[: len(data) // 2])
        self.failed.set()
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_write_loses_its_lines_once_logged_and_leaves_the_file_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "seen.jsonl"
    reports: list[tuple[str, int]] = []
    writer = FakeFullDisk(out, report=lambda outcome, lines: reports.append((outcome, lines)))
    with caplog.at_level(logging.ERROR, logger="blendserve.service.recording"):
        _hand(writer, range(10))
        assert writer.failed.wait(30)
        _hand(writer, range(10, 20))
        run_coroutine(writer.aclose())
    lines = _lines(out)  # the half line was cut before the next write
    assert 1 <= writer.lost <= 10 and writer.written + writer.lost == 20
    assert len(lines) == writer.written and {f"q{i}" for i in range(10, 20)} <= {
        q.id for q in lines
    }
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert "No space left" in caplog.records[0].getMessage()
    assert sum(n for o, n in reports if o == "lost") == writer.lost
    assert sum(n for o, n in reports if o == "written") == writer.written


class FakeStuckDisk(RecordingWriter):
    """A writer whose appends wait until ``release`` is set."""

    def __init__(self, path: Path, max_queued: int) -> None:
        self.appending = threading.Event()
        self.release = threading.Event()
        super().__init__(path, max_queued=max_queued)

    def _append(self, data: bytes) -> None:
        self.appending.set()
        assert self.release.wait(30)
        super()._append(data)


def test_lines_the_disk_cannot_keep_up_with_are_lost_not_waited_for(tmp_path: Path) -> None:
    out = tmp_path / "seen.jsonl"
    writer = FakeStuckDisk(out, max_queued=1)
    _hand(writer, range(1))
    assert writer.appending.wait(30)  # the first line is being written, and stuck
    _hand(writer, range(1, 3))  # the second waits in the queue; the third has no room
    assert writer.lost == 1
    writer.release.set()
    run_coroutine(writer.aclose())
    assert [q.id for q in _lines(out)] == ["q0", "q1"] and writer.written == 2


def test_a_question_handed_over_after_closing_is_lost_not_raised(tmp_path: Path) -> None:
    writer = RecordingWriter(tmp_path / "seen.jsonl")
    run_coroutine(writer.aclose())
    _hand(writer, range(1))
    assert writer.lost == 1 and writer.written == 0


# The service: a fake engine whose samples carry lengths and confidence where asked.
SCRIPTS = {
    "easy": [("42", 30, 2.5), ("42", 41, 2.0), ("41", 55, 0.75)],
    "split": [("7", 12, 1.5), (None, 64, 0.25), ("8", 20, 1.0), ("7", 33, 1.75)],
    "What is 2 + 1?": [("3", 9, 3.0), ("3", 11, 2.75), ("4", 17, 0.5)],
}
SOLVE = {
    "questions": [{"id": "easy", "prompt": "easy?"}, {"id": "split", "prompt": "split?"}],
    "budget": 16,
    "answer": {"kind": "number"},
    "sampling": {"max_tokens": 256},
}
CHAT = {
    "messages": [{"role": "user", "content": "What is 2 + 1?"}],
    "max_tokens": 128,
    "blendserve": {"budget_per_question": 4, "answer": "number"},
}


def _serve(settings: Settings, engine: FakeSignalEngine) -> tuple[dict, dict]:
    async def factory() -> FakeSignalEngine:
        return engine

    app = create_app(settings, engine_factory=factory, answer_keys=KEYS)
    with TestClient(app) as client:
        solved = client.post("/solve", json=SOLVE)
        chatted = client.post("/v1/chat/completions", json=CHAT)
        assert solved.status_code == 200, solved.text
        assert chatted.status_code == 200, chatted.text
    return solved.json(), chatted.json()


def test_the_service_asks_for_confidence_and_records_every_sample_it_sees(tmp_path: Path) -> None:
    out = tmp_path / "seen.jsonl"
    engine = FakeSignalEngine(SCRIPTS)
    settings = Settings(confidence_logprobs=20, record=out, sc_mode="online")
    solved, chatted = _serve(settings, engine)

    by_prompt = {r.prompt or r.messages[-1]["content"]: r for r in engine.requests}
    assert by_prompt["easy?"].confidence == ConfidenceSpec(20).scaled(256)
    assert by_prompt["What is 2 + 1?"].confidence == ConfidenceSpec(20).scaled(128)
    assert all(r.confidence is not None for r in engine.requests)

    lines = {q.id: q for q in _lines(out)}
    counted = {a["id"]: a["usage"]["samples"] for a in solved["answers"]}
    (chat_id,) = set(lines) - set(counted)
    counted[chat_id] = chatted["blendserve"]["samples"]
    assert {k: len(q.samples) for k, q in lines.items()} == counted
    assert sum(counted.values()) == len(engine.served)
    assert lines[chat_id].messages == CHAT["messages"] and lines["easy"].prompt == "easy?"
    served = {(a, t, c) for _, a, t, c in engine.served}
    for question in lines.values():
        for sample in question.samples:
            assert sample.confidence is not None and sample.finish == "stop"
            assert (sample.answer, sample.tokens, sample.confidence) in served
    tokens = sum(s.tokens or 0 for s in lines["easy"].samples + lines["split"].samples)
    assert tokens == solved["usage"]["completion_tokens"]


def test_the_service_asks_for_no_confidence_and_records_nothing_by_default(
    tmp_path: Path,
) -> None:
    engine = FakeSignalEngine(SCRIPTS)
    _serve(Settings(), engine)
    assert engine.requests and all(r.confidence is None for r in engine.requests)
    assert list(tmp_path.iterdir()) == []


def test_a_recording_that_fails_never_fails_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writers: list[FakeFullDisk] = []

    class FailingForever(FakeFullDisk):
        def __init__(self, path: Path, **options: Any) -> None:
            super().__init__(path, **options)
            writers.append(self)

        def _append(self, data: bytes) -> None:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(app_module, "RecordingWriter", FailingForever)
    solved, chatted = _serve(Settings(record=tmp_path / "seen.jsonl"), FakeSignalEngine(SCRIPTS))
    assert solved["status"] == "completed" and {a["answer"] for a in solved["answers"]} == {
        "42",
        "7",
    }
    assert chatted["choices"][0]["message"]["content"]
    (writer,) = writers
    assert writer.lost == 3 and writer.written == 0
