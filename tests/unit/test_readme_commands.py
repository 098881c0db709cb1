"""The README's two commands: one serves, one tests, and CI runs the second."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parents[2]


def _commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)
    assert first is not None, "the README opens with a bash block of two commands"
    return first.group(1).strip().splitlines()


def test_the_readme_opens_with_a_serve_and_a_test_command() -> None:
    serve, test = _commands()
    assert serve.endswith("&& blendserve serve")
    assert "'.[embedded]'" in serve  # serving pulls no test tooling
    assert test.endswith("&& python -m pytest -n 2 --dist loadfile")
    for command in (serve, test):
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
        assert "-c constraints.txt" in command


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, test = _commands()
    assert f'bash -c "{test}"' in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_constraints_pin_every_requirement_of_the_test_install() -> None:
    pinned = {
        canonicalize_name(line.split("==")[0])
        for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
        if "==" in line and not line.startswith("#")
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    for requirement in (*project["dependencies"], *extras["test"], *extras["embedded"]):
        assert canonicalize_name(Requirement(requirement).name) in pinned, requirement
