"""What one decode step of an engine costs, by its width and context: a profile, fitted.

An engine that batches continuously decodes every running sequence one token
a step; a step of ``B`` sequences holding ``ctx`` tokens of context each lasts
about ``base + B * per_sequence + B * ctx * per_context_token + ctx *
per_token_of_context`` milliseconds (width nearly free up to a few dozen
sequences, then about linear). :class:`StepCost` is that fit, made from
measured points (JSON lines with ``batch``, ``ctx`` and ``ms_median``, the
form of the H100 decode profiles) or read from the fits shipped with
blendserve (:data:`SHIPPED`, named like ``qwen2.5-7b-h100``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize

from blendserve._jsonl import read_jsonl

__all__ = ["SHIPPED", "StepCost", "load_step_cost"]

_SHIPPED_FILE = "step_costs.json"


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
        points.

        Raises:
            ValueError: fewer than 4 points, or a point without those fields.
        """
        rows = []
        for i, point in enumerate(points):
            try:
                rows.append((float(point["batch"]), float(point["ctx"]), float(point["ms_median"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"profile point {i} lacks batch, ctx or ms_median") from exc
        if len(rows) < 4:
            raise ValueError(f"a profile needs at least 4 points, got {len(rows)}")
        b, c, ms = np.array(rows).T
        design = np.stack([np.ones_like(b), b, b * c, c], axis=1) / ms[:, None]
        # Non-negative: no term of a step makes it shorter, and a few noisy points over
        # two contexts must not buy a fit with one (a negative base, say).
        coef, _ = optimize.nnls(design, np.ones_like(ms))
        base, per_seq, per_seq_ctx, per_ctx = (float(x) for x in coef)
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
        ValueError: neither a shipped name nor a readable profile with enough points.
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
            points.append(point)
    return StepCost.fit(points, name=path.name if model is None else f"{path.name}:{model}")
