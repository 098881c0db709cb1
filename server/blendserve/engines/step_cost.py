"""What one decode step of an engine costs, by its width and context: a profile, fitted.

:class:`StepCost` is the fit of measured points (JSON lines with ``batch``,
``ctx`` and ``ms_median``, as ``blendserve calibrate`` writes them), or one of
the fits shipped with blendserve (:data:`SHIPPED`, named like ``qwen2.5-7b-h100``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize

from blendserve.util.jsonl import read_jsonl

__all__ = ["MAX_BATCH", "MAX_CONTEXT", "MAX_STEP_MS", "SHIPPED", "StepCost", "load_step_cost"]

_SHIPPED_FILE = "step_costs.json"

#: The widest step a profile point may have: beyond any engine's sequences at once.
MAX_BATCH = 1 << 20
#: The longest context a profile point may have, in tokens: beyond any model's window.
MAX_CONTEXT = 1 << 24
#: The longest decode step a profile point may have, in ms: a minute a token is no engine.
MAX_STEP_MS = 60_000.0
#: The shortest, in ms (a nanosecond): a shorter step is a measurement gone wrong,
#: and would overflow the fit's relative weights.
MIN_STEP_MS = 1e-6


def _number(value: Any) -> float | None:
    """``value`` as a float, if it is a JSON number that is one (None: it is not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None


def _shown(value: Any) -> str:
    """``value`` for an error line: a long one (an integer of 400 digits) is cut short."""
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= 32 else f"{text[:24]}... ({len(text)} characters)"


def _checked(point: Mapping[str, Any]) -> tuple[float, float, float]:
    """A profile point's ``batch``, ``ctx`` and ``ms_median``, each checked.

    Raises:
        ValueError: a field is missing, not a number, or out of its range, in one line.
    """
    missing = [name for name in ("batch", "ctx", "ms_median") if name not in point]
    if missing:
        raise ValueError(f"lacks {' and '.join(missing)}")
    batch, ctx, ms = (_number(point[name]) for name in ("batch", "ctx", "ms_median"))
    if batch is None or not batch.is_integer() or not 1 <= batch <= MAX_BATCH:
        raise ValueError(
            f"batch must be an integer from 1 to {MAX_BATCH:,}, got {_shown(point['batch'])}"
        )
    if ctx is None or not 0 <= ctx <= MAX_CONTEXT:  # NaN fails both
        raise ValueError(
            f"ctx must be a number from 0 to {MAX_CONTEXT:,} tokens, got {_shown(point['ctx'])}"
        )
    if ms is None or not MIN_STEP_MS <= ms <= MAX_STEP_MS:
        raise ValueError(
            f"ms_median must be a number from {MIN_STEP_MS:g} to {MAX_STEP_MS:,.0f} ms, "
            f"got {_shown(point['ms_median'])}"
        )
    return batch, ctx, ms


@dataclass(frozen=True)
class StepCost:
    """Milliseconds of one decode step: ``base + B*seq + B*ctx*seq_ctx + ctx*ctx_only``.

    Attributes:
        base_ms: a step of one sequence with no context.
        per_sequence_ms: each further sequence.
        per_sequence_context_ms: each token of context of each sequence (attention).
        per_context_ms: each token of context, once (what does not grow with width).
        name: where the fit came from.
    """

    base_ms: float
    per_sequence_ms: float
    per_sequence_context_ms: float
    per_context_ms: float = 0.0
    name: str = ""

    def step_ms(self, batch: int, ctx: float, tokens: float | None = None) -> float:
        """Milliseconds of one step of ``batch`` sequences of ``ctx`` context tokens each,
        computing ``tokens`` tokens (None: one a sequence; more where prompts are computed)."""
        return (
            self.base_ms
            + (batch if tokens is None else tokens) * self.per_sequence_ms
            + batch * ctx * self.per_sequence_context_ms
            + ctx * self.per_context_ms
        )

    @classmethod
    def fit(cls, points: Iterable[Mapping[str, Any]], name: str = "") -> StepCost:
        """The non-negative least-squares fit, in relative error, of ``batch``/``ctx``/``ms_median``
        points, each first checked to lie within the ``MAX_*`` and :data:`MIN_STEP_MS` bounds.

        Raises:
            ValueError: fewer than 4 points, a point without those fields or with one out
                of its range, or a fit that prices every step at nothing.
        """
        rows = []
        for i, point in enumerate(points):
            if not isinstance(point, Mapping):
                raise ValueError(f"profile point {i} is not an object")
            try:
                rows.append(_checked(point))
            except ValueError as exc:
                said = str(exc)  # "lacks ..." reads on from the point; the rest are sentences
                joint = " " if said.startswith("lacks") else ": "
                raise ValueError(f"profile point {i}{joint}{said}") from None
        if len(rows) < 4:
            raise ValueError(f"a profile needs at least 4 points, got {len(rows)}")
        b, c, ms = np.array(rows).T
        design = np.stack([np.ones_like(b), b, b * c, c], axis=1) / ms[:, None]
        # Non-negative: no term of a step makes it shorter, and a few noisy points over
        # two contexts must not buy a fit with one (a negative base, say).
        coef, _ = optimize.nnls(design, np.ones_like(ms))
        base, per_seq, per_seq_ctx, per_ctx = (float(x) for x in coef)
        # The checked ranges keep the fit finite; one of no terms at all would make every
        # step free, a cost model worse than none.
        terms = (base, per_seq, per_seq_ctx, per_ctx)
        if not all(math.isfinite(t) for t in terms) or not any(t > 0 for t in terms):
            raise ValueError(f"the profile's points fit no usable step cost ({terms})")
        return cls(base, per_seq, per_seq_ctx, per_ctx, name)

    def worst_error(self, points: Iterable[Mapping[str, Any]]) -> float:
        """The largest relative error of the fit over ``points``."""
        return max(
            abs(self.step_ms(int(p["batch"]), float(p["ctx"])) / float(p["ms_median"]) - 1)
            for p in points
        )

    def as_dict(self) -> dict[str, float | str]:
        """Its fields, as :data:`SHIPPED` and ``/health`` write them."""
        return asdict(self)


def _shipped() -> dict[str, StepCost]:
    text = files("blendserve.engines").joinpath(_SHIPPED_FILE).read_text(encoding="utf-8")
    return {name: StepCost(**fields, name=name) for name, fields in json.loads(text).items()}


#: The fits shipped with blendserve, by name (``qwen2.5-7b-h100``: Qwen2.5-7B's shape on one H100).
SHIPPED: dict[str, StepCost] = _shipped()


def load_step_cost(name_or_path: str | Path, model: str | None = None) -> StepCost:
    """A shipped fit by name, else the fit of a JSONL profile's points (of ``model``, if given).

    Raises:
        ValueError: neither a shipped name nor a readable profile with enough points,
            or a point out of range (see :meth:`StepCost.fit`); one line, naming the
            file and the line at fault.
    """
    if str(name_or_path) in SHIPPED:
        return SHIPPED[str(name_or_path)]
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(SHIPPED))
        raise ValueError(f"{name_or_path}: not a shipped profile ({known}) nor a file")
    points = []
    for lineno, point in read_jsonl(path, "profile"):
        if not isinstance(point, dict):
            raise ValueError(f"{path}:{lineno}: not a JSON object")
        if model is None or point.get("model") == model:
            try:
                _checked(point)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            points.append(point)
    try:
        return StepCost.fit(points, name=path.name if model is None else f"{path.name}:{model}")
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
