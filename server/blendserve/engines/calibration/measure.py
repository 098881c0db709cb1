"""What one decode step of a real engine costs, by width and context (``blendserve calibrate``).

Each point times a request for ``B`` samples of a prompt of about ``c`` tokens at
a short and a long length: ``(wall_long - wall_short) / (tokens_long - tokens_short)``
cancels prefill and per-request overhead. The points are written as JSON lines,
the profiles :func:`~blendserve.engines.step_cost.load_step_cost` fits.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blendserve.engines.base import Engine, GenerateRequest, Sample, SamplingParams
from blendserve.engines.continuous import first_step_ms
from blendserve.engines.step_cost import StepCost
from blendserve.errors import EngineError, EngineTimeout, UpstreamRejected

__all__ = [
    "MIN_POINTS",
    "SPREAD_WARNING",
    "CalibrationError",
    "Grid",
    "Point",
    "Progress",
    "describe",
    "ignores_n",
    "measure",
    "summary",
    "write_profile",
]

#: Points a profile needs: :meth:`StepCost.fit` has four coefficients.
MIN_POINTS = 4
#: The fewest tokens between the short and the long request that still measure a step.
MIN_TOKEN_SPAN = 4
#: Times a point drowned in noise is measured again, each with twice the token span.
NOISE_RETRIES = 2
#: Characters per prompt token guessed before the engine has counted one (digits and
#: commas are a token each in some tokenizers).
_CHARS_PER_TOKEN = 2.0
#: How far apart (largest over smallest) a point's repetitions may be before calibrate
#: warns that the engine's speed changed while it was measured (or the host was busy):
#: a steady engine's repetitions stay well within it (docs/engines.md).
SPREAD_WARNING = 3.0
#: The most tokens any count of the engine's may be: beyond it a count is not believed.
MAX_TOKENS_COUNTED = 2**31
#: The most completion tokens a sample may report, in ``max_tokens`` asked: an engine
#: makes at most ``max_tokens``; twice leaves room for one that counts loosely.
COMPLETION_SLACK = 2
#: Prompt tokens a request may report beyond one a character of its prompt (the
#: prompt is ASCII: no tokenizer makes more tokens than characters of it), for
#: a chat template's own tokens.
TEMPLATE_TOKENS = 1024

#: Hears each line of progress.
Progress = Callable[[str], None]


class CalibrationError(Exception):
    """Calibration cannot go on; the message says why, in one line."""


@dataclass(frozen=True)
class Grid:
    """What is measured: every width (``n`` of a request) at every context (prompt tokens,
    about), at the short and the long ``tokens``, ``reps`` times.

    Raises:
        ValueError: a value is not a positive integer, or ``tokens`` not two increasing ones.
    """

    widths: tuple[int, ...]
    contexts: tuple[int, ...]
    tokens: tuple[int, int] = (16, 80)
    reps: int = 3

    def __post_init__(self) -> None:
        for name, values in (("widths", self.widths), ("contexts", self.contexts)):
            if not values or min(values) < 1:
                raise ValueError(f"{name} must be positive integers, got {values}")
        if len(self.tokens) != 2 or not 0 < self.tokens[0] < self.tokens[1]:
            raise ValueError(f"tokens must be two increasing positive integers, got {self.tokens}")
        if self.reps < 1:
            raise ValueError(f"reps must be at least 1, got {self.reps}")


@dataclass(frozen=True)
class Point:
    """One measured point of the profile: the fields of its line (docs/engines.md, "Calibrating
    an engine"), and ``prompt``, the prompt's tokens as the engine counted them (median).
    """

    batch: int
    context: int
    ctx: float
    ms_median: float
    ms_min: float
    first_ms: float
    reps: int
    tokens: tuple[int, int]
    prompt: float

    def record(self, **fields: Any) -> dict[str, Any]:
        """The point as a profile line, with ``fields`` (``engine``, ``model``) added."""
        return {
            "batch": self.batch,
            "ctx": round(self.ctx, 1),
            "ms_median": round(self.ms_median, 4),
            "ms_min": round(self.ms_min, 4),
            "first_ms": round(self.first_ms, 3),
            "reps": self.reps,
            "tokens": list(self.tokens),
            "context": self.context,
            **fields,
        }


def _quiet(line: str) -> None:
    pass


def _reason(exc: BaseException) -> str:
    """The error, and the one it came from where that says more (an upstream's answer)."""
    cause = exc.__cause__
    if cause is None or str(cause) in str(exc):
        return str(exc)
    return f"{exc} (last: {cause})"


def ignores_n(engine: Engine) -> bool:
    """Whether ``engine`` was seen to ignore ``n``, and so sends ``n`` single requests."""
    from blendserve.engines.embedded import EmbeddedEngine
    from blendserve.engines.openai import OpenAIEngine

    inner = engine.inner if isinstance(engine, EmbeddedEngine) else engine
    return isinstance(inner, OpenAIEngine) and inner.ignores_n


def describe(engine: Engine) -> str:
    """What is measured, in words: the engine's kind and, for upstreams, their URLs."""
    from blendserve.engines.embedded import EmbeddedEngine
    from blendserve.engines.openai import OpenAIEngine

    if isinstance(engine, EmbeddedEngine):
        return "embedded llama.cpp"
    if isinstance(engine, OpenAIEngine):
        return "openai " + ",".join(engine.urls)
    return engine.name or type(engine).__name__


def _counting(chars: int) -> str:
    """``1, 2, 3, ...`` up to about ``chars`` characters, ending in a comma."""
    pieces: list[str] = []
    length = number = 0
    while length < chars:
        number += 1
        pieces.append(f"{number}, ")
        length += len(pieces[-1])
    return "".join(pieces).rstrip(" ")


class _Prober:
    """Times the grid's requests on one engine."""

    def __init__(
        self, engine: Engine, grid: Grid, timeout: float | None, progress: Progress
    ) -> None:
        self.engine = engine
        self.grid = grid
        self.timeout = timeout
        self.progress = progress
        self.extra: Mapping[str, Any] = {"ignore_eos": True}
        self.chars_per_token = _CHARS_PER_TOKEN

    def prompt(self, context: int) -> str:
        # A nonce first: no prefix cache makes one request's prefill cheaper than another's.
        head = f"[{uuid.uuid4().hex[:12]}] Keep counting: "
        body = round(context * self.chars_per_token) - len(head)
        return head + _counting(max(body, 8))

    async def timed(
        self, width: int, context: int, max_tokens: int, label: str = ""
    ) -> tuple[float, int, int, int]:
        """Seconds, the longest sample's tokens, and the prompt's tokens and characters
        of one request (``label`` names it in errors)."""
        prompt = self.prompt(context)
        params = SamplingParams(temperature=1.0, max_tokens=max_tokens, extra=self.extra)
        request = GenerateRequest(prompt=prompt, n=width, params=params, timeout=self.timeout)
        where = f"width {width}, context {context} ({max_tokens} tokens{label})"
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout):  # for engines without request timeouts
                samples: list[Sample] = await self.engine.generate(request)
        except (EngineTimeout, TimeoutError) as exc:
            limit = "its timeout" if self.timeout is None else f"--timeout {self.timeout:g} s"
            raise CalibrationError(
                f"the engine timed out at {where}: no answer within {limit}"
            ) from exc
        except EngineError as exc:
            raise CalibrationError(f"the engine failed at {where}: {_reason(exc)}") from exc
        wall = time.perf_counter() - started
        if not samples:
            raise CalibrationError(f"the engine returned no samples at {where}")
        tokens = max(s.completion_tokens for s in samples)
        prompt_tokens = max(s.prompt_tokens for s in samples)
        if tokens > min(MAX_TOKENS_COUNTED, COMPLETION_SLACK * max_tokens):
            raise CalibrationError(
                f"the engine reports {_count(tokens)} completion tokens for a sample of "
                f"max_tokens {max_tokens} at {where}: its token counts cannot be believed"
            )
        if prompt_tokens > min(MAX_TOKENS_COUNTED, len(prompt) + TEMPLATE_TOKENS):
            raise CalibrationError(
                f"the engine reports {_count(prompt_tokens)} prompt tokens for a prompt of "
                f"{len(prompt)} characters at {where}: its token counts cannot be believed"
            )
        return wall, tokens, prompt_tokens, len(prompt)

    async def warm_up(self) -> None:
        """One unrecorded request of two samples; it learns the prompt's characters per token.

        An engine that rejects ``ignore_eos`` is asked again without it (said once).
        """
        context, short = min(self.grid.contexts), self.grid.tokens[0]
        try:
            *_, prompt_tokens, chars = await self.timed(2, context, short, ", warm-up")
        except CalibrationError as exc:
            if not (self.extra and isinstance(exc.__cause__, UpstreamRejected)):
                raise
            self.progress(
                f"the engine rejects ignore_eos ({exc.__cause__}): measuring without it, "
                "so samples may stop early"
            )
            self.extra = {}
            *_, prompt_tokens, chars = await self.timed(2, context, short, ", warm-up")
        if prompt_tokens > 0:
            self.chars_per_token = chars / prompt_tokens

    async def point(self, width: int, context: int) -> Point:
        """The point of ``width`` and ``context``, over the grid's repetitions.

        Where the long requests took no longer than the short ones (a busy host's
        noise drowned the steps), the point is measured again with the long request
        twice as far from the short one, up to :data:`NOISE_RETRIES` times.
        """
        short, long = self.grid.tokens
        for retry in range(NOISE_RETRIES + 1):
            point = await self._point(width, context, short, long)
            if point.ms_median > 0:
                return point
            if retry < NOISE_RETRIES:
                long = short + 2 * (long - short)
                self.progress(
                    f"width {width}, context {context}: the steps were lost in the noise; "
                    f"measuring again with {long} tokens"
                )
        raise CalibrationError(
            f"at width {width}, context {context} the long requests took no longer than "
            f"the short ones, up to {long} tokens: the steps are lost in the noise; "
            f"try larger --tokens"
        )

    async def _point(self, width: int, context: int, short: int, long: int) -> Point:
        steps: list[float] = []
        firsts: list[float] = []
        prompts: list[float] = []
        made: list[float] = []
        for _ in range(self.grid.reps):
            wall_short, tokens_short, prompt_short, _ = await self.timed(width, context, short)
            wall_long, tokens_long, prompt_long, _ = await self.timed(width, context, long)
            span = tokens_long - tokens_short
            if span < MIN_TOKEN_SPAN:
                raise CalibrationError(
                    _too_short(width, context, (tokens_short, tokens_long), (short, long))
                )
            steps.append(1000 * (wall_long - wall_short) / span)
            firsts.append(1000 * wall_short - tokens_short * steps[-1])
            prompts.append((prompt_short + prompt_long) / 2)
            made.append((tokens_short + tokens_long) / 2)
        prompt = statistics.median(prompts) or float(context)  # 0: the engine did not count it
        ctx = prompt + statistics.median(made)
        if statistics.median(steps) > 0:  # else measured again (see point)
            self._check_spread(width, context, steps)
        return Point(
            width,
            context,
            ctx,
            statistics.median(steps),
            min(steps),
            statistics.median(firsts),
            self.grid.reps,
            (short, long),
            prompt,
        )

    def _check_spread(self, width: int, context: int, steps: Sequence[float]) -> None:
        """Warns where the repetitions of a point lie more than :data:`SPREAD_WARNING` apart."""
        low, high = min(steps), max(steps)
        if len(steps) > 1 and not high <= SPREAD_WARNING * low:  # a step of <= 0 ms: too
            self.progress(
                f"warning: width {width}, context {context}: its {len(steps)} repetitions "
                f"measured {low:.3g} to {high:.3g} ms per step, more than "
                f"{SPREAD_WARNING:g}x apart: the engine's speed changed while it was "
                "measured, or the host is busy; the point is their median"
            )


def _count(tokens: int) -> str:
    """A token count for an error line: an absurd one by its digits."""
    digits = len(str(tokens))
    return f"{tokens:,}" if digits <= 15 else f"a {digits}-digit number of"


def _reps(count: int) -> str:
    return f"{count} rep" if count == 1 else f"{count} reps"


def _too_short(width: int, context: int, made: tuple[int, int], asked: tuple[int, int]) -> str:
    if made[1] == 0:
        return "the engine reports no completion tokens (no usage): it cannot be measured"
    return (
        f"the engine stops too early to be measured: at width {width}, context {context} "
        f"its longest samples had {made[0]} and {made[1]} tokens of {asked[0]} and "
        f"{asked[1]} asked (at least {MIN_TOKEN_SPAN} apart needed); try a larger --tokens"
    )


async def measure(
    engine: Engine,
    grid: Grid,
    *,
    timeout: float | None = None,
    progress: Progress = _quiet,
) -> list[Point]:
    """The grid's points on ``engine``, after one warm-up request; ``progress`` hears each.

    Widths over ``engine.capacity`` are skipped (with a note). ``timeout`` bounds
    each request (None: the engine's own timeout).

    Raises:
        CalibrationError: the engine failed, timed out, or stops too early to be measured.
    """
    prober = _Prober(engine, grid, timeout, progress)
    capacity = engine.capacity
    widths = [w for w in grid.widths if capacity is None or w <= capacity]
    if len(widths) < len(grid.widths):
        skipped = ", ".join(str(w) for w in grid.widths if w not in widths)
        progress(f"widths {skipped}: skipped, over the engine's capacity of {capacity} sequences")
    if len(widths) * len(grid.contexts) < MIN_POINTS:
        raise CalibrationError(
            f"only {len(widths) * len(grid.contexts)} points fit the engine's capacity: "
            f"the fit needs {MIN_POINTS} (more --widths or --contexts)"
        )
    await prober.warm_up()
    if ignores_n(engine):
        progress(
            "the engine ignores n (llama.cpp's server): width B is measured as B single "
            "requests in parallel"
        )
    points = []
    for context in grid.contexts:
        for width in widths:
            point = await prober.point(width, context)
            progress(
                f"width {width:>4}  context {context:>6}  ctx {point.ctx:>8.0f}: "
                f"{point.ms_median:9.3f} ms per step (min {point.ms_min:.3f}, "
                f"{_reps(point.reps)}), {point.first_ms:.0f} ms a request besides"
            )
            points.append(point)
    return points


def write_profile(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Writes ``records`` to ``path`` as JSON lines, atomically (a temporary file, renamed).

    Raises:
        OSError: the file cannot be written.
    """
    directory = path.parent
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def summary(fit: StepCost, points: Sequence[Point], records: Sequence[Mapping[str, Any]]) -> str:
    """The fit, its worst relative error, and each context's step time relative to width 1."""
    lines = [
        "fit, ms per step = base + B x per_sequence + B x ctx x per_sequence_context "
        "+ ctx x per_context:",
        f"  base_ms {fit.base_ms:.6g}, per_sequence_ms {fit.per_sequence_ms:.6g}, "
        f"per_sequence_context_ms {fit.per_sequence_context_ms:.6g}, "
        f"per_context_ms {fit.per_context_ms:.6g}",
        f"  worst error {fit.worst_error(records):.1%} over {len(records)} points",
    ]
    smallest = min(p.batch for p in points)
    lines.append(f"step time relative to width {smallest}:")
    for context in dict.fromkeys(p.context for p in points):
        row = [p for p in points if p.context == context]
        reference = next(p.ms_median for p in row if p.batch == smallest)
        cells = "  ".join(
            f"{p.batch}: {p.ms_median:.3g} ms ({p.ms_median / reference:.2f}x)" for p in row
        )
        lines.append(f"  context {context}: {cells}")
    lines.append("a request's first step with its prompt, priced against measured (first_ms):")
    for context in dict.fromkeys(p.context for p in points):
        cells = "  ".join(
            f"{p.batch}: {first_step_ms(fit, round(p.prompt), p.batch):.0f} "
            f"against {p.first_ms:.0f} ms"
            for p in points
            if p.context == context
        )
        lines.append(f"  context {context}: {cells}")
    return "\n".join(lines)
