"""The exception tree of blendserve, rooted at :class:`BlendserveError`.

Engines wrap httpx2 and vLLM errors at their seam (``raise ... from exc``);
only the service layer maps these to HTTP status codes.
"""

from __future__ import annotations

__all__ = [
    "BlendserveError",
    "EngineDown",
    "EngineError",
    "EngineProtocolError",
    "EngineTimeout",
    "EngineUnavailable",
    "InvalidRequest",
    "ModelNotFound",
    "SchedulerError",
    "ServiceOverloaded",
    "UpstreamRejected",
]


class BlendserveError(Exception):
    """Root of every error blendserve raises on purpose."""


class EngineError(BlendserveError):
    """An engine could not produce the requested samples."""


class EngineTimeout(EngineError):
    """An engine call ran past its deadline."""


class EngineUnavailable(EngineError):
    """No upstream could be reached, or every upstream is marked unhealthy."""


class EngineDown(EngineUnavailable):
    """The engine's own server process (the embedded llama.cpp server, vLLM's engine core)
    is not running: requests fail at once with why, rather than retry against nothing.
    """


class EngineProtocolError(EngineError):
    """An upstream answered with something that is not a usable completion."""


class UpstreamRejected(EngineProtocolError):
    """An upstream refused the request itself (a 4xx other than 429): retrying cannot help.

    Attributes:
        status: the upstream's HTTP status.
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class SchedulerError(BlendserveError):
    """A job could not run to completion."""


class ServiceOverloaded(BlendserveError):
    """The service is at its limit of running jobs or queued questions.

    Args:
        message: which limit, for the caller.
        retry_after: seconds after which a retry may succeed.
    """

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class InvalidRequest(BlendserveError, ValueError):
    """Bad caller input; ``param`` names the offending field.

    Args:
        message: what is wrong, for the caller.
        param: dotted name of the offending field, if known.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(InvalidRequest):
    """A request names a model the engine does not serve (``param`` is ``model``).

    Args:
        model: the name asked for.
        served: the names the engine serves.
    """

    def __init__(self, model: str, served: list[str]) -> None:
        names = ", ".join(repr(name) for name in served[:_NAMES_SHOWN])
        if len(served) > _NAMES_SHOWN:
            names += f" and {len(served) - _NAMES_SHOWN} more (GET /v1/models)"
        super().__init__(
            f"The model {model!r} does not exist here: this server serves {names}", param="model"
        )
        self.model = model


_NAMES_SHOWN = 8  # served names a ModelNotFound message lists
