"""A decode-step profile's points are checked: a bad value is one ``ValueError`` line."""

import json
from pathlib import Path
from typing import Any

import pytest
from blendserve.engines import step_cost
from blendserve.engines.step_cost import SHIPPED, StepCost, load_step_cost

GOOD = [
    {"batch": b, "ctx": c, "ms_median": 5 + b * 0.1 + c * 0.001}
    for b in (1, 4)
    for c in (100, 1000)
]
RANGE_MS = "ms_median must be a number from 1e-06 to 60,000 ms"

BAD: list[tuple[dict[str, Any], str]] = [
    ({"batch": 1, "ctx": 10, "ms_median": "nan"}, f'{RANGE_MS}, got "nan"'),
    ({"batch": 1, "ctx": 10, "ms_median": float("nan")}, "ms_median must be a number"),
    ({"batch": 1, "ctx": 10, "ms_median": "inf"}, 'got "inf"'),
    ({"batch": 1, "ctx": 10, "ms_median": float("inf")}, "ms_median must be a number"),
    ({"batch": 1, "ctx": 10, "ms_median": -5}, "got -5"),
    ({"batch": 1, "ctx": 10, "ms_median": 0}, "got 0"),
    ({"batch": 1, "ctx": 10, "ms_median": 1e308}, "got 1e+308"),
    ({"batch": 0, "ctx": 10, "ms_median": 5}, "batch must be an integer from 1 to 1,048,576"),
    ({"batch": -3, "ctx": 10, "ms_median": 5}, "got -3"),
    ({"batch": 2.5, "ctx": 10, "ms_median": 5}, "got 2.5"),
    ({"batch": True, "ctx": 10, "ms_median": 5}, "got True"),
    ({"batch": "8", "ctx": 10, "ms_median": 5}, 'got "8"'),
    ({"batch": 10**400, "ctx": 10, "ms_median": 5}, "(401 characters)"),
    ({"batch": 1, "ctx": 10**400, "ms_median": 5}, "ctx must be a number from 0 to 16,777,216"),
    ({"batch": 1, "ctx": -1, "ms_median": 5}, "ctx must be a number"),
    ({"batch": 1, "ctx": float("nan"), "ms_median": 5}, "ctx must be a number"),
    ({"batch": 1, "ctx": 10, "ms_median": 10**400}, "(401 characters)"),
]  # fmt: skip


@pytest.mark.parametrize(("point", "says"), BAD)
def test_a_fit_refuses_a_point_out_of_range(point: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=r"^profile point 4: ") as raised:
        StepCost.fit([*GOOD, point])
    assert says in str(raised.value)
    assert len(str(raised.value)) < 200, raised.value


@pytest.mark.parametrize(("point", "says"), BAD)
def test_a_profile_file_names_the_line_of_a_bad_point(
    point: dict[str, Any], says: str, tmp_path: Path
) -> None:
    profile = tmp_path / "bad.jsonl"
    lines = [json.dumps(p) for p in [*GOOD, point]]
    profile.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as raised:
        load_step_cost(profile)
    message = str(raised.value)
    assert message.startswith(f"{profile}:5: ") and says in message, message
    assert "\n" not in message and len(message) < 200 + len(str(profile)), message


def test_a_point_of_another_model_is_not_read(tmp_path: Path) -> None:
    profile = tmp_path / "two.jsonl"
    points = [{**p, "model": "m"} for p in GOOD] + [{"model": "x", "batch": 0}]
    profile.write_text("\n".join(json.dumps(p) for p in points) + "\n", encoding="utf-8")
    assert load_step_cost(profile, model="m").step_ms(1, 100) > 0
    with pytest.raises(ValueError, match=":5: lacks ctx and ms_median"):
        load_step_cost(profile)


def test_a_missing_field_is_named() -> None:
    with pytest.raises(ValueError, match=r"^profile point 0 lacks ms_median$"):
        StepCost.fit([{"batch": 1, "ctx": 2}])
    with pytest.raises(ValueError, match=r"^profile point 1 is not an object$"):
        StepCost.fit([GOOD[0], [1, 2, 3]])  # type: ignore[list-item]


def test_the_ranges_admit_what_engines_measure() -> None:
    # Whole widths written as floats, a context of none, steps from a microsecond to a minute.
    points = [
        {"batch": 1.0, "ctx": 0, "ms_median": 0.001},
        {"batch": 1024, "ctx": 8192, "ms_median": 60_000},
        {"batch": 8, "ctx": 512, "ms_median": 7.5},
        {"batch": 64, "ctx": 2048, "ms_median": 30},
    ]
    fit = StepCost.fit(points)
    assert fit.step_ms(8, 512) > 0
    for fit in SHIPPED.values():
        assert fit.step_ms(1, 512) > 0


def test_a_fit_of_no_terms_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Checked points always fit some cost; should the solver still return none (or not
    # a number), the fit is refused rather than pricing every step at nothing.
    for coefficients in ([0.0] * 4, [float("nan"), 1.0, 0.0, 0.0]):
        monkeypatch.setattr(step_cost.optimize, "nnls", lambda a, b, c=coefficients: (c, 0.0))
        with pytest.raises(ValueError, match="fit no usable step cost"):
            StepCost.fit(GOOD)
