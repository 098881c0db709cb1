"""The metric labels of the online pools: from the operator's side only, and held while used.

A pool's key holds what its requests named (any model string, any budget);
its label, ``model/answer format/aim``, holds only the operator's models and
a rounded budget or target, so pools share labels and their series stay few
(docs/deployment.md). A label counts its pools; once none holds it, its series can go.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection

__all__ = ["OTHER_MODEL", "PoolLabels", "pool_label"]

#: The label's model part for a model the operator did not configure.
OTHER_MODEL = "other"


def _rounded_up(value: float, log: Callable[[float], float], base: float) -> float:
    """``value`` rounded up to a power of ``base`` (a hair above one, float noise, counts as it)."""
    return float(base ** math.ceil(log(value) - 1e-9))


def pool_label(
    model: str | None,
    known: Collection[str],
    answer_kind: str,
    budget: float | None,
    target: float | None = None,
) -> str:
    """The label of a pool of ``model``, ``answer_kind`` and budget (or quality ``target``)."""
    name = "default" if model is None else model if model in known else OTHER_MODEL
    if target is not None:
        aim = f"t{_rounded_up(target, math.log10, 10):g}"
    else:
        # A pool paces at least one sample per question.
        aim = f"b{_rounded_up(max(1.0, budget or 1.0), math.log2, 2):g}"
    return f"{name}/{answer_kind}/{aim}"


class PoolLabels:
    """The labels of a service's pools, each with how many pools hold it.

    Args:
        models: the model names the operator configured, asked on each new pool.
    """

    def __init__(self, models: Callable[[], Collection[str]] = tuple) -> None:
        self.models = models
        self.held: Counter[str] = Counter()

    def label(
        self, model: str | None, answer_kind: str, budget: float | None, target: float | None
    ) -> str:
        """The label of a pool of these (see :func:`pool_label`)."""
        return pool_label(model, self.models(), answer_kind, budget, target)

    def hold(self, label: str) -> None:
        """A new pool has ``label``, until :meth:`release`."""
        self.held[label] += 1

    def release(self, label: str) -> bool:
        """A pool of ``label`` was dropped; True when no pool holds the label any more."""
        self.held[label] -= 1
        if self.held[label] > 0:
            return False
        del self.held[label]
        return True
