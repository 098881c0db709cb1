"""Named presets: the command lines behind the documented figures, run by ``python -m bench``.

Each preset is a module of ``bench`` and its arguments, the figure it produces, the data
it needs and how long it takes. Data (:data:`DATA_KINDS`):

- ``shipped``: synthetic families and the repository's own fixtures and recording
  (``bench/recordings/``), or fakes; nothing to fetch;
- ``recorded``: the three recorded sets of the paper's authors (``esc_lastletters_gpt35``,
  ``faithfulcot_date_codex_ltm``, ``trove_math_codellama7b_pot``), not in this
  repository: their folder is given as ``--data DIR`` or in :data:`DATA_ENV`, and takes
  the place of :data:`DATA` in the arguments;
- ``vllm``: a vLLM OpenAI server (CPU or GPU) on ``127.0.0.1:8001``, or the vLLM lane's
  ``.venv-vllm/`` (``.ci/vllm-lane``);
- ``gpu``: a GPU-served model behind vLLM and blendserve;
- ``llama``: the embedded llama.cpp model (the ``embedded`` extra).

Arguments given after a preset's name are appended to its own (argparse keeps the last
value of an option given twice, so they also override).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Data = Literal["shipped", "recorded", "vllm", "gpu", "llama"]
DATA_KINDS: tuple[Data, ...] = ("shipped", "recorded", "vllm", "gpu", "llama")
#: Stands for the recorded sets' folder in a preset's arguments.
DATA = "{data}"
#: The environment variable naming the recorded sets' folder.
DATA_ENV = "BLENDSERVE_BENCH_DATA"
#: The recorded sets, as their folder holds them.
RECORDED_SETS = (
    "esc_lastletters_gpt35.jsonl",
    "faithfulcot_date_codex_ltm.jsonl",
    "trove_math_codellama7b_pot.jsonl",
)
#: The shipped recording's folder, relative to the repository root (where presets run).
SHIPPED = "bench/recordings/data"
#: A vLLM OpenAI server where the docs start one.
VLLM_URL = "http://127.0.0.1:8001/v1"


@dataclass(frozen=True)
class Preset:
    """One named command line of a benchmark module."""

    name: str
    #: The module run as ``python -m MODULE``.
    module: str
    args: tuple[str, ...]
    #: What it produces, one line.
    figure: str
    data: Data
    #: Minutes on 2 cores (None: not timed yet).
    minutes: float | None = None


# fmt: off
_README_ARGS = (
    "--synthetic", "flat,llm", "--http", "--profile", "qwen2.5-7b-h100", "--capacity", "256",
    "--sizes", "64", "--reps", "3", "--jobs", "2", "--wave-seconds", "0.2",
)
_ABUSE = "bench.load.abuse"

PRESETS: tuple[Preset, ...] = (
    Preset(
        "readme", "bench.wall_time.latency", (SHIPPED, *_README_ARGS),
        "the README's headline: the default against SC@32 through POST /solve, on the shipped "
        "recording and two synthetic families", "shipped", 6,
    ),
    Preset(
        "readme-full", "bench.wall_time.latency", (DATA, *_README_ARGS),
        "the README's headline on the recorded sets and two synthetic families", "recorded", 15,
    ),
    Preset(
        "paper-table", "bench.samples.paper_table",
        (DATA, "--reps", "20", "--synthetic", "d1,llm,flat,d2,many,ties,mixed"),
        "samples a question to match SC@x, every policy, recorded sets and synthetic "
        "families (policies.md)", "recorded", 60,
    ),
    Preset(
        "e2e-efficiency", "bench.samples.e2e_efficiency",
        (DATA, "--sizes", "64", "--concurrency", "64", "--reps", "8",
         "--synthetic", "flat,many,mixed"),
        "the default through the real scheduler against one sample at a time, jobs of 64",
        "recorded", 30,
    ),
    Preset(
        "latency-idle", "bench.wall_time.latency",
        (DATA, "--synthetic", "flat,llm", "--reps", "2", "--jobs", "2", "--capacity", "256",
         "1024", "--profile", "qwen2.5-7b-h100", "--lengths", "cot"),
        "one job of 64 on an idle engine (H100 profile): budget, tokens and seconds "
        "against SC@32", "recorded", 8,
    ),
    Preset(
        "latency-http", "bench.wall_time.latency",
        (DATA, "--synthetic", "llm,flat,d1", "--reps", "1", "--jobs", "1",
         "--capacity", "256", "1024", "--profile", "qwen2.5-7b-h100", "--http",
         "--wave-seconds", "1"),
        "the same jobs through POST /solve on loopback, in real time", "recorded", 15,
    ),
    Preset(
        "latency-load", "bench.wall_time.latency",
        ("--load", "--reps", "4", "--capacity", "256", "--bar", "expected",
         "--profile", "qwen2.5-7b-h100", "--lengths", "cot",
         "--synthetic", "flat,d1,many,ties,llm"),
        "every job of a set at once on a full engine: questions a second against SC@32",
        "shipped", 15,
    ),
    Preset(
        "latency-load-http", "bench.wall_time.latency",
        ("--http", "--load", "--reps", "1", "--capacity", "256", "--profile",
         "qwen2.5-7b-h100", "--wave-seconds", "1.0", "--synthetic", "flat"),
        "the same load through POST /solve on one server on loopback", "shipped", 8,
    ),
    Preset(
        "online", "bench.wall_time.online",
        (DATA, "--questions", "200", "--concurrency", "1", "--modes", "online,sc",
         "--synthetic", "llm,flat", "--profile", "qwen2.5-7b-h100", "--time-scale", "0.1"),
        "single /v1 requests through the OpenAI SDK: samples, tokens, p50/p99 against SC@32",
        "recorded", 15,
    ),
    Preset(
        "stragglers", "bench.wall_time.stragglers", (),
        "when a job's answers come with stragglers, with and without --engine-capacity",
        "shipped", 1.5,
    ),
    Preset(
        "traces", "bench.traces.simulate", ("--reps", "3"),
        "trace rules against counting, DeepConf and SC@32 in the simulator (traces.md)",
        "shipped", 2,
    ),
    Preset(
        "traces-service", "bench.traces.service", (),
        "trace rules through POST /solve on the H100 profile (traces.md)", "shipped", 30,
    ),
    Preset(
        "deepconf", "bench.traces.deepconf_engine", ("--clock", "virtual"),
        "DeepConf online and offline run against the replay engine: modelled seconds",
        "shipped", 1,
    ),
    Preset(
        "logprobs", "bench.traces.logprobs", ("--max-tokens", "32", "--reps", "2"),
        "tokens a second with top logprobs asked or not: llama.cpp and vLLM (engines.md)",
        "vllm", 5,
    ),
    Preset(
        "overhead-selection", "bench.overhead.selection", (),
        "microseconds a Blend-ASC, ASC and SC decision", "shipped", 1,
    ),
    Preset(
        "overhead-scheduler", "bench.overhead.scheduler",
        (f"{DATA}/esc_lastletters_gpt35.jsonl", "--questions", "500"),
        "samples a second through POST /solve on a zero-latency engine", "recorded", 1,
    ),
    Preset(
        "answers", "bench.overhead.answers", (),
        "answer extraction and keys a sample, cold and cached", "shipped", 1,
    ),
    Preset(
        "openai-engine", "bench.engines.openai_engine", (),
        "samples a second one process pushes through the OpenAI engine", "shipped", 1,
    ),
    Preset(
        "cost-model", "bench.engines.cost_model", ("--upstream", VLLM_URL),
        "the cost model's predicted against measured wall times on a real vLLM", "vllm", 10,
    ),
    Preset(
        "vllm-waves", "bench.engines.vllm",
        ("--upstream", VLLM_URL, "--service", "http://127.0.0.1:8000",
         "--model", "Qwen/Qwen2.5-7B-Instruct"),
        "a wave's time on vLLM, and what blendserve adds in front (engines.md)", "gpu",
    ),
    Preset(
        "llama-build", "bench.engines.llama_build", (),
        "tokens a second of the installed llama.cpp build on the embedded model", "llama", 2,
    ),
    Preset(
        "load", "bench.load.load",
        (f"{DATA}/esc_lastletters_gpt35.jsonl", "--clients", "200", "--duration", "60"),
        "200 clients for two minutes: requests, errors, latency and leak checks", "recorded", 2,
    ),
    Preset(
        "abuse", _ABUSE, (f"{DATA}/esc_lastletters_gpt35.jsonl",),
        "all seventeen hostile phases: /health and fresh /solve beside each", "recorded", 8,
    ),
    Preset(
        "abuse-inputs", _ABUSE, ("--phases", "dropped", "labels", "sympy", "tokenizer"),
        "dropped clients, minted labels, shared sympy, tokenizer floods", "shipped", 2,
    ),
    Preset(
        "abuse-faults", _ABUSE, ("--phases", "breaker", "keys", "hung", "nested", "accounting"),
        "upstream faults: breaker, answer keys, hung and nested upstreams, accounting",
        "shipped", 1.5,
    ),
    Preset(
        "abuse-clients", _ABUSE, ("--phases", "clients", "extra", "auth", "metrics", "replay"),
        "many clients, doubled keys, large extras, metrics floods, replay jams",
        "shipped", 1.25,
    ),
)
# fmt: on
BY_NAME = {preset.name: preset for preset in PRESETS}


class MissingData(ValueError):
    """A ``recorded`` preset was given no folder of the recorded sets."""


def command(preset: Preset, extra: Sequence[str] = (), data: str | Path | None = None) -> list[str]:
    """The preset's command line, ``python -m MODULE ARGS EXTRA``, with ``data`` (the
    recorded sets' folder) in place of :data:`DATA`.

    Raises:
        MissingData: the preset needs the recorded sets and ``data`` is None.
    """
    if preset.data == "recorded" and data is None:
        raise MissingData(
            f"{preset.name} needs the recorded sets ({', '.join(RECORDED_SETS)}): "
            f"pass their folder as --data DIR or in {DATA_ENV}"
        )
    args = [arg.replace(DATA, str(data)) for arg in preset.args]
    return ["python", "-m", preset.module, *args, *extra]


def table() -> str:
    """The presets as a Markdown table: name, figure, data, minutes on 2 cores."""
    lines = ["| preset | produces | data | minutes (2 cores) |", "|---|---|---|---|"]
    for preset in PRESETS:
        minutes = "?" if preset.minutes is None else f"{preset.minutes:g}"
        lines.append(f"| `{preset.name}` | {preset.figure} | {preset.data} | {minutes} |")
    return "\n".join(lines)


def describe(preset: Preset) -> str:
    """The preset's command line as a shell would read it (the data folder as DATA_DIR)."""
    data = "DATA_DIR" if preset.data == "recorded" else None
    return shlex.join(command(preset, data=data))
