"""What one question's samples brought, and the answer event it makes: shared by jobs and pools.

Every sample a job or a pool takes passes through a question's :class:`Ballots`; with a
:class:`SampleLog`, each is kept there (its key, length, finish and confidence, never its
text) and handed to the log once the question is done with, answered or let go.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from blendserve.answers import DEFAULT_REASONING_TAGS, ReasoningTags, SampleKeyer
from blendserve.core.signals import Confidence as TraceConfidence
from blendserve.core.traces import LOW_CONFIDENCE, STOPS, TraceFacts, TraceLearner, TraceRule
from blendserve.core.uncertainty import asc_log_uncertainty, ppr_log_uncertainty
from blendserve.core.votes import VoteState
from blendserve.engines.base import Sample
from blendserve.scheduler.events import AnswerEvent, Confidence, Usage
from blendserve.scheduler.spec import Keyer, Question

__all__ = ["TRUNCATED_LIMIT", "Ballots", "SampleLog", "SeenSample", "reasoning_tags_of"]

#: Samples cut at ``max_tokens`` since the question's last vote after which it
#: stops (``stopped="truncated"``): its samples keep being cut, and more would too.
TRUNCATED_LIMIT = 3


def reasoning_tags_of(keyer: Keyer) -> ReasoningTags:
    """The thought markers ``keyer`` reads with (a plain callable: the defaults)."""
    return keyer.reasoning_tags if isinstance(keyer, SampleKeyer) else DEFAULT_REASONING_TAGS


@dataclass(frozen=True, slots=True)
class SeenSample:
    """One sample a question took: its voting ``key`` (None: it abstained, or was cut), its
    ``completion_tokens``, ``finish_reason`` and ``stop_reason`` as its engine reported
    them, its trace ``confidence`` where its request asked for logprobs, and why it stopped
    (``stopped``: ``finished`` on its own, or ``low_confidence`` when cut mid-stream)."""

    key: str | None
    completion_tokens: int
    finish_reason: str | None
    stop_reason: str | None = None
    confidence: TraceConfidence | None = None
    stopped: str = "finished"


class SampleLog(Protocol):
    """Where jobs and pools hand each question's samples once it is done with them."""

    def question_done(self, question: Question, samples: Sequence[SeenSample]) -> None:
        """``question`` took ``samples``, in the order they came: every one that voted or
        abstained in it, those that came after it settled but before its answer was
        made included. Called once a question, on the event loop: it must not block."""


@dataclass
class Ballots:
    """Per answer key, the first answer, completion, thought and finish reason seen; the
    last abstention; the samples cut at ``max_tokens``; the tokens spent. The votes
    themselves live in a :class:`VoteState`. ``seen``: every sample added, in order, where
    a :class:`SampleLog` will take them (None: not kept). ``voters``: each voting sample's
    key, tokens and confidence, where a trace rule learns from them (None: not kept).
    ``stops`` counts the question's samples by why they stopped
    (:data:`~blendserve.core.traces.STOPS`), ``cut_tokens`` the completion tokens of
    those cut mid-stream for low confidence."""

    # canonical key -> (first extracted answer, its completion)
    answers: dict[str, tuple[str, str]] = field(default_factory=dict)
    finish_reasons: dict[str, str | None] = field(default_factory=dict)
    thoughts: dict[str, str] = field(default_factory=dict)  # key -> its completion's thought
    usage: Usage = field(default_factory=Usage)
    abstained: str | None = None  # the last completion with no answer
    abstained_finish_reason: str | None = None
    abstained_thought: str | None = None
    truncated: int = 0  # samples cut at max_tokens since the last vote
    last_truncated: str | None = None  # the last of them
    last_truncated_thought: str | None = None
    stopped: str | None = None  # why the question stopped early ("truncated", "horizon")
    seen: list[SeenSample] | None = None
    voters: list[tuple[str, int, TraceConfidence | None]] | None = None
    stops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STOPS, 0))
    cut_tokens: int = 0

    @classmethod
    def kept_for(cls, log: SampleLog | None, learns: bool = False) -> Ballots:
        """Fresh ballots that keep their samples where ``log`` will take them, and their
        voters' signals where a trace rule ``learns`` from them."""
        return cls(seen=[] if log is not None else None, voters=[] if learns else None)

    def stopped_in_flight(self, reason: str, n: int) -> None:
        """Counts ``n`` samples cancelled in flight for ``reason`` (one of ``STOPS``)."""
        self.stops[reason] += n

    def facts(self) -> list[TraceFacts]:
        """The voting samples kept, labelled by whether they voted for the answer most of
        them gave, each counting one whatever a trace rule weighed it: a label must not
        follow from what the learner taught, or a rule that answers by confidence would
        teach it that confidence agrees."""
        voters = self.voters or []
        counts = Counter(key for key, _, _ in voters)
        plurality = counts.most_common(1)[0][0] if counts else None
        return [
            TraceFacts(tokens, confidence, key == plurality) for key, tokens, confidence in voters
        ]

    def hand_over(self, question: Question, log: SampleLog | None) -> None:
        """Hands the samples kept to ``log`` as ``question``'s, once: later calls, and a
        question with no sample, hand nothing."""
        seen = self.seen
        if log is None or not seen:
            return
        self.seen = []
        log.question_done(question, seen)

    @property
    def is_cut(self) -> bool:
        """Whether ``TRUNCATED_LIMIT`` samples were cut at ``max_tokens`` since the last vote."""
        return self.truncated >= TRUNCATED_LIMIT

    def stop_if_cut(self) -> bool:
        """Marks a cut question ``stopped="truncated"``; whether it was just stopped."""
        if self.stopped is not None or not self.is_cut:
            return False
        self.stopped = "truncated"
        return True

    async def add(self, sample: Sample, keyer: Keyer) -> str | None:
        """Keys one sample's final answer, keeping what an answer needs; its key (None: abstains).

        A reasoning model's thought never votes: the keyer reads the final
        answer alone (:meth:`Sample.thought`, with the keyer's tags). A sample
        cut at ``max_tokens``, or whose thought never closed (its finish
        reason is then ``length``), is truncated: it never votes, and
        ``TRUNCATED_LIMIT`` of them since the last vote make the question cut
        (:attr:`is_cut`). A sample cut mid-stream for low confidence
        (:data:`~blendserve.core.traces.LOW_CONFIDENCE`) abstains, and is not truncated.
        """
        thought = sample.thought(reasoning_tags_of(keyer))
        low = sample.finish_reason == LOW_CONFIDENCE
        finish_reason = "length" if thought.cut and not low else sample.finish_reason
        text, reasoning = thought.content, thought.reasoning
        truncated = finish_reason == "length"
        if truncated:
            self.truncated += 1
            self.last_truncated, self.last_truncated_thought = text, reasoning
        stopped = LOW_CONFIDENCE if low else "finished"
        self.stops[stopped] += 1
        if low:
            self.cut_tokens += sample.completion_tokens
        answer, key = (None, None) if truncated or low else await keyer(text)
        if key is None:
            self.abstained, self.abstained_thought = text, reasoning
            self.abstained_finish_reason = finish_reason
        else:
            self.truncated = 0
            if key not in self.answers:
                self.answers[key] = (answer if answer is not None else key, text)
                self.finish_reasons[key] = finish_reason
                if reasoning is not None:
                    self.thoughts[key] = reasoning
            if self.voters is not None:
                self.voters.append((key, sample.completion_tokens, sample.confidence))
        self.usage.add(
            Usage(1, sample.prompt_tokens, sample.completion_tokens, sample.reasoning_tokens)
        )
        if self.seen is not None:
            self.seen.append(
                SeenSample(
                    key,
                    sample.completion_tokens,
                    sample.finish_reason,
                    sample.stop_reason,
                    sample.confidence,
                    stopped,
                )
            )
        return key

    def answer_event(
        self,
        votes: VoteState,
        q: int,
        *,
        index: int,
        id: str,
        settled_early: bool,
        partial: bool,
        learner: TraceLearner | None = None,
        rule: TraceRule | None = None,
    ) -> AnswerEvent:
        """Question ``q`` of ``votes`` answered now: its winner, votes and confidence. The
        winner is the vote's, or where a ``rule`` filters, the answer its ``learner`` keeps
        (:meth:`~blendserve.core.traces.TraceLearner.kept_answer`)."""
        n1, n2, num_distinct = votes.state(q)
        kept = None
        if learner is not None and rule is not None and self.voters:
            kept = learner.kept_answer(rule, self.voters)
        key = kept if kept is not None else votes.answer(q)
        winner_key = str(key) if key is not None else None
        counts = {str(k): v for k, v in votes.counts[q].items()}
        winner = self.answers.get(winner_key) if winner_key is not None else None
        abstained, abstained_finish = self.abstained, self.abstained_finish_reason
        abstained_thought = self.abstained_thought
        if self.stopped == "truncated" and winner is None:
            abstained, abstained_finish = self.last_truncated, "length"  # why it stopped
            abstained_thought = self.last_truncated_thought
        return AnswerEvent(
            index=index,
            id=id,
            answer=winner[0] if winner else None,
            key=winner_key,
            votes=counts,
            samples=votes.num_samples[q],
            confidence=Confidence(
                asc=math.exp(asc_log_uncertainty(n1, n2)),
                ppr=math.exp(min(700.0, ppr_log_uncertainty(n1, n2, num_distinct))),
                share=n1 / sum(counts.values()) if counts else 0.0,
            ),
            settled_early=settled_early,
            completion=winner[1] if winner else None,
            usage=self.usage,
            partial=partial,
            candidates={
                k: self.answers[k]
                for k in sorted(counts, key=lambda k: (k != winner_key, -counts[k]))
            },
            abstained=abstained,
            finish_reasons={k: self.finish_reasons[k] for k in counts},
            abstained_finish_reason=abstained_finish,
            stopped=self.stopped,
            thoughts={k: self.thoughts[k] for k in counts if k in self.thoughts},
            abstained_thought=abstained_thought,
            stops=dict(self.stops),
            cut_tokens=self.cut_tokens,
        )
