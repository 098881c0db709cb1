"""A reasoning model's completion read as its thought and its final answer.

Only the final answer may vote: a number or a ``\\boxed{}`` in a thought is a step.
:func:`read_thought` reads what a model writes when no reasoning parser split it
upstream: the text after the last closing tag (with or without the opening one), or
harmony's last ``final`` message (gpt-oss), with or without its special tokens
(docs/solve.md, "Reasoning models"). A thought that opens and never closes is *cut*:
the sample ran out of tokens thinking and has no final answer. Text with no marker
is all answer. Every scan here is linear in the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEFAULT_REASONING_TAGS", "ReasoningTags", "Thought", "read_thought"]


@dataclass(frozen=True)
class ReasoningTags:
    """The markers around a model's thought: ``<think>`` and ``</think>`` by default."""

    open: str = "<think>"
    close: str = "</think>"

    def __post_init__(self) -> None:
        if not self.open.strip() or not self.close.strip():
            raise ValueError("reasoning tags must not be empty")
        if self.open == self.close:
            raise ValueError(f"the opening and closing reasoning tags are the same: {self.open!r}")

    @classmethod
    def parse(cls, text: str) -> ReasoningTags:
        """The tags of ``"open,close"`` (``"<think>,</think>"``), whitespace around each dropped.

        Raises:
            ValueError: not two non-empty, different tags.
        """
        parts = [part.strip() for part in text.split(",")]
        if len(parts) != 2:
            raise ValueError(f"reasoning tags are 'open,close' (e.g. '<think>,</think>'): {text!r}")
        return cls(parts[0], parts[1])


#: ``<think>`` and ``</think>``: DeepSeek-R1 and its distills, Qwen3, QwQ.
DEFAULT_REASONING_TAGS = ReasoningTags()


@dataclass(frozen=True)
class Thought:
    """One completion, read as a thought and a final answer.

    ``content`` is the final answer's text, what extraction reads (everything when
    there is no thought); ``reasoning`` the thought without its markers; ``cut``: the
    thought never closed, so the sample has no final answer.
    """

    content: str
    reasoning: str | None = None
    cut: bool = False


# Harmony's special tokens (gpt-oss): a message is <|channel|>NAME...<|message|>TEXT<|end|>.
_HARMONY_TOKEN_RE = re.compile(r"<\|(channel|message|end|return|call|start)\|>")
_HARMONY_ENDS = frozenset({"end", "return", "call", "start", "channel"})
# The same output with its special tokens skipped: "analysis...assistantfinal...".
_SKIPPED_ANALYSIS = "analysis"
_SKIPPED_FINAL = "assistantfinal"


def _joined(parts: list[str]) -> str | None:
    text = "\n\n".join(part.strip() for part in parts if part.strip())
    return text or None


def _harmony(text: str) -> Thought:
    """The last ``final`` message and the ``analysis`` ones, of harmony-formatted ``text``."""
    messages: list[tuple[str, str]] = []  # (channel, text)
    header = body = -1
    channel = ""
    for token in _HARMONY_TOKEN_RE.finditer(text):
        name = token.group(1)
        if body >= 0 and name in _HARMONY_ENDS:
            messages.append((channel, text[body : token.start()]))
            body = -1
        if name == "channel":
            header = token.end()
        elif name == "message" and header >= 0:
            words = text[header : token.start()].split()
            channel, header, body = (words[0] if words else ""), -1, token.end()
    if body >= 0:  # the last message never ended: it ran to the end of the text
        messages.append((channel, text[body:]))
    finals = [message for name, message in messages if name == "final"]
    reasoning = _joined([message for name, message in messages if name == "analysis"])
    if not finals:
        return Thought("", reasoning, cut=True)
    return Thought(finals[-1].strip(), reasoning)


def _skipped_harmony(text: str) -> Thought | None:
    """Harmony with its special tokens skipped, or None when ``text`` is not that."""
    start = text.lstrip()
    if not start.startswith(_SKIPPED_ANALYSIS):
        return None
    final = start.rfind(_SKIPPED_FINAL)
    if final < 0:
        return None
    reasoning = start[len(_SKIPPED_ANALYSIS) : final].strip()
    return Thought(start[final + len(_SKIPPED_FINAL) :].strip(), reasoning or None)


def read_thought(text: str, tags: ReasoningTags = DEFAULT_REASONING_TAGS) -> Thought:
    """``text``, a completion as the model wrote it, as a thought and a final answer."""
    if "<|channel|>" in text:
        return _harmony(text)
    if _SKIPPED_FINAL in text:
        skipped = _skipped_harmony(text)
        if skipped is not None:
            return skipped
    close = text.rfind(tags.close)
    if close < 0:
        opened = text.find(tags.open)
        if opened < 0:
            return Thought(text)
        unclosed = text[opened + len(tags.open) :].strip()
        return Thought(text[:opened].strip(), unclosed or None, cut=True)
    thought, answer = text[:close].lstrip(), text[close + len(tags.close) :]
    if thought.startswith(tags.open):
        thought = thought[len(tags.open) :]
    reopened = answer.find(tags.open)
    if reopened >= 0:  # a second thought opened after the last close, and never closed
        reasoning = _joined([thought, answer[reopened + len(tags.open) :]])
        return Thought(answer[:reopened].strip(), reasoning, cut=True)
    return Thought(answer.lstrip(), thought.strip() or None)
