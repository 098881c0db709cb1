"""The OpenAI-compatible drop-in: voted answers behind ``/v1``."""
