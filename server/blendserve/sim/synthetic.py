"""Synthetic question sets: the paper's D1 and D2, an LLM-like mixture, and flat families.

The flat families are where adaptive policies can lose to plain
self-consistency (answers spread over many near-tied candidates, as a small
model's on hard questions); each family's draw says its shape.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from blendserve.sim.data import Dataset

__all__ = ["FAMILIES", "synthetic"]

#: Tail answers per question at most; rarer draws of (p1, p2) are redrawn.
_MAX_TAIL = 200


def _with_tail(p1: float, p2: float) -> NDArray[np.float64]:
    """``[p1, p2, tail...]`` where the rest ``1 - p1 - p2`` is split into answers <= p2."""
    rest = max(0.0, 1.0 - p1 - p2)
    pieces = math.ceil(rest / p2 - 1e-12) if rest > 1e-12 else 0
    tail = [rest / pieces] * pieces if pieces else []
    return np.array([p1, p2, *tail])


def _top_two(rng: np.random.Generator, power: float) -> tuple[float, float]:
    """(p1, p2) uniform on ``{0 <= p2 <= p1, p1 + p2 <= 1}``, reweighted by ``(p1+p2)^power``."""
    while True:
        p1, p2, u = rng.random(3)
        if p2 >= p1 or p1 + p2 > 1.0 or u > (p1 + p2) ** power:
            continue
        if p2 > 0 and (1.0 - p1 - p2) / p2 <= _MAX_TAIL:
            return float(p1), float(p2)


def _llm_like(rng: np.random.Generator) -> NDArray[np.float64]:
    """Mostly easy questions, some moderate, a few contested (margins like GPT-3.5 CoT)."""
    kind = rng.random()
    if kind < 0.75:  # easy: a dominant answer and a few stray ones
        p1 = rng.uniform(0.8, 1.0)
        stray = rng.dirichlet(np.ones(int(rng.integers(1, 4)))) * (1.0 - p1)
        return np.array([p1, *stray])
    if kind < 0.92:  # moderate: a clear favourite
        p1 = rng.uniform(0.5, 0.8)
        return _with_tail(p1, rng.uniform(0.3, 0.8) * (1.0 - p1))
    p1 = rng.uniform(0.35, 0.6)  # contested: two strong candidates
    return _with_tail(p1, rng.uniform(0.5, 0.95) * min(p1, 1.0 - p1))


def _dirichlet(rng: np.random.Generator, low: int, high: int, alpha: float) -> NDArray[np.float64]:
    """A Dirichlet(``alpha``) distribution over ``low``..``high`` answers."""
    return rng.dirichlet(np.full(int(rng.integers(low, high + 1)), alpha))


def _near_tie(rng: np.random.Generator) -> NDArray[np.float64]:
    """Two leading answers within 2-10 points of each other, the rest in a tail."""
    p1 = rng.uniform(0.25, 0.55)
    return _with_tail(p1, p1 - rng.uniform(0.02, 0.1) * p1 / 0.55)


def _mixed(rng: np.random.Generator) -> NDArray[np.float64]:
    """Half LLM-like questions, half flat ones."""
    return _llm_like(rng) if rng.random() < 0.5 else _dirichlet(rng, 3, 8, 1.0)


def _zipf(rng: np.random.Generator) -> NDArray[np.float64]:
    """3-12 answers with shares proportional to ``rank^-s``, ``s`` uniform on 0.5-2."""
    ranks = np.arange(1, int(rng.integers(3, 13)) + 1, dtype=np.float64)
    shares = np.power(ranks, -rng.uniform(0.5, 2.0))
    return np.asarray(shares / shares.sum(), dtype=np.float64)


def _pair(rng: np.random.Generator) -> NDArray[np.float64]:
    """Two answers, the leader's share uniform on 0.5-1."""
    p1 = rng.uniform(0.5, 1.0)
    return np.array([p1, 1.0 - p1])


def _tail(rng: np.random.Generator) -> NDArray[np.float64]:
    """A peaked pair (4:1) holding a Beta(5, 2) share, ten rare answers sharing the rest."""
    top = rng.beta(5.0, 2.0)
    return np.array([0.8 * top, 0.2 * top, *[(1.0 - top) / 10] * 10])


# Family -> a draw of one question's distribution (d1 and d2 are drawn by weight).
_DRAWS = {
    "llm": _llm_like,
    "flat": lambda rng: _dirichlet(rng, 3, 8, 1.0),
    "many": lambda rng: _dirichlet(rng, 10, 20, 0.5),
    "ties": _near_tie,
    "mixed": _mixed,
    "zipf": _zipf,
    "pair": _pair,
    "dense": lambda rng: _dirichlet(rng, 4, 6, 2.0),
    "tail": _tail,
}


def synthetic(family: str, num_questions: int = 1000, seed: int = 0) -> Dataset:
    """Draws ``num_questions`` answer distributions of one family of :data:`FAMILIES`.

    ``d1``: top-two probabilities uniform on the simplex corner (paper section 3);
    ``d2``: D1 weighted by ``(p1 + p2)^2``; ``flat``, ``many`` and ``dense``:
    Dirichlets over 3-8, 10-20 and 4-6 answers; the others as their draws say.

    Raises:
        ValueError: unknown family or a non-positive size.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown synthetic family {family!r} (known: {', '.join(FAMILIES)})")
    if num_questions < 1:
        raise ValueError("a synthetic set needs at least one question")
    rng = np.random.default_rng(seed)
    probs: list[NDArray[np.float64]] = []
    for _ in range(num_questions):
        if family in _DRAWS:
            probs.append(_DRAWS[family](rng))
        else:
            probs.append(_with_tail(*_top_two(rng, FAMILIES[family])))
    return Dataset.from_probs(family, probs)


#: Family name -> weight exponent n of (p1 + p2)^n (used by d1 and d2 only).
FAMILIES: dict[str, float] = {"d1": 0.0, "d2": 2.0, **dict.fromkeys(_DRAWS, 0.0)}
