"""Every example of README.md, bench/README.md and docs/*.md runs against a replay server,
so none can drift.

The examples are the fenced blocks tagged ``bash`` or ``python`` of the pages,
globbed at test time (a new page is covered). Blocks tagged ``text``,
``json``, ``yaml``, ``toml`` or ``console`` are outputs or illustrations and
are not run; a block with any other tag, or none, fails (it would go
unchecked).

One real ``blendserve serve --engine replay`` (zero latency) serves the whole
module, on recorded answers to every question the examples ask
(``tests/fixtures/docs_replay.jsonl``: an example asking something new needs a
line there). The examples address the service where ``blendserve serve``
listens, ``127.0.0.1:8000`` (or ``localhost:8000``), and name the model of the
embedded default it starts; both are replaced with the live server's before
an example runs. Commands run in a scratch directory holding the files the
examples treat as the reader's own (``EXAMPLE_FILES``).

A shell block is split into commands (continuations joined, comments dropped,
split at ``&&`` and ``;``), and each command is dispatched by its first words
(``RULES``), past leading ``NAME=value`` assignments and ``time``:

- run for real, must exit 0: ``curl`` (through bash, so pipes work; an HTTP
  error, or JSON carrying an ``error``, fails it), ``printf``, ``echo`` and
  ``cat`` (through bash, in the examples' directory: a file one writes is there
  for the next command), ``blendserve solve``, ``blendserve simulate`` (with
  ``SHORT_SIMULATION`` appended: the same flags, seconds instead of minutes),
  ``python -m MODULE``. The last three run as the words the shell would pass,
  without a shell (no pipes or redirections);
- parsed, not run: ``blendserve serve`` (the real CLI parser, then the
  settings built as ``serve`` builds them; it would not return), the
  benchmarks (``python -m bench.GROUP.NAME``, ``python bench/...``, and a
  preset, ``python -m bench NAME``, as its ``--dry-run`` prints it; ``python -m
  bench --list`` runs) and ``lm_eval`` (their own argparse parsers: they take
  minutes to an hour and need data sets or downloads this repository does not
  have),
  ``python -m pytest FLAGS`` (collects this file with those flags: running the
  suite from inside it would recurse);
- checked against the repository: ``pip install`` (files, extras, declared
  packages), ``python3 -m venv`` and ``. DIR/bin/activate``, ``docker
  build``, ``docker compose``, ``kubectl apply``.

A command no rule knows fails, naming the table to extend. A ``curl`` block
followed directly by a ``json`` block showing an ``{"error": ...}`` must
answer exactly that error. A ``python`` block runs as a script, with
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` set for the service. A placeholder
(``MODEL_TBD``, ``TIME_TBD``) anywhere on a page fails.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn
from unittest import mock

import httpx
import pytest
import yaml
from blendserve.testing.command import serve_command
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import ValidationError

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
#: The recorded answers the replay server serves: every question an example asks.
REPLAY_DATA = FIXTURES / "docs_replay.jsonl"
#: Files the examples name as the reader's own, put in the examples' working directory.
EXAMPLE_FILES = {
    "answers.jsonl": REPLAY_DATA,
    "questions.jsonl": FIXTURES / "docs_questions.jsonl",
    "recording.jsonl": ROOT / "bench" / "recordings" / "data" / "qwen2.5-coder-0.5b.jsonl",
}
RUN_TAGS = frozenset({"bash", "python"})
ILLUSTRATION_TAGS = frozenset({"text", "json", "yaml", "toml", "console"})
#: The service as the examples address it (where ``blendserve serve`` listens).
DOCUMENTED_URL = re.compile(r"(?:https?://)?(?:127\.0\.0\.1|localhost):8000(?!\d)")
#: A value still to be filled in (``MODEL_TBD``, ``TIME_TBD``).
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9]*_TBD\b")
#: Seconds one command or script may run.
TIMEOUT_S = 60.0
#: Appended to ``blendserve simulate`` (argparse keeps the last value): one repetition,
#: 50 questions of a synthetic family. Every other flag is exercised as written.
SHORT_SIMULATION = ("--reps", "1", "--questions", "50")
#: The route each lm-eval API model the service is tested with posts to.
LM_EVAL_ROUTES = {
    "local-completions": "/v1/completions",
    "local-chat-completions": "/v1/chat/completions",
}
#: Runs a script (``path FILE``) or module (``module NAME``) as ``__main__`` until its
#: argparse parser has read the command line, then prints PARSED and exits 0: its
#: flags are checked, the program does not run.
DRY_PARSE = """\
import argparse, os, runpy, sys
parse = argparse.ArgumentParser.parse_args
def parse_and_stop(self, *args, **kwargs):
    parse(self, *args, **kwargs)
    print("PARSED")
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parse_and_stop
kind, target, *argv = sys.argv[1:]
sys.argv = [target, *argv]
if kind == "module":
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    runpy.run_path(target, run_name="__main__")
"""


# --- pages and blocks ----------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page (a path relative to the repository).

    ``line`` and ``end`` are the lines of its fences; ``shows`` is the text of a
    ``json`` block right after it (only blank lines between), its shown output.
    """

    page: str
    line: int
    end: int
    tag: str
    text: str
    shows: str = ""

    @property
    def id(self) -> str:
        """``page:line``, the test id."""
        return f"{self.page}:{self.line}"


_FENCE = re.compile(r"(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<tag>[^\s`{]*)")


def _closing(lines: list[str], start: int, fence: str) -> int:
    """The index of the line closing the fence opened at ``start`` (the end: unclosed)."""
    closing = re.compile(rf"[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*")
    following = range(start + 1, len(lines))
    return next((i for i in following if closing.fullmatch(lines[i])), len(lines))


def fenced_blocks(markdown: str, page: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, dedented by their fence's indentation."""
    lines = markdown.splitlines()
    blocks: list[Block] = []
    start = 0
    while start < len(lines):
        opening = _FENCE.match(lines[start])
        if opening is None:
            start += 1
            continue
        end = _closing(lines, start, opening["fence"])
        indent = len(opening["indent"])
        body = "".join(f"{line[indent:]}\n" for line in lines[start + 1 : end])
        blocks.append(Block(page, start + 1, end + 1, opening["tag"].lower(), body))
        start = end + 1
    following: list[Block | None] = [*blocks[1:], None]
    return [
        replace(block, shows=_shown(lines, block, after))
        for block, after in zip(blocks, following, strict=False)
    ]


def _shown(lines: list[str], block: Block, after: Block | None) -> str:
    """The text of ``after`` if it is a ``json`` block right after ``block``, else ""."""
    if after is None or after.tag != "json" or "".join(lines[block.end : after.line - 1]).strip():
        return ""
    return after.text


def pages() -> list[Path]:
    """README.md, bench/README.md and every docs/*.md."""
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def page_blocks(path: Path) -> list[Block]:
    """The fenced blocks of one page."""
    return fenced_blocks(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())


def runnable_blocks() -> list[Block]:
    """The ``bash`` and ``python`` blocks of every page."""
    return [block for path in pages() for block in page_blocks(path) if block.tag in RUN_TAGS]


def shown_error(output: str) -> dict[str, Any] | None:
    """The ``error`` object of a shown output, if it is one."""
    try:
        shown = json.loads(output)
    except ValueError:
        return None
    error = shown.get("error") if isinstance(shown, dict) else None
    return error if isinstance(error, dict) else None


# --- shell commands ------------------------------------------------------------------

_SHELL = re.compile(
    r"(?P<comment>(?<![^\s;&|])\#[^\n]*)"
    r"|(?P<sep>&&|;|\n)"
    r"|(?P<cont>\\\n)"
    r"""|(?P<word>'[^']*'|"(?:\\.|[^"\\])*"|\\.|[^'"\\&;\n\#]+|[&\#])"""
    r"""|(?P<open>['"\\])""",
    re.DOTALL,
)


def split_commands(script: str) -> list[str]:
    """A shell script's commands: continuations joined, comments dropped, split at ``&&``/``;``.

    Quotes are kept (a quoted string may span lines); a pipeline stays one command.

    Raises:
        ValueError: a quote is never closed, or the script ends with a backslash.
    """
    commands: list[str] = []
    current = ""
    for token in _SHELL.finditer(script):
        kind = token.lastgroup
        if kind == "open":
            raise ValueError(f"unterminated quote or escape in {script!r}")
        if kind == "sep":
            commands.append(current)
            current = ""
        elif kind == "cont":
            current += " "
        elif kind == "word":
            current += token.group()
    commands.append(current)
    return [command.strip() for command in commands if command.strip()]


@dataclass(frozen=True)
class Command:
    """One shell command: as written, its words less leading assignments, and those."""

    text: str
    words: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def parse_command(text: str) -> Command:
    """Splits ``text`` into words; leading ``NAME=value`` go to ``env``, ``time`` is dropped.

    ``python -m blendserve.cli`` reads as ``blendserve``.
    """
    words = shlex.split(text)
    env = {}
    while words and (words[0] == "time" or _ASSIGNMENT.match(words[0])):
        name, _, value = words.pop(0).partition("=")
        if name != "time":
            env[name] = value
    if words[:1] in (["python"], ["python3"]) and words[1:3] == ["-m", "blendserve.cli"]:
        words[:3] = ["blendserve"]
    return Command(text, tuple(words), env)


#: How each command is checked, by its first words (``python3`` reads as ``python``; the
#: longest prefix wins; a prefix ending in "/" or "." matches a word starting with it).
RULES: dict[tuple[str, ...], str] = {
    ("curl",): "http",
    ("printf",): "shell",
    ("echo",): "shell",
    ("cat",): "shell",
    ("blendserve", "serve"): "serve",
    ("blendserve", "record"): "record",
    ("blendserve", "solve"): "run",
    ("blendserve", "simulate"): "simulate",
    ("python", "-m"): "run",
    ("python", "-m", "pytest"): "pytest",
    ("python", "-m", "pip", "install"): "pip",
    ("python", "-m", "venv"): "venv",
    ("python", "bench/"): "benchmark",
    ("python", "-m", "bench"): "benchmark",
    ("python", "-m", "bench."): "benchmark",
    ("pip", "install"): "pip",
    (".",): "activate",
    ("source",): "activate",
    ("docker", "build"): "docker build",
    ("docker", "compose"): "compose",
    ("docker-compose",): "compose",
    ("kubectl", "apply"): "kubectl apply",
    ("lm_eval",): "lm-eval",
    ("lm-eval",): "lm-eval",
}


def _matches(prefix: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if len(words) < len(prefix):
        return False
    return all(
        word.startswith(part) if part.endswith(("/", ".")) else word == part
        for part, word in zip(prefix, words, strict=False)
    )


def rule_for(command: Command) -> str:
    """The rule that checks ``command``.

    Raises:
        AssertionError: no rule knows the command.
    """
    words = tuple("python" if word == "python3" else word for word in command.words[:4])
    known = [prefix for prefix in RULES if _matches(prefix, words)]
    assert known, (
        f"no rule checks `{command.text}`: add one to RULES in "
        "tests/integration/test_docs_examples.py (run it, parse it, or check it "
        "statically), or tag the block text or console if it is not meant to be run"
    )
    return RULES[max(known, key=len)]


def substitute(text: str, url: str, models: Mapping[str, str]) -> str:
    """``text`` addressing the service at ``url``, with model names renamed per ``models``."""
    text = DOCUMENTED_URL.sub(url, text)
    for documented, served in models.items():
        text = re.sub(rf"(?<![\w./-]){re.escape(documented)}(?![\w./-])", served, text)
    return text


def json_documents(output: str) -> list[Any]:
    """The JSON in a response: the whole body, or each line of NDJSON or SSE ``data:``."""
    try:
        return [json.loads(output)]
    except ValueError:
        pass
    documents = []
    for line in output.splitlines():
        with contextlib.suppress(ValueError):
            documents.append(json.loads(line.removeprefix("data:").strip()))
    return documents


# --- running -------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """Where a block runs: the live service, the model names to replace, a directory.

    ``venvs`` are the virtual environments the block created so far;
    ``expected_error`` the error its shown output is, if any.
    """

    url: str
    models: Mapping[str, str]
    workspace: Path
    venvs: set[str] = field(default_factory=set)
    expected_error: Mapping[str, Any] | None = None

    def env(self) -> dict[str, str]:
        """A child's environment: this venv first on PATH, the OpenAI SDK on the service."""
        inherited = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("BLENDSERVE_", "PYTEST_", "OPENAI_"))
        }
        path = f"{Path(sys.executable).parent}{os.pathsep}{inherited.get('PATH', '')}"
        openai = {"OPENAI_BASE_URL": f"{self.url}/v1", "OPENAI_API_KEY": "unused"}
        return {**inherited, "PATH": path, **openai}


#: What to do about a failure whose output says this.
HINTS = {
    "no recorded answers": "record the question in tests/fixtures/docs_replay.jsonl",
    "model_not_found": "examples name the embedded default's model (embedded_model)",
    "does not exist here": "examples name the embedded default's model (embedded_model)",
}


def _tail(text: str, limit: int = 3000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def hints(output: str) -> str:
    """Hints for the doc writer that ``output`` calls for, one a line."""
    found = dict.fromkeys(hint for key, hint in HINTS.items() if key in output)
    return "".join(f"\nhint: {hint}" for hint in found)


def run(
    argv: list[str],
    context: Context,
    shown: str,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` (``shown`` in messages) within TIMEOUT_S; with ``check``, asserts exit 0."""
    try:
        done = subprocess.run(
            argv, cwd=cwd or context.workspace, env={**context.env(), **(env or {})},
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError(f"`{shown}` ran past {TIMEOUT_S:.0f} s") from None
    assert not check or done.returncode == 0, (
        f"`{shown}` exited {done.returncode}\n--- stdout\n{_tail(done.stdout)}"
        f"\n--- stderr\n{_tail(done.stderr)}{hints(done.stdout + done.stderr)}"
    )
    return done


def run_words(
    command: Command, context: Context, extra: tuple[str, ...] = (), cwd: Path | None = None
) -> str:
    """Runs the command's words (no shell), the service and model substituted; its stdout."""
    words = [substitute(word, context.url, context.models) for word in command.words]
    env = {
        name: substitute(value, context.url, context.models) for name, value in command.env.items()
    }
    return run([*words, *extra], context, command.text, cwd=cwd, env=env).stdout


def run_bash(
    command: Command, context: Context, text: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Runs ``text`` (the command's own by default) with bash, the service substituted."""
    script = substitute(text or command.text, context.url, context.models)
    return run(["bash", "-o", "pipefail", "-c", script], context, command.text, check=check)


def dry_parse(kind: str, target: str, argv: tuple[str, ...], context: Context, shown: str) -> None:
    """Asserts that a script or module's own argparse parser takes ``argv`` (see DRY_PARSE)."""
    done = run([sys.executable, "-c", DRY_PARSE, kind, target, *argv], context, shown, cwd=ROOT)
    assert "PARSED" in done.stdout, f"`{shown}` exited before parsing its arguments"


class _ParserError(Exception):
    """A static rule's parser does not take the command line."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser that raises instead of printing and exiting."""

    def error(self, message: str) -> NoReturn:
        """Raises :class:`_ParserError`."""
        raise _ParserError(message)


def _parse(parser: _Parser, command: Command, skip: int) -> argparse.Namespace:
    """The command's words past the first ``skip``, parsed by a static rule's parser."""
    try:
        return parser.parse_args(command.words[skip:])
    except _ParserError as exc:
        raise AssertionError(
            f"`{command.text}`: {exc} (if the tool takes it, teach the {parser.prog!r} "
            "rule of tests/integration/test_docs_examples.py)"
        ) from None


def _project() -> dict[str, Any]:
    """pyproject.toml's ``[project]`` table."""
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


# --- the rules -----------------------------------------------------------------------


def check_http(command: Command, context: Context) -> None:
    """``curl``: runs through bash; no HTTP error or JSON ``error``, unless the page shows it."""
    text = re.sub(r"\bcurl\b", "curl --fail-with-body", command.text, count=1)
    expected = context.expected_error
    output = run_bash(command, context, text, check=not expected).stdout
    errors = [d["error"] for d in json_documents(output) if isinstance(d, dict) and d.get("error")]
    if expected:
        assert errors == [expected], (
            f"`{command.text}` answered {errors or output!r}, not the error its page shows: "
            f"{dict(expected)}"
        )
    else:
        assert not errors and "event: error" not in output, (
            f"`{command.text}` answered {errors}{hints(output)}"
        )


def check_shell(command: Command, context: Context) -> None:
    """``printf``/``echo``/``cat``: runs through bash (a file it writes stays for the next)."""
    run_bash(command, context)


def check_run(command: Command, context: Context) -> None:
    """Runs the command; it must exit 0."""
    run_words(command, context)


def check_simulate(command: Command, context: Context) -> None:
    """``blendserve simulate``: runs, shortened by SHORT_SIMULATION."""
    run_words(command, context, SHORT_SIMULATION)


def check_pytest(command: Command, context: Context) -> None:
    """``python -m pytest FLAGS``: collects this file with those flags (not the whole suite)."""
    this = Path(__file__).relative_to(ROOT).as_posix()
    run_words(command, context, ("--collect-only", "-q", "-p", "no:cacheprovider", this), ROOT)


def check_serve(command: Command, context: Context) -> None:
    """``blendserve serve``: parsed by the real CLI, its settings built as ``serve`` builds them.

    Only the command's own assignments are in the environment meanwhile.
    """
    from blendserve.cli import build_parser
    from blendserve.service.command import read_settings

    stderr = io.StringIO()
    with mock.patch.dict(os.environ), contextlib.redirect_stderr(stderr):
        for name in [name for name in os.environ if name.startswith("BLENDSERVE_")]:
            del os.environ[name]
        os.environ.update(command.env)
        try:
            read_settings(build_parser().parse_args(list(command.words[1:])))
        except SystemExit as exc:
            message = stderr.getvalue().strip().splitlines() or ["exited"]
            assert not exc.code, f"`{command.text}`: {message[-1]}"
        except ValidationError as exc:
            raise AssertionError(f"`{command.text}`: {exc}") from None


def check_record(command: Command, context: Context) -> None:
    """``blendserve record``: parsed by the real CLI (it samples an engine for minutes)."""
    from blendserve.cli import build_parser

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            build_parser().parse_args(list(command.words[1:]))
        except SystemExit as exc:
            message = stderr.getvalue().strip().splitlines() or ["exited"]
            assert not exc.code, f"`{command.text}`: {message[-1]}"


def check_benchmark(command: Command, context: Context) -> None:
    """``python -m bench.MODULE ARGS`` or ``python bench/SCRIPT ARGS``: the module or script
    exists and its parser takes ARGS (not run). ``python -m bench NAME ARGS``: the preset
    runner prints the command (``--dry-run``), whose module's parser takes its arguments;
    ``python -m bench --list`` runs."""
    if command.words[1:3] == ("-m", "bench"):
        argv = [sys.executable, "-m", "bench"]
        if "--list" in command.words[3:]:
            run([*argv, *command.words[3:]], context, command.text, cwd=ROOT, env=command.env)
            return
        printed = run(
            [*argv, "--dry-run", *command.words[3:]],
            context, command.text, cwd=ROOT, env=command.env,
        ).stdout  # fmt: skip
        words = tuple(shlex.split(printed))
        dry_parse("module", words[2], words[3:], context, command.text)
        return
    if command.words[1] != "-m":
        script = command.words[1]
        assert (ROOT / script).is_file(), f"`{command.text}`: no {script} in the repository"
        dry_parse("path", script, command.words[2:], context, command.text)
        return
    module = command.words[2]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a package on its way is missing
        found = False
    assert found, f"`{command.text}`: no module {module}"
    dry_parse("module", module, command.words[3:], context, command.text)


def _option(words: tuple[str, ...], name: str) -> str:
    """The value after option ``name`` ("" if absent)."""
    return words[words.index(name) + 1] if name in words[:-1] else ""


def check_lm_eval(command: Command, context: Context) -> None:
    """``lm_eval``: its parser takes the flags; its API model posts to the service's route."""
    dry_parse("module", "lm_eval", command.words[1:], context, command.text)
    model = _option(command.words, "--model")
    route = LM_EVAL_ROUTES.get(model)
    assert route, f"`{command.text}`: lm-eval --model {model!r} is not one of {LM_EVAL_ROUTES}"
    model_args = dict(
        item.partition("=")[::2] for item in _option(command.words, "--model_args").split(",")
    )
    base_url = model_args.get("base_url", "")
    address = DOCUMENTED_URL.match(base_url)
    assert address and base_url[address.end() :] == route, (
        f"`{command.text}`: base_url {base_url!r} is not the service's {route}"
    )


_PIP = _Parser(prog="pip install", add_help=False)
_PIP.add_argument("-e", "--editable", action="append", default=[])
_PIP.add_argument("-c", "--constraint", action="append", default=[])
_PIP.add_argument("-r", "--requirement", action="append", default=[])
_PIP.add_argument("-U", "--upgrade", action="store_true")
_PIP.add_argument("--pre", action="store_true")
_PIP.add_argument("requirements", nargs="*")
#: A local project: a path, with extras (``.[test,embedded]``).
_LOCAL = re.compile(r"(?P<path>\.[^\[]*|/[^\[]*)(?:\[(?P<extras>[^\]]*)\])?")


def _extras(spec: str, command: Command, declared: set[str]) -> set[str]:
    """The extras of this project that ``spec`` names (none: a declared third-party package)."""
    local = _LOCAL.fullmatch(spec)
    if local is not None:
        path = local["path"]
        assert (ROOT / path / "pyproject.toml").is_file(), f"`{command.text}`: no project {path}"
        return {extra.strip() for extra in (local["extras"] or "").split(",") if extra.strip()}
    requirement = Requirement(spec)
    name = canonicalize_name(requirement.name)
    if name == canonicalize_name(_project()["name"]):
        return set(requirement.extras)
    assert name in declared, f"`{command.text}`: {name} is not declared in pyproject.toml"
    return set()


def check_pip(command: Command, context: Context) -> None:
    """``pip install``: its files exist, its extras are the project's, its packages declared."""
    args = _parse(_PIP, command, command.words.index("install") + 1)
    for name in (*args.constraint, *args.requirement):
        assert (ROOT / name).is_file(), f"`{command.text}`: no {name} in the repository"
    project = _project()
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    requirements = [*project.get("dependencies", []), *(r for e in optional.values() for r in e)]
    declared: set[str] = {canonicalize_name(Requirement(r).name) for r in requirements}
    for spec in (*args.editable, *args.requirements):
        unknown = _extras(spec, command, declared) - set(optional)
        assert not unknown, f"`{command.text}`: pyproject.toml has no extra {sorted(unknown)}"


def check_venv(command: Command, context: Context) -> None:
    """``python3 -m venv DIR``: remembers DIR for a later ``. DIR/bin/activate``."""
    dirs = [word for word in command.words[3:] if not word.startswith("-")]
    assert dirs, f"`{command.text}`: no directory"
    context.venvs.update(dirs)


def check_activate(command: Command, context: Context) -> None:
    """``. DIR/bin/activate``: DIR is a virtual environment the block created."""
    path = command.words[1] if len(command.words) == 2 else ""
    venv = re.fullmatch(r"(.+)/bin/activate", path)
    assert venv and venv[1] in context.venvs, (
        f"`{command.text}`: activates no virtual environment the block created "
        f"({sorted(context.venvs)})"
    )


_DOCKER_BUILD = _Parser(prog="docker build", add_help=False)
_DOCKER_BUILD.add_argument("-t", "--tag", action="append", default=[])
_DOCKER_BUILD.add_argument("-f", "--file")
_DOCKER_BUILD.add_argument("--build-arg", action="append", default=[])
_DOCKER_BUILD.add_argument("--target")
_DOCKER_BUILD.add_argument("--platform")
_DOCKER_BUILD.add_argument("--pull", action="store_true")
_DOCKER_BUILD.add_argument("--no-cache", action="store_true")
_DOCKER_BUILD.add_argument("context")


def check_docker_build(command: Command, context: Context) -> None:
    """``docker build``: the context and Dockerfile exist and declare every ``--build-arg``."""
    args = _parse(_DOCKER_BUILD, command, 2)
    dockerfile = ROOT / (args.file or Path(args.context) / "Dockerfile")
    assert dockerfile.is_file(), f"`{command.text}`: no {dockerfile.relative_to(ROOT)}"
    declared = set(re.findall(r"^ARG\s+(\w+)", dockerfile.read_text(), re.MULTILINE))
    for build_arg in args.build_arg:
        name = build_arg.partition("=")[0]
        assert name in declared, f"`{command.text}`: the Dockerfile declares no ARG {name}"


_COMPOSE = _Parser(prog="docker compose", add_help=False)
_COMPOSE.add_argument("-f", "--file", action="append", default=[])
_COMPOSE.add_argument("--profile", action="append", default=[])
_COMPOSE.add_argument("-p", "--project-name")
_COMPOSE.add_argument("subcommand", choices=["up", "down", "config", "build", "pull", "logs", "ps"])
_COMPOSE.add_argument("rest", nargs=argparse.REMAINDER)


def check_compose(command: Command, context: Context) -> None:
    """``docker compose``: the compose files exist and some service has each ``--profile``."""
    args = _parse(_COMPOSE, command, 1 if command.words[0] == "docker-compose" else 2)
    profiles: set[str] = set()
    for name in args.file or ["docker-compose.yml"]:
        assert (ROOT / name).is_file(), f"`{command.text}`: no {name} in the repository"
        services = yaml.safe_load((ROOT / name).read_text())["services"]
        profiles.update(p for service in services.values() for p in service.get("profiles", []))
    unknown = set(args.profile) - profiles
    assert not unknown, f"`{command.text}`: no service has the profile {sorted(unknown)}"


_KUBECTL_APPLY = _Parser(prog="kubectl apply", add_help=False)
_KUBECTL_APPLY.add_argument("-k", "--kustomize")
_KUBECTL_APPLY.add_argument("-f", "--filename", action="append", default=[])
_KUBECTL_APPLY.add_argument("-n", "--namespace")
_KUBECTL_APPLY.add_argument("--dry-run")
_KUBECTL_APPLY.add_argument("--server-side", action="store_true")


def check_kubectl_apply(command: Command, context: Context) -> None:
    """``kubectl apply -k DIR | -f FILE``: the kustomization and what it lists, or the files."""
    args = _parse(_KUBECTL_APPLY, command, 2)
    files = [ROOT / name for name in args.filename]
    if args.kustomize:
        kustomization = ROOT / args.kustomize / "kustomization.yaml"
        assert kustomization.is_file(), f"`{command.text}`: no {args.kustomize}/kustomization.yaml"
        listed = yaml.safe_load(kustomization.read_text()).get("resources", [])
        files += [ROOT / args.kustomize / name for name in listed]
    assert files, f"`{command.text}`: applies nothing"
    missing = [str(path.relative_to(ROOT)) for path in files if not path.exists()]
    assert not missing, f"`{command.text}`: missing {missing}"


CHECKS: dict[str, Callable[[Command, Context], None]] = {
    "http": check_http,
    "shell": check_shell,
    "run": check_run,
    "simulate": check_simulate,
    "pytest": check_pytest,
    "serve": check_serve,
    "record": check_record,
    "benchmark": check_benchmark,
    "lm-eval": check_lm_eval,
    "pip": check_pip,
    "venv": check_venv,
    "activate": check_activate,
    "docker build": check_docker_build,
    "compose": check_compose,
    "kubectl apply": check_kubectl_apply,
}


def check_shell_block(block: Block, context: Context) -> None:
    """Checks every command of a shell block; asserts with every failure at once."""
    context = replace(context, venvs=set(), expected_error=shown_error(block.shows))
    failures = []
    for text in split_commands(block.text):
        try:
            command = parse_command(text)
            CHECKS[rule_for(command)](command, context)
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, f"{block.id}:\n\n" + "\n\n".join(failures)


def check_python_block(block: Block, context: Context) -> None:
    """Runs a python block as a script against the service."""
    script = context.workspace / f"{re.sub(r'[^A-Za-z0-9]+', '_', block.id)}.py"
    script.write_text(substitute(block.text, context.url, context.models), encoding="utf-8")
    run([sys.executable, script.name], context, block.id)


# --- the examples --------------------------------------------------------------------


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Context]:
    """One replay server for the module, and a working directory with the example files."""
    from blendserve.service.settings import Settings

    workspace = tmp_path_factory.mktemp("docs")
    for name, source in EXAMPLE_FILES.items():
        shutil.copyfile(source, workspace / name)
    log = workspace / "serve.log"
    with serve_command("--engine", "replay", "--data", str(REPLAY_DATA), stderr=log) as (url, _):
        served = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        # the examples name the model of the embedded default, which `blendserve serve` runs
        embedded = Settings.model_fields["embedded_model"].default
        yield Context(url, {embedded: served}, workspace)


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda block: block.id)
def test_example(block: Block, context: Context) -> None:
    """A bash or python block of the docs works as written."""
    placeholders = PLACEHOLDER.findall(block.text)
    assert not placeholders, f"{block.id}: placeholders left to fill in: {placeholders}"
    if block.tag == "python":
        check_python_block(block, context)
    else:
        check_shell_block(block, context)


@pytest.mark.parametrize("path", pages(), ids=lambda path: path.relative_to(ROOT).as_posix())
def test_page(path: Path) -> None:
    """A page has no placeholder left, and every block says whether it runs."""
    text = path.read_text(encoding="utf-8")
    lines = [text.count("\n", 0, m.start()) + 1 for m in PLACEHOLDER.finditer(text)]
    unknown = [
        f"{block.id} ({block.tag or 'untagged'})"
        for block in page_blocks(path)
        if block.tag not in RUN_TAGS | ILLUSTRATION_TAGS
    ]
    problems = [f"placeholders to fill in on lines {lines}"] if lines else []
    if unknown:
        problems.append(
            f"blocks neither run ({', '.join(sorted(RUN_TAGS))}) nor illustrations "
            f"({', '.join(sorted(ILLUSTRATION_TAGS))}; text for a listing): {unknown}"
        )
    assert not problems, f"{path.relative_to(ROOT)}: " + "; ".join(problems)


# --- the harness itself --------------------------------------------------------------


def test_split_commands_joins_continuations_drops_comments_and_splits_chains() -> None:
    script = (
        "# set up\n"
        "python3 -m venv .venv && . .venv/bin/activate  # then serve\n"
        "\n"
        "lm_eval --model x \\\n  --tasks gsm8k; echo a#b\n"
        'curl -d \'{\n  "q": "b && c # d; e"}\' | jq .\n'
    )
    assert split_commands(script) == [
        "python3 -m venv .venv",
        ". .venv/bin/activate",
        "lm_eval --model x    --tasks gsm8k",
        "echo a#b",
        'curl -d \'{\n  "q": "b && c # d; e"}\' | jq .',
    ]
    with pytest.raises(ValueError, match="unterminated"):
        split_commands("curl -d '{\n")


def test_commands_are_dispatched_by_their_first_words() -> None:
    cases = {
        "curl -s localhost:8000/health | jq .": "http",
        "printf '%s\\n' '{}' > questions.jsonl": "shell",
        "BLENDSERVE_PORT=9000 blendserve serve --engine replay": "serve",
        "python -m blendserve.cli serve": "serve",
        "time blendserve simulate --synthetic llm": "simulate",
        "blendserve solve questions.jsonl --budget 8": "run",
        "python -m json.tool answers.jsonl": "run",
        "python -m pytest -n 2": "pytest",
        "python3 -m venv .venv": "venv",
        "python -m bench.load.load data.jsonl": "benchmark",
        "python -m bench readme --reps 1": "benchmark",
        "python -m pip install -e .": "pip",
        "docker compose --profile cpu up": "compose",
    }
    assert {text: rule_for(parse_command(text)) for text in cases} == cases
    command = parse_command("A=1 time B='x y' python -m blendserve.cli solve -")
    assert command.words == ("blendserve", "solve", "-")
    assert command.env == {"A": "1", "B": "x y"}
    for unknown in ("make docs", "python script.py", "blendserve --version"):
        with pytest.raises(AssertionError, match="add one to RULES"):
            rule_for(parse_command(unknown))


def test_the_documented_address_and_model_are_replaced() -> None:
    text = "curl localhost:8000/solve; OpenAI(base_url='http://127.0.0.1:8000/v1', model='m')"
    assert substitute(text, "http://127.0.0.1:5", {"m": "replay"}) == (
        "curl http://127.0.0.1:5/solve; OpenAI(base_url='http://127.0.0.1:5/v1', model='replay')"
    )
    for untouched in ("http://vllm:8000/v1", "127.0.0.1:80001"):
        assert substitute(untouched, "http://127.0.0.1:5", {}) == untouched


def test_blocks_their_tags_and_shown_errors() -> None:
    markdown = (
        "# page\n"
        "```bash\ncurl -s localhost:8000/solve\n```\n"
        "\n"
        '```json\n{"error": {"code": 422}}\n```\n'
        "- a list item:\n"
        "  ````yaml\n  a: 1\n  ```\n  ````\n"
        "```\nlayout\n```\n"
    )
    blocks = fenced_blocks(markdown, "p.md")
    assert [(b.id, b.tag, b.text) for b in blocks] == [
        ("p.md:2", "bash", "curl -s localhost:8000/solve\n"),
        ("p.md:6", "json", '{"error": {"code": 422}}\n'),
        ("p.md:10", "yaml", "a: 1\n```\n"),
        ("p.md:14", "", "layout\n"),
    ]
    assert shown_error(blocks[0].shows) == {"code": 422}
    assert [shown_error(b.shows) for b in blocks[1:]] == [None, None, None]


def test_json_documents_of_bodies_ndjson_and_server_sent_events() -> None:
    assert json_documents('{"a": 1}') == [{"a": 1}]
    assert json_documents('{"a": 1}\n{"b": 2}\n') == [{"a": 1}, {"b": 2}]
    events = 'event: answer\ndata: {"a": 1}\n\ndata: [DONE]\n'
    assert json_documents(events) == [{"a": 1}]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("pip install -e '.[test,no-such-extra]'", "no extra"),
        ("pip install -c no-such-constraints.txt -e .", "no no-such-constraints.txt"),
        ("pip install no-such-package", "not declared"),
        ("pip install --no-such-option .", "unrecognized arguments"),
        (". venv/bin/activate", "activates no virtual environment"),
        ("docker build --build-arg NO_SUCH_ARG=1 .", "declares no ARG NO_SUCH_ARG"),
        ("docker compose --profile no-such-profile up", "no service has the profile"),
        ("kubectl apply -k deploy/no-such-dir", "no-such-dir/kustomization.yaml"),
        ("blendserve serve --no-such-flag 1", "unrecognized arguments"),
        ("blendserve serve --port 99999", "port"),
        ("python -m bench.overhead.selection --no-such-flag", "unrecognized arguments"),
        ("python bench/no_such_bench.py", "no bench/no_such_bench.py"),
        ("python -m bench no-such-preset", "no preset 'no-such-preset'"),
        ("python -m bench readme-full", "needs the recorded sets"),
        ("python -m bench readme --no-such-flag", "unrecognized arguments"),
        ("python -m bench.overhead.no_such_bench", "no module bench.overhead.no_such_bench"),
        ("python bench/recordings/report.py r.jsonl --no-such-flag", "unrecognized arguments"),
        ("lm_eval --model local-completions --no-such-flag", "unrecognized arguments"),
        ("lm_eval --model hf --model_args base_url=http://127.0.0.1:8000/v1/completions", "hf"),
        (
            "lm_eval --model local-completions --model_args base_url=http://h/v1/completions",
            "is not the service's /v1/completions",
        ),
    ],
    ids=lambda value: str(value)[:60],
)
def test_rules_catch_what_does_not_exist(text: str, reason: str, tmp_path: Path) -> None:
    command = parse_command(text)
    with pytest.raises(AssertionError, match=re.escape(reason)):
        CHECKS[rule_for(command)](command, Context("http://127.0.0.1:1", {}, tmp_path))


def test_a_shown_error_must_be_the_answer(context: Context) -> None:
    body = '{"questions": [{"prompt": "What is 6 * 7?"}], "budget": 8, "confidence": 0.95}'
    text = f"curl -s localhost:8000/solve -H 'content-type: application/json' -d '{body}'"
    command = parse_command(text)
    shown = {
        "message": "budget: budget does not go with confidence",
        "type": "invalid_request_error",
        "code": 422,
        "param": "budget",
    }
    check_http(command, replace(context, expected_error=shown))
    with pytest.raises(AssertionError, match="not the error its page shows"):
        check_http(command, replace(context, expected_error={**shown, "param": "confidence"}))
    with pytest.raises(AssertionError, match="exited 22"):
        check_http(command, context)


def test_an_unrecorded_question_fails_with_a_hint(context: Context) -> None:
    question = '"messages": [{"role": "user", "content": "Unrecorded?"}]'
    body = f'{{{question}, "blendserve": {{"enabled": false}}}}'  # passed through: fails at once
    json_header = "-H 'content-type: application/json'"
    command = parse_command(f"curl -s localhost:8000/v1/chat/completions {json_header} -d '{body}'")
    with pytest.raises(AssertionError, match="record the question"):
        check_http(command, context)


def test_rules_pass_what_exists(tmp_path: Path) -> None:
    script = (
        "python -m bench.overhead.selection --questions 200 --samples-per-question 64\n"
        "python -m bench.load.abuse --phases dropped\n"
        "python -m bench --list\n"
        "BLENDSERVE_BENCH_DATA=data python -m bench readme-full --reps 1\n"
        "python -m bench --data data abuse --duration 5\n"
        "python bench/recordings/report.py bench/recordings/data/qwen2.5-coder-0.5b.jsonl\n"
        "python3 -m venv .venv && . .venv/bin/activate && pip install -U -e '.[test]'\n"
        "pip install 'lm-eval[api]>=0.4.13' 'blendserve[vllm]'\n"
        "docker build -t blendserve-cpu --build-arg EXTRAS=embedded .\n"
        "docker compose --profile cpu up\n"
        "kubectl apply -k deploy/kubernetes\n"
        "blendserve serve --engine replay --data answers.jsonl --port 8001\n"
    )
    block = Block("p.md", 1, 3, "bash", script)
    check_shell_block(block, Context("http://127.0.0.1:1", {}, tmp_path))
