"""What a trace's own signals decide: how much its vote counts, and whether it is cut.

One model, one place. A :class:`TraceRule` is what a request asks for, in the method
grammar of :mod:`blendserve.core.options`: ``vote[:key=value,...]``

- ``count`` (the default): every vote counts one; nothing is read from a trace.
- ``weighted``: a vote counts by how its trace's measure ranks among the traffic's.
- ``filter``: DeepConf's filter: while a question is sampled, a vote whose measure ranks
  in the least confident ``1 - keep`` of the traffic's all but stops counting; its
  answer is the one most of its own most confident ``keep`` share gave (a larger share
  as the signal is weaker).

and its options: ``measure`` (``tail``, ``mean``, ``lowest_group``, ``length`` or
``auto``), ``keep`` (the filter's share), ``cut`` (a trace whose window confidence falls
below this percentile of the traffic's finished traces' lowest groups is cut
mid-stream: DeepConf's online bar, learned rather than warmed up per question) and
``first_m`` (a wave's first ``m`` finishers vote; the rest are cut: short-m@k, which
bets that shorter samples are right more often, so it acts only once ``length`` has
shown that it is so).

A :class:`TraceLearner` is what one client's traffic taught: each answered question
hands it its voting samples, labelled by whether they gave the answer most of them gave
(no answer key is needed). From them it measures, for each measure, whether samples
that agree score higher than those that do not *within a question* (a one-sided rank
test). A measure that has not shown that, at a strict level, weighs nothing and cuts
nothing: where the signal is noise, a rule other than ``count`` changes nothing.

Pure: the scheduler and the simulator feed it and read it alike.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from scipy import stats

from blendserve.core.options import Option, parse_spec, spec_pattern
from blendserve.core.signals import Confidence

__all__ = [
    "LOW_CONFIDENCE",
    "MEASURES",
    "STOPS",
    "TRACE_OPTIONS",
    "TRACE_RULE_PATTERN",
    "VOTES",
    "TraceFacts",
    "TraceLearner",
    "TraceRule",
    "measure_of",
    "parse_trace_rule",
]

Measure = Literal["tail", "mean", "lowest_group", "length"]
#: The measures a rule may weigh or filter by, each "higher is more likely right".
MEASURES: tuple[Measure, ...] = ("tail", "mean", "lowest_group", "length")
#: How votes count.
VOTES = ("count", "weighted", "filter")
#: Why a sample stopped, as answers, metrics and recordings name it: it ended on its
#: own; its question settled while it ran; its confidence fell below the bar; it was
#: not among its wave's first ``m``; the job's budget or time ran out under it.
STOPS = ("finished", "settled", "low_confidence", "first_m", "budget")
#: The finish reason of a sample cut mid-stream for low confidence.
LOW_CONFIDENCE = "low_confidence"

#: Labelled samples a learner keeps per measure (the oldest go first).
MEMORY = 4096
#: A measure is trusted only once this many samples on each side (agreed, not) are kept.
MIN_EACH = 40
#: The one-sided p-value below which a measure is trusted. Strict: the test is run again
#: as traffic comes, and a measure that is noise must almost never pass by chance.
SIGNIFICANCE = 1e-3
#: The test is run again after this many new labelled samples.
RETEST_EVERY = 64
#: The least a vote counts: a filtered vote decides only where nothing else votes.
FLOOR = 0.01


def _unit_share(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise ValueError("must be in (0, 1]")
    return value


def _percentile(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 100.0:
        raise ValueError("must be in (0, 100)")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _measure(text: str) -> str:
    if text not in (*MEASURES, "auto"):
        raise ValueError(f"must be one of {', '.join((*MEASURES, 'auto'))}")
    return text


#: The options of a rule, with the patterns its schema documents.
TRACE_OPTIONS = {
    "measure": Option(_measure, "(" + "|".join((*MEASURES, "auto")) + ")"),
    "keep": Option(_unit_share, r"[0-9.]+"),
    "cut": Option(_percentile, r"[0-9.]+"),
    "first_m": Option(_positive, r"[0-9]+"),
}
#: The regular expression of a rule's text.
TRACE_RULE_PATTERN = spec_pattern(VOTES, TRACE_OPTIONS)


@dataclass(frozen=True)
class TraceRule:
    """How a request's traces vote and when they are cut (see the module)."""

    vote: str = "count"
    measure: str = "auto"
    keep: float = 0.9
    cut: float | None = None
    first_m: int | None = None

    def __post_init__(self) -> None:
        if self.vote not in VOTES:
            raise ValueError(f"vote must be one of {', '.join(VOTES)}, got {self.vote!r}")
        _measure(self.measure)
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"keep must be in (0, 1], got {self.keep}")
        if self.cut is not None and not 0.0 < self.cut < 100.0:
            raise ValueError(f"cut must be a percentile in (0, 100), got {self.cut}")
        if self.first_m is not None and self.first_m < 1:
            raise ValueError(f"first_m must be at least 1, got {self.first_m}")

    @property
    def is_count(self) -> bool:
        """Whether the rule is plain counting: nothing weighed, nothing cut."""
        return self.vote == "count" and self.cut is None and self.first_m is None

    @property
    def reads_confidence(self) -> bool:
        """Whether the rule needs each trace's confidence (its logprobs asked for)."""
        return self.cut is not None or (self.vote != "count" and self.measure != "length")

    @property
    def learns(self) -> bool:
        """Whether the rule reads what the traffic taught (weights, a bar, or whether
        length tells, for ``first_m``)."""
        return not self.is_count

    def __str__(self) -> str:
        options = [f"measure={self.measure}"] if self.vote != "count" else []
        if self.vote == "filter":
            options.append(f"keep={self.keep:g}")
        if self.cut is not None:
            options.append(f"cut={self.cut:g}")
        if self.first_m is not None:
            options.append(f"first_m={self.first_m}")
        return self.vote + (":" + ",".join(options) if options else "")


def parse_trace_rule(text: str) -> TraceRule:
    """The rule ``vote[:key=value,...]`` names.

    Raises:
        ValueError: an unknown vote or option, or a bad value.
    """
    vote, options = parse_spec(text, TRACE_OPTIONS)
    return TraceRule(vote, **options)


def measure_of(measure: str, tokens: int, confidence: Confidence | None) -> float | None:
    """A trace's ``measure``, higher meaning more likely right (None: not read)."""
    if measure == "length":
        return -float(tokens)
    if confidence is None:
        return None
    value: float = getattr(confidence, measure)
    return value


@dataclass(frozen=True)
class TraceFacts:
    """A sample that voted in an answered question: its ``tokens``, ``confidence`` (None:
    not read) and whether its answer was the question's (``agreed``)."""

    tokens: int
    confidence: Confidence | None
    agreed: bool


@dataclass
class _Learned:
    """One measure's labelled samples: the value centred on its question's mean (what the
    test reads), the raw value (what ranks a new trace) and the label."""

    centred: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=MEMORY))
    raw: deque[float] = field(default_factory=lambda: deque(maxlen=MEMORY))
    since_test: int = 0
    strength: float = 0.0
    p_value: float = 1.0
    sorted_raw: list[float] = field(default_factory=list)


class TraceLearner:
    """What one stream of traffic taught about its traces (see the module): per measure,
    whether it tells agreeing samples from the rest within a question, how strongly, and
    where a new trace's value ranks among those seen."""

    def __init__(self) -> None:
        self._measures: dict[str, _Learned] = {m: _Learned() for m in MEASURES}

    def learn(self, samples: Sequence[TraceFacts]) -> None:
        """Takes one answered question's voting samples. A question whose samples all
        agreed (or none did) still ranks new traces but says nothing of the signal."""
        for measure, learned in self._measures.items():
            values = [
                (v, s.agreed)
                for s in samples
                if (v := measure_of(measure, s.tokens, s.confidence)) is not None
            ]
            if not values:
                continue
            centre = math.fsum(v for v, _ in values) / len(values)
            for value, agreed in values:
                learned.centred.append((value - centre, agreed))
                learned.raw.append(value)
            learned.since_test += len(values)
            if learned.since_test >= RETEST_EVERY:
                self._test(learned)

    @staticmethod
    def _test(learned: _Learned) -> None:
        learned.since_test = 0
        learned.sorted_raw = sorted(learned.raw)
        right = [v for v, agreed in learned.centred if agreed]
        wrong = [v for v, agreed in learned.centred if not agreed]
        if len(right) < MIN_EACH or len(wrong) < MIN_EACH:
            learned.strength, learned.p_value = 0.0, 1.0
            return
        test = stats.mannwhitneyu(right, wrong, alternative="greater")
        auroc = float(test.statistic) / (len(right) * len(wrong))
        learned.p_value = float(test.pvalue)
        # Full weight once agreeing samples outrank the rest three times in four.
        learned.strength = min(1.0, 4.0 * (auroc - 0.5)) if learned.p_value < SIGNIFICANCE else 0.0

    def strength(self, measure: str) -> float:
        """How strongly ``measure`` told agreeing samples from the rest, in [0, 1] (0: it
        has not shown it does)."""
        return self._measures[measure].strength

    def chosen(self, rule: TraceRule, reads_confidence: bool = True) -> str:
        """The measure ``rule`` weighs by: its own, or with ``auto`` the strongest so far
        among those the traces carry (``length`` alone where no confidence is read)."""
        if rule.measure != "auto":
            return rule.measure
        usable = MEASURES if reads_confidence else ("length",)
        return max(usable, key=lambda m: (self.strength(m), m == "tail"))

    def rank(self, measure: str, value: float) -> float:
        """The share of the traffic's traces whose ``measure`` is below ``value``."""
        seen = self._measures[measure].sorted_raw
        if not seen:
            return 0.5
        return bisect.bisect_left(seen, value) / len(seen)

    def weight(self, rule: TraceRule, tokens: int, confidence: Confidence | None) -> float:
        """What a vote counts under ``rule``, in [:data:`FLOOR`, 1]: 1 with ``count``, with
        a measure that has not shown a signal, or where the trace's measure was not read.

        ``weighted``: ``1 - strength * max(0, 1 - 2 * rank)``: the more confident half of
        the traffic counts whole, the least confident trace ``1 - strength``.
        ``filter``: the least confident ``1 - keep`` all but stop counting (fewer where the
        signal is weaker, :meth:`kept_share`).
        """
        if rule.vote == "count":
            return 1.0
        measure = self.chosen(rule, confidence is not None)
        strength = self.strength(measure)
        value = measure_of(measure, tokens, confidence)
        if strength <= 0.0 or value is None:
            return 1.0
        rank = self.rank(measure, value)
        if rule.vote == "filter":
            return FLOOR if rank < 1.0 - self.kept_share(rule, strength) else 1.0
        return max(FLOOR, 1.0 - strength * max(0.0, 1.0 - 2.0 * rank))

    @staticmethod
    def kept_share(rule: TraceRule, strength: float) -> float:
        """The share of votes a filter keeps at a measure's ``strength``: ``keep`` at full
        strength, more as the signal is weaker (all at none), so that a weak signal never
        leaves a question's answer to a few of its votes."""
        return 1.0 - strength * (1.0 - rule.keep)

    def bar(self, rule: TraceRule) -> float | None:
        """The window confidence below which a trace of ``rule`` is cut mid-stream: the
        ``cut`` percentile of the traffic's lowest groups, once the lowest group has shown
        that it tells agreeing samples from the rest (None: no cut)."""
        if rule.cut is None:
            return None
        learned = self._measures["lowest_group"]
        if learned.strength <= 0.0 or not learned.sorted_raw:
            return None
        seen = learned.sorted_raw
        return seen[min(len(seen) - 1, int(len(seen) * rule.cut / 100.0))]

    def kept_answer(
        self, rule: TraceRule, voters: Sequence[tuple[Hashable, int, Confidence | None]]
    ) -> Hashable | None:
        """With ``filter``, once its measure has shown a signal: DeepConf's filter within
        one question, the answer most of the share of its ``voters`` (key, tokens,
        confidence) that score highest gave (:meth:`kept_share`; a tie: the one the surest
        of them gave). None: the weighted vote stands."""
        if rule.vote != "filter" or not voters:
            return None
        measure = self.chosen(rule, any(c is not None for _, _, c in voters))
        strength = self.strength(measure)
        if strength <= 0.0:
            return None
        scored = [
            (value, key)
            for key, tokens, confidence in voters
            if (value := measure_of(measure, tokens, confidence)) is not None
        ]
        if not scored:
            return None
        scored.sort(key=lambda pair: -pair[0])  # stable: equal scores in the order voted
        share = self.kept_share(rule, strength)
        kept = [key for _, key in scored[: max(1, math.ceil(share * len(scored)))]]
        counts = Counter(kept)
        most = max(counts.values())
        return next(key for key in kept if counts[key] == most)

    def first_m(self, rule: TraceRule) -> int | None:
        """The ``first_m`` of ``rule`` once the traffic has shown that shorter samples agree
        more often (None: no wave is cut short)."""
        if rule.first_m is None or self.strength("length") <= 0.0:
            return None
        return rule.first_m

    def summary(self) -> dict[str, float]:
        """Each measure's strength, for logs and ``/health``."""
        return {m: learned.strength for m, learned in self._measures.items()}
