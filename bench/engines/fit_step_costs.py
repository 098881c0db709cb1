"""Fits each model shape's decode-step cost in a measured profile and writes the shipped fits.

Reads a profile of JSON lines (``model``, ``batch``, ``ctx``, ``ms_median``;
the H100 decode profiles are of this form), fits
:class:`~blendserve.engines.step_cost.StepCost` to each model's points up to
``--max-ctx`` tokens of context, prints each fit's worst relative error, and
writes them to ``server/blendserve/engines/step_costs.json`` as
``{model}-{--suffix}``::

    python -m bench.engines.fit_step_costs PROFILE.jsonl [--suffix h100] [--max-ctx 8192]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from blendserve.engines.step_cost import StepCost

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "server" / "blendserve" / "engines" / "step_costs.json"


def main() -> None:
    """Fits every model of the profile and writes the shipped fits."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--suffix", default="h100")
    parser.add_argument("--max-ctx", type=int, default=8192)
    args = parser.parse_args()
    lines = args.profile.read_text(encoding="utf-8").splitlines()
    points = [json.loads(line) for line in lines if line.strip()]
    fits = {}
    for model in sorted({p["model"] for p in points}):
        used = [p for p in points if p["model"] == model and p["ctx"] <= args.max_ctx]
        fit = StepCost.fit(used)
        name = f"{model}-{args.suffix}"
        print(f"{name}: {len(used)} points, worst {fit.worst_error(used):.1%} off")
        fits[name] = {k: round(v, 9) for k, v in fit.as_dict().items() if k != "name"}
    OUT.write_text(json.dumps(fits, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
