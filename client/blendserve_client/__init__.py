"""Python SDK for a blendserve service (the HTTP client arrives with the ``/solve`` API)."""

__all__: list[str] = []
