"""Hostile traffic against a real ``blendserve serve``: run as ``python -m bench.load.abuse``."""
