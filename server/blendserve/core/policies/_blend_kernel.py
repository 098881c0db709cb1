"""Compiled inner loops of Blend-ASC (numba): rank updates and the argmin."""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray


@njit(cache=True, nogil=True)
def move_one(
    log_u: NDArray[np.float64],
    rank2: NDArray[np.float64],
    count: NDArray[np.float64],
    num_slots: int,
    old: int,
    new: int,
    created: bool,
    num_questions: int,
    new_asc: float,
    new_ppr: float,
) -> bool:
    """Moves one question from slot ``old`` to ``new`` and updates every slot's ranks.

    ``rank2[r, s]`` is the sum over questions t of ``1 + sign(u_t - u_s)`` for
    score row r (0: ASC, 1: PPR-1v1), i.e. twice the average rank plus one.
    A ``created`` slot gets the log uncertainties ``new_asc``, ``new_ppr`` and
    its ranks from scratch first.

    Returns:
        Whether slot ``old`` is now empty.
    """
    if created:
        log_u[0, new] = new_asc
        log_u[1, new] = new_ppr
    for r in range(2):
        u_new = log_u[r, new]
        u_old = log_u[r, old]
        if created:
            above = 0.0
            for s in range(num_slots):
                above += count[s] * np.sign(u_new - log_u[r, s])
            rank2[r, new] = num_questions - above
        for s in range(num_slots):
            u = log_u[r, s]
            rank2[r, s] += np.sign(u_new - u) - np.sign(u_old - u)
    count[old] -= 1.0
    count[new] += 1.0
    return bool(count[old] == 0.0)


@njit(cache=True, nogil=True)
def best_slots(
    rank2: NDArray[np.float64],
    blocked: NDArray[np.bool_],
    num_slots: int,
    w: float,
    out: NDArray[np.int64],
) -> int:
    """Writes the selectable slots of least ``(1 - w) rank_ASC + w rank_PPR`` to ``out``.

    Returns:
        How many slots tie for the least score (0 if none is selectable).
    """
    best = np.inf
    num_tied = 0
    for s in range(num_slots):
        if blocked[s]:
            continue
        score = rank2[0, s] + w * (rank2[1, s] - rank2[0, s])
        if score < best:
            best = score
            out[0] = s
            num_tied = 1
        elif score == best:
            out[num_tied] = s
            num_tied += 1
    return num_tied
