"""Calibration: what a real engine's decode step costs, measured, for the engine cost model.

:mod:`~blendserve.engines.calibration.measure` times the engine and writes the
profile that :mod:`blendserve.engines.step_cost` fits;
:mod:`~blendserve.engines.calibration.command` is ``blendserve calibrate``.
"""

from blendserve.engines.calibration.measure import (
    MIN_POINTS,
    SPREAD_WARNING,
    CalibrationError,
    Grid,
    Point,
    Progress,
    describe,
    ignores_n,
    measure,
    summary,
    write_profile,
)

__all__ = [
    "MIN_POINTS",
    "SPREAD_WARNING",
    "CalibrationError",
    "Grid",
    "Point",
    "Progress",
    "describe",
    "ignores_n",
    "measure",
    "summary",
    "write_profile",
]
