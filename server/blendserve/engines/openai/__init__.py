"""The OpenAI-compatible engine: upstream replicas, their connections, and the wire format.

:class:`OpenAIEngine` (in :mod:`blendserve.engines.openai.engine`) samples from
one or more OpenAI-compatible servers; :mod:`~blendserve.engines.openai.wire`
reads and writes their requests and replies, and the private modules keep the
replicas, their connection pools and their load readings.
"""

from blendserve.engines.openai.engine import OpenAIEngine, normalise_base_url, split_credentials

__all__ = ["OpenAIEngine", "normalise_base_url", "split_credentials"]
