"""One simulated run: a policy spends a budget on draws from the true distributions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from blendserve.core.policies import AllocationPolicy, PolicySpec
from blendserve.core.votes import VoteState
from blendserve.sim.data import Dataset

__all__ = ["AnswerDraws", "PolicyRun", "build_policy", "run_policy", "run_sc", "trace_policy"]

_CHUNK = 32


class AnswerDraws:
    """Independent answer streams, one per question, reproducible per seed.

    The k-th draw of question q depends only on ``(seed, q, k)``, so every
    policy run with the same seed sees the same answers (common random
    numbers make the comparison between policies sharper). Answer 0 is the
    question's true mode.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self._cum = [np.cumsum(p) for p in dataset.probs]
        self._seed = seed
        # question -> generator / buffered draws / next position in the buffer
        self._gens: list[np.random.Generator | None] = [None] * dataset.num_questions
        self._buffers: list[list[int]] = [[] for _ in range(dataset.num_questions)]
        self._pos = [0] * dataset.num_questions

    def next(self, q: int) -> int:
        """The next answer of question ``q``."""
        pos = self._pos[q]
        buffer = self._buffers[q]
        if pos == len(buffer):
            gen = self._gens[q]
            if gen is None:
                gen = self._gens[q] = np.random.default_rng((self._seed, q))
            cum = self._cum[q]
            draws = np.searchsorted(cum, gen.random(_CHUNK) * cum[-1], side="right")
            buffer = self._buffers[q] = np.minimum(draws, len(cum) - 1).tolist()
            pos = 0
        self._pos[q] = pos + 1
        return buffer[pos]


def build_policy(spec: PolicySpec, dataset: Dataset, budget: int, seed: int) -> AllocationPolicy:
    """The policy of ``spec`` for ``dataset``; the oracle is given the true margins."""
    extra: dict[str, Any] = {"seed": seed}
    if spec.name == "oracle":
        extra["margins"] = dataset.margins().tolist()
    return spec.build(dataset.num_questions, budget, **extra)


@dataclass(frozen=True)
class PolicyRun:
    """One run of a policy: ``wrong[t]``, the questions whose plurality answer differs from
    the true mode after ``t + 1`` samples, and ``questions[t]``, the question the
    ``t + 1``-th sample went to."""

    wrong: NDArray[np.int32]
    questions: NDArray[np.int32]


def trace_policy(
    dataset: Dataset, spec: PolicySpec, budget: int, seed: int, batch: int = 1
) -> PolicyRun:
    """Runs ``spec`` on ``budget`` samples until they are spent or it stops.

    ``seed`` seeds both the answer draws and the policy's tie-break; ``batch`` is
    the questions selected per decision (paper, "batched prompts"). A question with
    no sample counts as wrong.
    """
    policy = build_policy(spec, dataset, budget, seed)
    draws = AnswerDraws(dataset, seed)
    leaders = policy.votes.leaders
    num_wrong = dataset.num_questions
    wrong: list[int] = []
    questions: list[int] = []
    while True:
        chosen = policy.select(batch)
        if not chosen:
            break
        for q in chosen:
            was_right = leaders[q] == 0
            policy.observe(q, draws.next(q))
            num_wrong += was_right - (leaders[q] == 0)
            wrong.append(num_wrong)
            questions.append(q)
    return PolicyRun(np.asarray(wrong, dtype=np.int32), np.asarray(questions, dtype=np.int32))


def run_policy(
    dataset: Dataset, spec: PolicySpec, budget: int, seed: int, batch: int = 1
) -> NDArray[np.int32]:
    """``wrong[t]`` of :func:`trace_policy`: questions whose plurality answer differs from
    the true mode after ``t + 1`` samples."""
    return trace_policy(dataset, spec, budget, seed, batch).wrong


def run_sc(dataset: Dataset, max_samples: int, seed: int) -> NDArray[np.int32]:
    """Vanilla SC, directly: ``wrong[x - 1]`` after x samples of every question.

    Equals :class:`~blendserve.core.policies.SCPolicy` at whole budgets (the
    same draws and the same vote), without the per-decision bookkeeping.
    """
    draws = AnswerDraws(dataset, seed)
    votes = VoteState(dataset.num_questions)
    wrong = []
    for _ in range(max_samples):
        for q in range(dataset.num_questions):
            votes.add(q, draws.next(q))
        wrong.append(sum(leader != 0 for leader in votes.leaders))
    return np.asarray(wrong, dtype=np.int32)
