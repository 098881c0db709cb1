"""Policy names and option strings such as ``asc:cap=16`` or ``esc:window=8``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from blendserve.core.options import Option, parse_spec, spec_pattern
from blendserve.core.policies.base import AllocationPolicy
from blendserve.core.policies.blend import BlendPolicy
from blendserve.core.policies.hedge import RANKS, HedgePolicy
from blendserve.core.policies.priority import (
    ASCPolicy,
    ESCPolicy,
    OraclePolicy,
    PPRPolicy,
    SCPolicy,
)

__all__ = ["DEFAULT_POLICY", "POLICIES", "PolicySpec", "policy_pattern"]

#: Policy name -> class.
POLICIES: dict[str, type[AllocationPolicy]] = {
    cls.name: cls
    for cls in (SCPolicy, ESCPolicy, ASCPolicy, PPRPolicy, BlendPolicy, HedgePolicy, OraclePolicy)
}
#: What ``/solve`` and grouped ``/v1`` jobs run unless the caller names a policy.
DEFAULT_POLICY = HedgePolicy.name
_NUMBER = r"[0-9]+(\.[0-9]+)?"
_SHARE = r"0(\.[0-9]+)?"


def _or_none(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _rank(text: str) -> str:
    if text not in RANKS:
        raise ValueError(f"rank must be one of {', '.join(RANKS)}")
    return text


# "none" turns the cap (or the floor) off.
_OPTIONS: dict[str, Option] = {
    "cap": Option(_or_none, rf"({_NUMBER}|none)"),
    "window": Option(int, "[0-9]+"),
    "settle_delta": Option(float, _SHARE),
    "probe": Option(int, "[0-9]+"),
    "floor": Option(_or_none, r"([01](\.[0-9]+)?|none)"),
    "stop": Option(float, _SHARE),
    "rank": Option(_rank, f"({'|'.join(RANKS)})"),
}
# option -> the one policy that takes it
_ONLY = {
    "window": "esc",
    "probe": "hedge",
    "floor": "hedge",
    "stop": "hedge",
    "rank": "hedge",
}


@dataclass(frozen=True)
class PolicySpec:
    """A policy name (one of :data:`POLICIES`) with its options, the keyword arguments of
    its constructor, parsed from ``name[:key=value,...]``."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """Parses ``"blend"``, ``"asc:cap=16"``, ``"esc:window=8"``.

        Raises:
            ValueError: unknown policy or option, or a malformed value.
        """
        name, options = parse_spec(text, _OPTIONS)
        if name not in POLICIES:
            known = ", ".join(POLICIES)
            raise ValueError(f"unknown policy {name!r} (known: {known})")
        for key in options:
            if key in _ONLY and name != _ONLY[key]:
                raise ValueError(f"option {key} applies to {_ONLY[key]} only, not {name!r}")
        return cls(name, options)

    @property
    def label(self) -> str:
        """The canonical text of this spec, e.g. ``asc:cap=16.0``."""
        rest = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.name}:{rest}" if rest else self.name

    def build(self, num_questions: int, budget: int, **kwargs: Any) -> AllocationPolicy:
        """Instantiates the policy; ``kwargs`` (seed, margins, ...) join the options.

        An option named in the spec (``blend:settle_delta=0.3``) wins over the
        same keyword passed here, which is the caller's default.
        """
        return POLICIES[self.name](num_questions, budget, **{**kwargs, **self.options})


def policy_pattern(names: Iterable[str]) -> str:
    """The regular expression of policy strings naming one of ``names`` (for schemas)."""
    return spec_pattern(names, _OPTIONS)
