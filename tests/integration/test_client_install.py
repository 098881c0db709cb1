"""The client installs alone, light (httpx and pydantic only), and talks to a real server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from blendserve.engines.replay import ReplayEngine

from tests.support.live import serve_engine

ROOT = Path(__file__).parents[2]
HEAVY = {"numpy", "scipy", "numba", "sympy", "math-verify", "fastapi", "blendserve"}

SCRIPT = """
import json, sys
from blendserve_client import Client, SolveOptions
with Client(sys.argv[1]) as client:
    result = client.solve(["Q?"], SolveOptions(budget_per_question=4), answer="number")
print(json.dumps({"answer": result.answers[0].answer, "spent": result.budget.spent}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_client_alone_in_a_fresh_venv_pulls_nothing_heavy_and_solves(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt")]
    subprocess.run([*pip, str(ROOT / "client")], check=True, timeout=840)
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], check=True, capture_output=True, text=True
    )
    installed = {package["name"].lower() for package in json.loads(listed.stdout)}
    assert "blendserve-client" in installed and {"httpx", "pydantic"} <= installed
    assert not installed & HEAVY, installed & HEAVY
    engine = ReplayEngine([{"id": "q", "prompt": "Q?", "answers": ["7"] * 8}], seed=1)
    with serve_engine(engine) as live:
        ran = subprocess.run(
            [python, "-c", SCRIPT, live.url], check=True, capture_output=True, text=True, timeout=60
        )
    assert json.loads(ran.stdout) == {"answer": "7", "spent": 4}
