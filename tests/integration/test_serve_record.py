"""``blendserve serve --record``: the real command on the replay engine, asked for confidence,
records every sample it serves; a SIGTERM loses none of them."""

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from blendserve.recordings.format import RecordedQuestion, RecordedSample, merge, parse_record
from blendserve.testing.command import serve_command

pytestmark = pytest.mark.slow

#: Recorded samples with their lengths and confidences, as `blendserve record` writes them.
DATA = Path(__file__).parents[1] / "fixtures" / "recording_signals.jsonl"
SOLVE = {
    "questions": [{"id": "sig-product", "prompt": "What is 6 times 7?"},
                  {"id": "sig-split", "prompt": "Which prime is it, 7 or 11?"}],
    "budget": 24,
    "answer": {"kind": "number"},
    "sampling": {"max_tokens": 512},
}  # fmt: skip
CHAT = {
    "messages": [{"role": "user", "content": "What is 2 + 1?"}],
    "max_tokens": 512,
    "blendserve": {"budget_per_question": 6, "answer": "number"},
}


def _read(path: Path) -> dict[str, RecordedQuestion]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {
        q.id: q for q in merge(parse_record(json.loads(line), f"{path}:{i}")
                               for i, line in enumerate(lines, 1))
    }  # fmt: skip


def _signals(sample: RecordedSample) -> tuple[str | None, int | None, str | None]:
    """What the replay engine serves of a recorded sample as it was recorded."""
    confidence = sample.confidence
    return sample.answer, sample.tokens, json.dumps(confidence.to_json() if confidence else None)


def test_a_recording_service_records_every_sample_it_serves(tmp_path: Path) -> None:
    out = tmp_path / "seen.jsonl"
    args = ("--engine", "replay", "--data", str(DATA), "--confidence-logprobs", "20",
            "--record", str(out))  # fmt: skip
    with serve_command(*args, stderr=tmp_path / "stderr.log") as (url, process):
        solved = httpx.post(f"{url}/solve", json=SOLVE, timeout=60).json()
        chatted = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=60).json()
        process.terminate()  # the lines go out as the service shuts down, none lost
        assert process.wait(timeout=60) == 0

    given = _read(DATA)
    seen = _read(out)
    counted = {a["id"]: a["usage"]["samples"] for a in solved["answers"]}
    (chat_id,) = set(seen) - set(counted)  # a /v1 question is recorded under its pool key
    assert seen[chat_id].messages == CHAT["messages"]
    counted[chat_id] = chatted["blendserve"]["samples"]
    source = {"sig-product": "sig-product", "sig-split": "sig-split", chat_id: "sig-chat"}

    # Every answered question has its line, with every sample its answer counted.
    assert {qid: len(q.samples) for qid, q in seen.items()} == counted
    assert sum(counted.values()) == solved["usage"]["samples"] + chatted["blendserve"]["samples"]
    assert seen["sig-product"].prompt == "What is 6 times 7?"
    # Each sample is one of its question's recorded samples: its answer, its length and
    # its confidence, served as recorded once the request asks for confidence.
    for qid, question in seen.items():
        recorded = {_signals(s) for s in given[source[qid]].samples}
        for sample in question.samples:
            assert sample.confidence is not None
            assert _signals(sample) in recorded, (qid, sample)
    tokens = sum(s.tokens or 0 for qid in ("sig-product", "sig-split") for s in seen[qid].samples)
    assert tokens == solved["usage"]["completion_tokens"]


def test_a_record_file_that_cannot_be_opened_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "seen.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "blendserve.cli", "serve", "--engine", "replay",
         "--data", str(DATA), "--record", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "record:" in done.stderr, done.stderr
