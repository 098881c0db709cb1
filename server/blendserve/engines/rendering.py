"""Answer rendering: engines that write their answers for a chosen extractor."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from blendserve.engines.base import Engine

__all__ = ["RendersAnswers", "for_answers"]


@runtime_checkable
class RendersAnswers(Protocol):
    """An engine whose completions are written, not generated (the replay engine).

    A model writes its answer however the prompt asks; an engine that renders
    recorded answers must be told which extractor will read them.
    """

    def rendering(self, kind: str) -> Engine:
        """The same engine, writing answers that the ``kind`` extractor reads."""
        ...


def for_answers(engine: Engine, kind: str) -> Engine:
    """``engine`` for a job whose answers are extracted as ``kind`` (most engines: itself)."""
    return engine.rendering(kind) if isinstance(engine, RendersAnswers) else engine
