"""pyproject.toml declares what the code imports, where it imports it, and nothing else.

The service's ``dependencies`` are what ``server/blendserve`` imports (and what the
client's ``blendserve solve`` uses without declaring it); the ``test`` extra adds what the
tests and benchmarks import, and their fakes and helpers in ``blendserve.testing``, which
the service never imports. Imports are read from the source (``import``, ``from``, and
``importlib.import_module`` of a literal name) and mapped to the installed distributions.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

ROOT = Path(__file__).parents[2]
#: Modules that are a declared distribution's own API, imported through it: FastAPI is
#: Starlette's routing and responses, pydantic's core its validators, math-verify's answers
#: sympy expressions parsed by latex2sympy2_extended.
API_OF_A_DEPENDENCY = {
    "starlette": "fastapi",
    "pydantic_core": "pydantic",
    "sympy": "math-verify",
    "latex2sympy2_extended": "math-verify",
}
#: Modules that only exist in the vLLM lane's own venv (.ci/vllm-lane), not in the project's.
VLLM_VENV = {"vllm", "torch"}
#: The tests' and benchmarks' fakes and helpers, installed with the service but not its own.
TESTING = "server/blendserve/testing"


def _project(path: Path) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((path / "pyproject.toml").read_text("utf-8"))["project"]
    return project


def _names(requirements: Iterable[str]) -> set[NormalizedName]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _imported_module(node: ast.AST) -> list[str]:
    """Absolute module names ``node`` imports (none when it is no import)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def _sources(*folders: str, skip: str | None = None) -> list[Path]:
    """The Python files under the folders, less those under ``skip``."""
    return [
        path
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
        if skip is None or not path.is_relative_to(ROOT / skip)
    ]


def _imported_names(*folders: str, skip: str | None = None) -> set[str]:
    """Every absolute module name the folders' sources (less ``skip``'s) import."""
    return {
        name
        for path in _sources(*folders, skip=skip)
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        for name in _imported_module(node)
    }


def _imports(*folders: str, skip: str | None = None) -> set[str]:
    """Top-level modules outside the standard library that the folders' sources import."""
    found = {name.split(".")[0] for name in _imported_names(*folders, skip=skip)}
    local = {path.stem for folder in folders for path in (ROOT / folder).glob("*.py")}
    return {m for m in found if m not in sys.stdlib_module_names and m not in local}


def _distributions(modules: Iterable[str]) -> dict[str, set[NormalizedName]]:
    """Each module's installed distributions (its own name when none is installed)."""
    installed = metadata.packages_distributions()
    return {m: {canonicalize_name(d) for d in installed.get(m, [m])} for m in modules}


def test_the_service_declares_what_it_imports_and_nothing_else() -> None:
    project = _project(ROOT)
    client = _project(ROOT / "client")
    ours = {canonicalize_name(project["name"]), canonicalize_name(client["name"])}
    declared = _names(project["dependencies"])
    anywhere = declared.union(*(_names(r) for r in project["optional-dependencies"].values()))
    service = _imports("server/blendserve", skip=TESTING) - set(API_OF_A_DEPENDENCY)
    imported = _distributions(service)
    undeclared = {m: d for m, d in imported.items() if not d & (anywhere | ours)}
    assert not undeclared, f"imported by the service, declared nowhere: {undeclared}"
    # The client's command runs from the service's distribution: what the client uses
    # without declaring it (its progress bar's tqdm) the service declares.
    client_own = _names(client["dependencies"])
    used = set().union(*imported.values())
    used |= set().union(*_distributions(_imports("client/blendserve_client")).values()) - client_own
    used |= {canonicalize_name(d) for d in API_OF_A_DEPENDENCY.values()}
    unused = declared - used - ours
    assert not unused, f"declared by the service, imported by none of it: {sorted(unused)}"


def test_the_tests_and_benchmarks_declare_what_they_import() -> None:
    project = _project(ROOT)
    extras = project["optional-dependencies"]
    declared = _names(
        [*project["dependencies"], *extras["test"], *extras["embedded"]]
        + _project(ROOT / "client")["dependencies"]
    ) | {canonicalize_name(project["name"]), canonicalize_name("blendserve-client")}
    modules = _imports("tests", "bench", TESTING) - VLLM_VENV - set(API_OF_A_DEPENDENCY)
    modules -= {"tests", "bench"}
    imported = _distributions(modules)
    undeclared = {m: d for m, d in imported.items() if not d & declared}
    assert not undeclared, f"imported by tests or benchmarks, not in the test extra: {undeclared}"


def test_the_pinned_and_installed_versions_meet_the_declared_ranges() -> None:
    """constraints.txt (what the suite passed with) and this venv are within every range,
    the upper bounds on the HTTP stack's internals included."""
    project = _project(ROOT)
    extras = project["optional-dependencies"]
    requirements = [
        Requirement(r)
        for r in [*project["dependencies"], *extras["test"], *extras["embedded"]]
        + _project(ROOT / "client")["dependencies"]
    ]
    pins = dict(
        (canonicalize_name(name), version)
        for name, version in (
            line.split("==")
            for line in (ROOT / "constraints.txt").read_text("utf-8").splitlines()
            if "==" in line and not line.startswith("#")
        )
    )
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name in pins:
            assert requirement.specifier.contains(pins[name]), (requirement, pins[name])
            assert requirement.specifier.contains(metadata.version(name)), requirement


def test_the_service_never_imports_the_testing_package() -> None:
    """``blendserve.testing`` needs the ``test`` extra: no module of the service imports it,
    and importing the package, its command and its app leaves it unimported."""
    imported = _imported_names("server/blendserve", skip=TESTING)
    assert not {name for name in imported if name.startswith("blendserve.testing")}
    probe = (
        "import sys, blendserve, blendserve.cli, blendserve.service; "
        "print(sorted(m for m in sys.modules if m.startswith('blendserve.testing')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
