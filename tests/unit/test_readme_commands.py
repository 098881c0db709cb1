"""The README's two commands: one serves, one tests, and CI runs the second."""

import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parents[2]
#: The client's own distribution: a local project, installed from ./client in the same command.
CLIENT = "blendserve-client"


def _commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)
    assert first is not None, "the README opens with a bash block of two commands"
    return first.group(1).strip().splitlines()


def _project(path: Path) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((path / "pyproject.toml").read_text("utf-8"))["project"]
    return project


def test_the_readme_opens_with_a_serve_and_a_test_command() -> None:
    serve, test = _commands()
    assert serve.endswith("&& blendserve serve")
    assert "'.[embedded]'" in serve  # serving pulls no test tooling
    assert test.endswith("&& python -m pytest -n 2 --dist loadfile")
    for command in (serve, test):
        # llama.cpp built for any x86-64 host, not tuned to the installing CPU (issue: AMX).
        assert command.startswith(
            "python3 -m venv .venv && . .venv/bin/activate && CMAKE_ARGS=-DGGML_NATIVE=OFF pip "
        )
        assert "-c constraints.txt" in command
        # No index has the client's distribution: the same pip command installs it.
        assert " -e ./client " in command


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, test = _commands()
    assert f'bash -c "{test}"' in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_dockerfile_installs_the_client_with_the_service() -> None:
    install = re.search(r"pip install [^\n]*", (ROOT / "Dockerfile").read_text(encoding="utf-8"))
    assert install is not None and "-c constraints.txt ./client " in install.group(0)


def test_the_service_depends_on_the_client_it_no_longer_packages() -> None:
    project = _project(ROOT)
    client = _project(ROOT / "client")
    assert client["name"] == CLIENT
    wanted = [Requirement(r) for r in project["dependencies"]]
    (pin,) = [r for r in wanted if canonicalize_name(r.name) == CLIENT]
    assert pin.specifier.contains(client["version"])
    packaging = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]
    assert packaging["packages"]["find"]["where"] == ["server"]


def test_the_client_is_light_with_the_service_s_lower_bounds() -> None:
    # httpx: the client's and the tests' (the test extra); the service itself uses httpx2.
    service = set(_project(ROOT)["dependencies"]) | set(
        _project(ROOT)["optional-dependencies"]["test"]
    )
    client = _project(ROOT / "client")["dependencies"]
    assert {canonicalize_name(Requirement(r).name) for r in client} == {"httpx", "pydantic"}
    assert set(client) <= service, set(client) - service


def test_the_constraints_pin_every_requirement_of_the_test_install() -> None:
    pinned = {
        canonicalize_name(line.split("==")[0])
        for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
        if "==" in line and not line.startswith("#")
    }
    project = _project(ROOT)
    extras = project["optional-dependencies"]
    requirements = (
        *project["dependencies"],
        *extras["test"],
        *extras["embedded"],
        *_project(ROOT / "client")["dependencies"],
    )
    for requirement in requirements:
        name = canonicalize_name(Requirement(requirement).name)
        if name == CLIENT:
            continue  # a local project: constraints pin index packages only
        assert name in pinned, requirement
