"""What a trace says about itself: its confidence, read from its tokens' logprobs.

The measures are DeepConf's (Fu et al., 2025). A token's confidence is minus the mean of
its top-k logprobs: high where the model was sure of the token, near zero where many
tokens were about as likely. A trace's group confidence is that mean over a sliding
window of tokens; the trace is summed up by its mean, its lowest group and its tail (the
mean over its last tokens). Its trajectory is kept coarse: the mean confidence of each
block of tokens, from which the window confidence at every block's end, for any window of
whole blocks, can be computed again offline (a replayed cut mid-trace).

Pure: engines feed :class:`ConfidenceMeter` the logprobs they read, one token at a time,
and hand the :class:`Confidence` it sums up on their samples.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "MAX_TOP_LOGPROBS",
    "Confidence",
    "ConfidenceMeter",
    "ConfidenceSpec",
    "token_confidence",
]

#: The most top logprobs a token may ask for: the OpenAI API's bound, and vLLM's default
#: ``max_logprobs``.
MAX_TOP_LOGPROBS = 20
#: The smallest window a spec scaled to a short ``max_tokens`` keeps.
_MIN_WINDOW = 16
#: A window holds at least this many trajectory blocks.
_BLOCKS_PER_WINDOW = 4
#: Digits kept of each confidence written out.
_DIGITS = 4


@dataclass(frozen=True)
class ConfidenceSpec:
    """How a trace's confidence is read: ``top_logprobs`` per token (k), the sliding
    ``window`` of its groups and the ``tail`` it ends with, in tokens, and the ``block``
    of tokens each trajectory point sums up (0: no trajectory).

    The defaults are DeepConf's for reasoning traces (k = 20, windows of 2,048 tokens).
    """

    top_logprobs: int = MAX_TOP_LOGPROBS
    window: int = 2048
    tail: int = 2048
    block: int = 128

    def __post_init__(self) -> None:
        if not 1 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be 1..{MAX_TOP_LOGPROBS}, got {self.top_logprobs}")
        if self.window < 1 or self.tail < 1 or self.block < 0:
            raise ValueError("window and tail must be at least 1 token, block at least 0")

    def scaled(self, max_tokens: int | None) -> ConfidenceSpec:
        """This spec for traces of at most ``max_tokens``: a window (and tail) of more than
        an eighth of them would hold most of a short chain, its lowest group then no more
        than its mean; they shrink to that eighth (at least 16 tokens), and the block to a
        quarter of the window. None: unbounded traces, unchanged."""
        if max_tokens is None:
            return self
        window = min(self.window, max(_MIN_WINDOW, max_tokens // 8))
        tail = min(self.tail, window)
        block = min(self.block, max(1, window // _BLOCKS_PER_WINDOW)) if self.block else 0
        return replace(self, window=window, tail=tail, block=block)


def token_confidence(logprobs: Iterable[float], k: int) -> float | None:
    """Minus the mean of the ``k`` largest finite ``logprobs`` of a token (None: none is
    finite). An engine may send the sampled token's own logprob beside its top k, or fewer
    than k where the vocabulary was masked; the k largest are those of its top k."""
    finite = sorted((lp for lp in logprobs if math.isfinite(lp)), reverse=True)[:k]
    if not finite:
        return None
    return -math.fsum(finite) / len(finite)


@dataclass(frozen=True)
class Confidence:
    """A trace's confidence: its ``mean`` over ``tokens`` tokens, its ``lowest_group`` (the
    lowest mean over a sliding ``window``; the mean where the trace is shorter), its
    ``tail`` (the mean over its last tokens) and its trajectory: ``groups``, the mean of
    each ``block`` tokens in order (the last block may be shorter)."""

    mean: float
    lowest_group: float
    tail: float
    tokens: int = 0
    window: int = 0
    block: int = 0
    groups: tuple[float, ...] = field(default=(), repr=False)

    def to_json(self) -> dict[str, Any]:
        """The summary as a recording writes it (see :meth:`from_json`)."""
        summary: dict[str, Any] = {
            "mean": round(self.mean, _DIGITS),
            "lowest_group": round(self.lowest_group, _DIGITS),
            "tail": round(self.tail, _DIGITS),
            "tokens": self.tokens,
            "window": self.window,
        }
        if self.groups:
            summary["block"] = self.block
        return summary

    def groups_json(self) -> list[float]:
        """The trajectory as a recording writes it."""
        return [round(g, _DIGITS) for g in self.groups]

    @classmethod
    def from_json(cls, summary: Mapping[str, Any], groups: Iterable[Any] = ()) -> Confidence:
        """A recorded summary (``mean``, ``lowest_group``, ``tail``; ``tokens``, ``window``
        and ``block`` where known) and trajectory.

        Raises:
            ValueError: a measure missing or not a finite number.
        """
        mean, lowest, tail = (_measure(summary, name) for name in ("mean", "lowest_group", "tail"))
        tokens, window, block = (_count(summary, name) for name in ("tokens", "window", "block"))
        trajectory = tuple(groups)
        if not all(_finite(g) for g in trajectory):
            raise ValueError("groups must be finite numbers")
        if trajectory and not block:
            raise ValueError("groups need confidence.block, the tokens each sums up")
        return cls(mean, lowest, tail, tokens, window, block, tuple(map(float, trajectory)))

    def windows(self, blocks: int) -> Iterator[tuple[int, float]]:
        """The trajectory replayed: after each block from the ``blocks``-th on, the tokens
        read so far and the mean confidence of the last ``blocks`` blocks (a window of
        ``blocks * block`` tokens). Nothing without a trajectory."""
        if not self.groups or blocks < 1:
            return
        sizes = [self.block] * len(self.groups)
        sizes[-1] = self.tokens - self.block * (len(self.groups) - 1) or self.block
        read = 0
        for end in range(len(self.groups)):
            read += sizes[end]
            if end + 1 < blocks:
                continue
            start = end + 1 - blocks
            span = zip(self.groups[start : end + 1], sizes[start : end + 1], strict=True)
            total = sum(g * s for g, s in span)
            yield read, total / sum(sizes[start : end + 1])


def _measure(summary: Mapping[str, Any], name: str) -> float:
    value: Any = summary.get(name)
    if not _finite(value):
        raise ValueError(f"confidence.{name} must be a finite number, got {value!r}")
    return float(value)


def _count(summary: Mapping[str, Any], name: str) -> int:
    value = summary.get(name, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"confidence.{name} must be a count, got {value!r}")
    return value


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class ConfidenceMeter:
    """Reads a trace's confidence as its tokens come: :meth:`add` each token's top
    logprobs, :meth:`group` is the window's confidence so far, :meth:`summary` the
    trace's. Memory is bounded by the window and tail, plus one float a block."""

    def __init__(self, spec: ConfidenceSpec) -> None:
        self.spec = spec
        self.tokens = 0
        self._total = 0.0
        self._window: deque[float] = deque()
        self._window_sum = 0.0
        self._lowest = math.inf
        self._tail: deque[float] = deque(maxlen=spec.tail)
        self._groups: list[float] = []
        self._block_sum = 0.0
        self._block_tokens = 0

    def add(self, logprobs: Iterable[float]) -> None:
        """Reads one token from its top logprobs (a token none of which is finite is not
        counted)."""
        confidence = token_confidence(logprobs, self.spec.top_logprobs)
        if confidence is not None:
            self.add_confidence(confidence)

    def add_confidence(self, confidence: float) -> None:
        """Reads one token whose confidence is known (:func:`token_confidence`)."""
        self.tokens += 1
        self._total += confidence
        self._tail.append(confidence)
        self._window.append(confidence)
        self._window_sum += confidence
        if len(self._window) > self.spec.window:
            self._window_sum -= self._window.popleft()
        if len(self._window) == self.spec.window:
            self._lowest = min(self._lowest, self._window_sum / self.spec.window)
        if self.spec.block:
            self._block_sum += confidence
            self._block_tokens += 1
            if self._block_tokens == self.spec.block:
                self._groups.append(self._block_sum / self._block_tokens)
                self._block_sum, self._block_tokens = 0.0, 0

    def group(self) -> float | None:
        """The confidence of the last ``window`` tokens (None: fewer read yet)."""
        if len(self._window) < self.spec.window:
            return None
        return self._window_sum / len(self._window)

    def summary(self) -> Confidence | None:
        """The trace's confidence (None: no token read)."""
        if not self.tokens:
            return None
        mean = self._total / self.tokens
        groups = list(self._groups)
        if self._block_tokens:
            groups.append(self._block_sum / self._block_tokens)
        return Confidence(
            mean=mean,
            lowest_group=mean if math.isinf(self._lowest) else self._lowest,
            tail=math.fsum(self._tail) / len(self._tail),
            tokens=self.tokens,
            window=self.spec.window,
            block=self.spec.block,
            groups=tuple(groups),
        )
