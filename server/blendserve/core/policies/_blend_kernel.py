"""Compiled state of Blend-ASC (numba): per-slot ranks, selectable members, the argmin.

Three arrays hold the whole state, so a selection or a vote is one compiled call:

- ``table[row, slot]`` (float): rows ``LOG_ASC``, ``LOG_PPR`` (the log
  uncertainties of the slot's questions), ``RANK_ASC``, ``RANK_PPR`` (the sum
  over questions t of ``1 + sign(u_t - u_slot)``, i.e. twice the average rank
  plus one) and ``COUNT`` (questions in the slot).
- ``start[b]``: the selectable questions of slot ``s`` occupy
  ``order[start[s + 1]:start[s + 2]]``; bucket 0 (``order[:start[1]]``) holds
  the questions that are not selectable. Moving a question between buckets
  shifts the boundaries in between, in O(distance) swaps.
- ``questions[row, i]`` (int): rows ``SLOT_OF`` (question -> slot), ``POSITION``
  (question -> index in ``order``) and ``ORDER`` (index -> question).

Numba is imported at the first kernel call, not with this module: vLLM's CPU workers,
spawned from the service, import its main module again, and llvmlite's bindings
break their scan of the loaded modules.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

LOG_ASC, LOG_PPR, RANK_ASC, RANK_PPR, COUNT = range(5)
SLOT_OF, POSITION, ORDER = range(3)

F = TypeVar("F", bound=Callable[..., Any])

#: The module's kernels, as written (compiled together at the first call of any).
_PYTHON: dict[str, Callable[..., Any]] = {}
_COMPILING = threading.Lock()
_COMPILED: list[bool] = []


def _compile_all() -> None:
    """Replaces every kernel of this module by numba's compiled version (once)."""
    module = sys.modules[__name__]
    with _COMPILING:
        if _COMPILED:
            return
        from numba import njit

        for name, function in _PYTHON.items():
            # Kernels call each other through the module's globals: all are numba's now.
            setattr(module, name, njit(cache=True, nogil=True)(function))
        _COMPILED.append(True)


def _kernel(function: F) -> F:
    """``numba.njit(cache=True, nogil=True)``, applied at the first call (see the module)."""
    name = function.__name__
    _PYTHON[name] = function

    def call(*args: Any) -> Any:
        compiled = globals()[name]
        if compiled is call:
            _compile_all()
            compiled = globals()[name]
        return compiled(*args)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = function.__doc__
    return call  # type: ignore[return-value]


@_kernel
def _shift(start: NDArray[np.int64], questions: NDArray[np.int64], q: int, to: int) -> None:
    """Moves ``q`` from its bucket to bucket ``to`` (0: not selectable, s + 1: slot s)."""
    p = questions[POSITION, q]
    b = 0 if p < start[1] else questions[SLOT_OF, q] + 1
    while b < to:  # swap q to the end of bucket b, which then shrinks by one
        end = start[b + 1] - 1
        other = questions[ORDER, end]
        questions[ORDER, p], questions[POSITION, other] = other, p
        questions[ORDER, end], questions[POSITION, q] = q, end
        start[b + 1] = p = end
        b += 1
    while b > to:  # swap q to the front of bucket b, which then shrinks by one
        first = start[b]
        other = questions[ORDER, first]
        questions[ORDER, p], questions[POSITION, other] = other, p
        questions[ORDER, first], questions[POSITION, q] = q, first
        p = first
        start[b] = first + 1
        b -= 1


@_kernel
def set_selectable(
    start: NDArray[np.int64], questions: NDArray[np.int64], q: int, selectable: bool
) -> None:
    """Adds ``q`` to (or removes it from) the selectable members of its slot."""
    _shift(start, questions, q, questions[SLOT_OF, q] + 1 if selectable else 0)


@_kernel
def _slot_of(
    table: NDArray[np.float64], num_questions: int, num_slots: int, log_asc: float, log_ppr: float
) -> tuple[int, int]:
    """The slot for scores ``(log_asc, log_ppr)`` (see :func:`move_question`) and the slots in use.

    A slot that takes new scores is ranked from scratch here.
    """
    empty = -1
    for s in range(num_slots):
        if table[LOG_ASC, s] == log_asc and table[LOG_PPR, s] == log_ppr:
            return s, num_slots
        if empty < 0 and table[COUNT, s] == 0.0:
            empty = s
    if empty < 0:
        empty = num_slots
        num_slots += 1
    table[LOG_ASC, empty] = log_asc
    table[LOG_PPR, empty] = log_ppr
    for r in range(2):
        above = 0.0
        for s in range(num_slots):
            above += table[COUNT, s] * np.sign(table[LOG_ASC + r, empty] - table[LOG_ASC + r, s])
        table[RANK_ASC + r, empty] = num_questions - above
    return empty, num_slots


@_kernel
def _rerank(table: NDArray[np.float64], num_slots: int, old: int, new: int) -> None:
    """Updates every slot's ranks for one question moving from slot ``old`` to slot ``new``."""
    for r in range(2):
        u_new = table[LOG_ASC + r, new]
        u_old = table[LOG_ASC + r, old]
        rank = table[RANK_ASC + r]
        # The question moves from u_old to u_new: each slot's sum changes by this.
        for s in range(num_slots):
            u = table[LOG_ASC + r, s]
            rank[s] += np.sign(u_new - u) - np.sign(u_old - u)


@_kernel
def move_question(
    table: NDArray[np.float64],
    start: NDArray[np.int64],
    questions: NDArray[np.int64],
    num_slots: int,
    q: int,
    log_asc: float,
    log_ppr: float,
    selectable: bool,
) -> int:
    """Moves question ``q`` to the slot of scores ``(log_asc, log_ppr)`` and updates every rank.

    The slot is one holding these scores (equal scores share their ranks),
    else an empty slot, else slot ``num_slots`` (which must fit in ``table``).
    Every slot's ranks stay current, empty or not, so a slot is ranked from
    scratch only when it takes new scores. ``q`` is then made selectable if
    ``selectable`` (it stays selectable if it was).

    Returns:
        The number of slots in use (``num_slots`` or one more).
    """
    new, num_slots = _slot_of(table, questions.shape[1], num_slots, log_asc, log_ppr)
    old = questions[SLOT_OF, q]
    if old != new:
        _rerank(table, num_slots, old, new)
        table[COUNT, old] -= 1.0
        table[COUNT, new] += 1.0
        if questions[POSITION, q] >= start[1]:
            _shift(start, questions, q, new + 1)
        questions[SLOT_OF, q] = new
    if selectable:
        _shift(start, questions, q, new + 1)
    return num_slots


@_kernel
def _score(table: NDArray[np.float64], s: int, w: float) -> float:
    return float(table[RANK_ASC, s] + w * (table[RANK_PPR, s] - table[RANK_ASC, s]))


@_kernel
def take_best(
    table: NDArray[np.float64],
    start: NDArray[np.int64],
    questions: NDArray[np.int64],
    num_slots: int,
    w: float,
    u: float,
) -> int:
    """Takes a selectable question of least ``(1 - w) rank_ASC + w rank_PPR``.

    Ties go to a question drawn uniformly, by ``u`` in [0, 1), among all the
    tied questions (not slots). The question taken is no longer selectable.

    Returns:
        The question, or -1 if none is selectable.
    """
    best = np.inf
    num_tied = 0
    for s in range(num_slots):
        size = start[s + 2] - start[s + 1]
        if size == 0:
            continue
        score = _score(table, s, w)
        if score < best:
            best = score
            num_tied = size
        elif score == best:
            num_tied += size
    if num_tied == 0:
        return -1
    pick = min(int(u * num_tied), num_tied - 1)
    for s in range(num_slots):
        size = start[s + 2] - start[s + 1]
        if size == 0 or _score(table, s, w) != best:
            continue
        if pick < size:
            q = questions[ORDER, start[s + 1] + pick]
            _shift(start, questions, q, 0)
            return int(q)
        pick -= size
    return -1
