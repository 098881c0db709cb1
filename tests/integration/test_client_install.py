"""The client installs alone, light (httpx and pydantic only), and talks to a real server.

A fresh virtual environment gets ``pip install ./client`` (from the package
registries, with the pinned versions); its Python then runs the client, and
its ``blendserve-solve`` script, against a replay server in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from blendserve.engines.replay import ReplayEngine
from blendserve.testing.live import serve_engine

ROOT = Path(__file__).parents[2]
#: What the service pulls and the client must not (tqdm: the service's progress bars).
HEAVY = {"numpy", "scipy", "numba", "sympy", "math-verify", "fastapi", "httpx2", "tqdm"}

SCRIPT = """
import json, sys
from blendserve_client import Answer, Client, Sampling, SolveOptions
options = SolveOptions(budget_per_question=4, sampling=Sampling(max_tokens=16))
with Client(sys.argv[1]) as client:
    solved = client.solve(["Q?"], options, answer="number", in_flight_per_question=1)
    events = client.stream([{"id": "q", "prompt": "Q?"}], budget=4)
    streamed = [e for e in events if isinstance(e, Answer)]
print(json.dumps({"answer": solved.answers[0].answer, "spent": solved.budget.spent,
                  "streamed": [e.answer for e in streamed]}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_client_alone_in_a_fresh_venv_pulls_nothing_heavy_and_solves(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, bin_dir = str(venv / "bin" / "python"), venv / "bin"
    start = time.monotonic()
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"),
         str(ROOT / "client")],
        check=True, timeout=840,
    )  # fmt: skip
    took = time.monotonic() - start
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], check=True, capture_output=True, text=True
    )
    installed = {package["name"].lower() for package in json.loads(listed.stdout)}
    print(f"pip install ./client: {took:.1f} s, {sorted(installed)}")
    assert {"blendserve-client", "httpx", "pydantic"} <= installed
    assert not installed & (HEAVY | {"blendserve"}), installed & HEAVY
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"id": "q", "prompt": "Q?"}\n', encoding="utf-8")
    engine = ReplayEngine([{"id": "q", "prompt": "Q?", "answers": ["7"] * 8}], seed=1)
    with serve_engine(engine) as live:
        ran = subprocess.run(
            [python, "-c", SCRIPT, live.url], check=True, capture_output=True, text=True, timeout=60
        )
        command = subprocess.run(
            [bin_dir / "blendserve-solve", str(questions), "--budget", "4", "--answer", "number",
             "--url", live.url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert json.loads(ran.stdout) == {"answer": "7", "spent": 4, "streamed": ["7"]}
    assert command.returncode == 0, command.stderr
    assert json.loads(command.stdout)["answer"] == "7"
    assert command.stderr.startswith("completed: 4/4 samples"), command.stderr  # no bar: no tqdm
