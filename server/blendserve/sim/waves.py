"""A batch policy run in waves, as a job on an idle engine runs it.

Every question's wave of a round is sent at once and comes back before the
next round is planned (an engine with room for all of them, every request
taking the same time): the rounds are the job's wall time in waves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from blendserve.core.policies import PolicySpec
from blendserve.core.waves import WavePlan
from blendserve.sim.data import Dataset
from blendserve.sim.runner import AnswerDraws, build_policy

__all__ = ["WaveRun", "run_waves"]


@dataclass
class WaveRun:
    """One batch run in waves: ``num_wrong`` questions whose voted answer is not the true
    mode, samples ``spent``, per question the ``rounds`` it took part in (planned samples
    or not), and the batch's ``waves`` (its wall time in waves)."""

    num_wrong: int
    spent: int
    rounds: NDArray[np.int64]
    waves: int


def run_waves(
    dataset: Dataset, spec: PolicySpec, budget: int, seed: int, plan: WavePlan | None = None
) -> WaveRun:
    """Runs ``spec`` over ``dataset`` in the waves of ``plan`` (the default plan if None).

    The policy must plan waves (:meth:`~blendserve.core.policies.AllocationPolicy.plan_waves`).
    """
    plan = plan or WavePlan()
    policy = build_policy(spec, dataset, budget, seed)
    draws = AnswerDraws(dataset, seed)
    rounds = np.zeros(dataset.num_questions, dtype=np.int64)
    waves = 0
    sizes = policy.plan_waves(plan, rounds.tolist())
    while sizes:
        sent = [(q, policy.assign(q, k)) for q, k in sizes.items()]
        if not any(k for _, k in sent):
            break
        waves += 1
        for q, k in sent:
            rounds[q] += 1  # a round passes for a question planned none too
            for _ in range(k):
                policy.observe(q, draws.next(q))
        sizes = policy.plan_waves(plan, rounds.tolist())
    leaders = policy.votes.leaders
    num_wrong = sum(leader != 0 for leader in leaders)
    return WaveRun(num_wrong, policy.num_dispatched, rounds, waves)
