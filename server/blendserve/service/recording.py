"""Recording what the service sees (``--record``): each question's samples appended to a
file in the recording format (docs/recordings.md), one line a question, as jobs and pools
hand them over (:class:`~blendserve.scheduler.ballots.SampleLog`).

The event loop only builds a line's parts and queues them; a thread of the writer's own
serialises and appends them, so a slow disk never holds the loop. Each write is one
unbuffered append of whole lines: what a killed process wrote is on disk. A line the disk
refuses, or one the queue has no room for, is lost: counted, logged the first time, never
failing a request; a write cut short is undone, so the file stays whole lines of JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from blendserve.recordings.format import RecordedQuestion, RecordedSample
from blendserve.scheduler import Question
from blendserve.scheduler.ballots import SeenSample

__all__ = ["MAX_QUEUED_LINES", "LineOutcome", "RecordingWriter", "recorded_question"]

_log = logging.getLogger(__name__)

#: Lines waiting for the disk at most; a line beyond them is lost (and counted).
MAX_QUEUED_LINES = 10_000
#: Lines appended in one write at most.
_BATCH = 256
#: Seconds a shutdown waits for the lines still queued.
_CLOSE_TIMEOUT_S = 60.0

#: What became of a line: appended to the file, or lost.
LineOutcome = Literal["written", "lost"]


def recorded_question(question: Question, samples: Sequence[SeenSample]) -> RecordedQuestion:
    """The recording line of ``question`` and the samples it took: each sample's answer is
    the key it voted with (None: it abstained or was cut). A prompt of token ids is kept as
    its JSON list, as the replay engine looks it up."""
    prompt = question.prompt
    return RecordedQuestion(
        id=question.id,
        samples=tuple(
            RecordedSample(
                answer=s.key,
                tokens=s.completion_tokens,
                finish=s.finish_reason,
                stop=s.stop_reason,
                confidence=s.confidence,
                stopped=s.stopped,
            )
            for s in samples
        ),
        prompt=prompt if prompt is None or isinstance(prompt, str) else json.dumps(list(prompt)),
        messages=question.messages,
    )


class RecordingWriter:
    """Appends every question handed over to ``path``; :meth:`aclose` writes what is queued
    and closes the file. ``report`` hears of each line's outcome (called from either the
    event loop or the writer's thread). ``written`` and ``lost`` count lines.

    Raises:
        OSError: ``path`` cannot be opened for appending.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_queued: int = MAX_QUEUED_LINES,
        report: Callable[[LineOutcome, int], None] | None = None,
    ) -> None:
        self.path = path
        self.written = 0
        self.lost = 0
        self._report = report
        self._counts = threading.Lock()  # both threads count
        self._warned = False
        self._closed = False
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._size = os.fstat(self._fd).st_size  # the end of the last whole write
            if self._size and os.pread(self._fd, 1, self._size - 1) != b"\n":
                # A file that ends mid-line keeps that line; ours start on the next.
                self._size += os.write(self._fd, b"\n")
        except OSError:
            os.close(self._fd)
            raise
        self._cut = False  # a failed write may have left part of itself past _size
        self._queue: queue.Queue[RecordedQuestion | None] = queue.Queue(max_queued)
        self._thread = threading.Thread(target=self._run, name="blendserve-record", daemon=True)
        self._thread.start()

    def question_done(self, question: Question, samples: Sequence[SeenSample]) -> None:
        """Queues ``question``'s line (on the event loop: never waits for the disk)."""
        if self._closed:
            self._lose(1, "the recording was already closed")
            return
        try:
            self._queue.put_nowait(recorded_question(question, samples))
        except queue.Full:
            self._lose(1, f"{self._queue.maxsize} lines were waiting for the disk")

    async def aclose(self) -> None:
        """Writes the lines queued, then closes the file; questions handed over later are
        lost. A disk that takes longer than a minute loses what is left."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._finish)

    def _finish(self) -> None:
        self._queue.put(None)
        self._thread.join(_CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            left = self._queue.qsize()
            self._lose(left, f"the disk took over {_CLOSE_TIMEOUT_S:g} s at shutdown")
            return  # the thread may still write: the descriptor goes with the process
        os.close(self._fd)

    def _run(self) -> None:
        """The writer's thread: appends what is queued, a batch at a time, until told to stop."""
        while True:
            batch = [self._queue.get()]
            while len(batch) < _BATCH and batch[-1] is not None:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            lines = [line for line in batch if line is not None]
            if lines:
                self._write(lines)
            if batch[-1] is None:
                return

    def _write(self, lines: list[RecordedQuestion]) -> None:
        """Appends ``lines`` in one write; a failed one is undone and its lines counted lost."""
        encoded = []
        for line in lines:
            try:
                encoded.append(line.dumps().encode() + b"\n")
            except (TypeError, ValueError) as exc:  # not JSON: never from a parsed request
                self._lose(1, f"question {line.id!r} is not JSON: {exc}")
        data = b"".join(encoded)
        if not data:
            return
        try:
            if self._cut:  # the last failed write's part goes before anything follows it
                os.ftruncate(self._fd, self._size)
                self._cut = False
            self._append(data)
        except OSError as exc:
            self._cut = True
            self._lose(len(encoded), str(exc))
            return
        self._size += len(data)
        with self._counts:
            self.written += len(encoded)
        if self._report is not None:
            self._report("written", len(encoded))

    def _append(self, data: bytes) -> None:
        """Appends ``data`` to the file, unbuffered.

        Raises:
            OSError: the disk refused it, perhaps after part of it was written.
        """
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def _lose(self, lines: int, why: str) -> None:
        """Counts ``lines`` lost; the first loss is logged, with why."""
        if not lines:
            return
        with self._counts:
            self.lost += lines
            first, self._warned = not self._warned, True
        if self._report is not None:
            self._report("lost", lines)
        if first:
            _log.error(
                "recording to %s lost a line (%s); later losses are counted, not logged",
                self.path,
                why,
            )
