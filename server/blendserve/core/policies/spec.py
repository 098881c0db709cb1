"""Policy names and option strings such as ``asc:cap=16`` or ``esc:window=8``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blendserve.core.policies.base import AllocationPolicy
from blendserve.core.policies.blend import BlendPolicy
from blendserve.core.policies.hedge import HedgePolicy
from blendserve.core.policies.priority import (
    ASCPolicy,
    ESCPolicy,
    OraclePolicy,
    PPRPolicy,
    SCPolicy,
)

__all__ = ["DEFAULT_POLICY", "POLICIES", "PolicySpec"]

#: Policy name -> class.
POLICIES: dict[str, type[AllocationPolicy]] = {
    cls.name: cls
    for cls in (SCPolicy, ESCPolicy, ASCPolicy, PPRPolicy, BlendPolicy, HedgePolicy, OraclePolicy)
}
#: What ``/solve`` and grouped ``/v1`` jobs run unless the caller names a policy.
DEFAULT_POLICY = HedgePolicy.name
# option -> parser; "none" turns the cap off.
_OPTIONS: dict[str, Callable[[str], Any]] = {
    "cap": lambda text: None if text.lower() == "none" else float(text),
    "window": int,
    "settle_delta": float,
    "probe": int,
    "floor": lambda text: None if text.lower() == "none" else float(text),
    "stop": float,
}
# option -> the one policy that takes it
_ONLY = {"window": "esc", "probe": "hedge", "floor": "hedge", "stop": "hedge"}


@dataclass(frozen=True)
class PolicySpec:
    """A policy name with its options, parsed from ``name[:key=value,...]``.

    Attributes:
        name: one of :data:`POLICIES`.
        options: keyword arguments for the policy's constructor.
    """

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """Parses ``"blend"``, ``"asc:cap=16"``, ``"esc:window=8"``.

        Raises:
            ValueError: unknown policy or option, or a malformed value.
        """
        name, _, rest = text.strip().partition(":")
        if name not in POLICIES:
            known = ", ".join(POLICIES)
            raise ValueError(f"unknown policy {name!r} (known: {known})")
        options: dict[str, Any] = {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not sep or key not in _OPTIONS:
                raise ValueError(
                    f"bad option {item!r} in policy {text!r} (known: {', '.join(_OPTIONS)})"
                )
            if key in _ONLY and name != _ONLY[key]:
                raise ValueError(f"option {key} applies to {_ONLY[key]} only, not {name!r}")
            try:
                options[key] = _OPTIONS[key](value)
            except ValueError as exc:
                raise ValueError(f"bad value {value!r} for {key} in policy {text!r}") from exc
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
