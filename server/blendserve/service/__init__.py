"""The HTTP service (FastAPI): routes, schemas and the error mapping."""

from blendserve.service.app import create_app
from blendserve.service.settings import Settings

__all__ = ["Settings", "create_app"]
