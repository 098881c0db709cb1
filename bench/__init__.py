"""Benchmarks of blendserve, run from the repository root as ``python -m bench.GROUP.NAME``.

``python -m bench --list`` shows the named presets and ``python -m bench NAME`` runs one
(bench/README.md).
"""
