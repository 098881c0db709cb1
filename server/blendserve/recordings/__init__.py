"""Recordings: every sample a question got, with its length and confidence; written by
``blendserve record`` and a recording service, read by the replay engine, the simulator
and the benchmarks (docs/recordings.md)."""

from blendserve.recordings.format import (
    RecordedQuestion,
    RecordedSample,
    merge,
    parse_record,
)

__all__ = ["RecordedQuestion", "RecordedSample", "merge", "parse_record"]
