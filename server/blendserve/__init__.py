"""blendserve: adaptive self-consistency (Blend-ASC) for LLM serving."""

__version__ = "0.1.0"
