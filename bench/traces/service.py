"""Trace rules through the service: ``POST /solve`` on a loopback server over the replay
engine, each decode step priced by the H100 profile, lengths and confidences as recorded.

    python -m bench.traces.service [--sets flat-d1,real,flat-d0,peaked-d1]
        [--budgets 12 24] [--rules count weighted:measure=auto ...] [--reps 2]
        [--time-scale 0.2]

What :mod:`bench.traces.simulate` measures in the simulator, here as a user gets it: for each set,
a client first sends the choosing half of its questions as traffic (what its learner is
taught from: agreement with each answer, no gold), then the reporting half, timed; a
fresh client for each rule and seed, so that no rule learns from another's traffic.
SC@32 is the reporting half sent as ``policy: sc`` with a question's 32 samples in one
request, every question at once. Each
request carries its questions' answer format; requests of several formats go at once on
one engine.

Per rule: error against the recording's gold (no gold: its plurality), samples and
completion tokens a question (a cut sample's tokens up to its cut, as the service
counts them), the samples stopped for each reason, and the modelled seconds until the
last answer (real seconds over ``--time-scale``: the replay engine's continuous batch,
``--capacity`` sequences, under the profile). Sets are those of :mod:`bench.traces.simulate`:
the real recording split in halves by the same seeded shuffle, or a synthetic family
with confidence informative to degree ``d`` (:mod:`blendserve.sim.trace_data`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn
from blendserve.answers import canonical_key
from blendserve.recordings.format import RecordedQuestion, merge, parse_record
from blendserve.service import Settings, create_app
from blendserve.sim.trace_data import trace_recording, write_recording
from blendserve.util.jsonl import read_jsonl

RECORDING = Path(__file__).parents[1] / "recordings" / "data" / "qwen2.5-coder-0.5b.jsonl"
RULES = (
    "count",
    "weighted:measure=auto",
    "filter:measure=auto,keep=0.1",
    "count:cut=30",
    "count:first_m=2",
    "weighted:measure=auto,cut=30",
    "filter:measure=auto,keep=0.1,cut=30",
)
CLIENT_HEADER = "x-bench-client"
#: The recordings' ``max_tokens``: a request's confidence window scales to it
#: (:meth:`~blendserve.core.signals.ConfidenceSpec.scaled`), and a replayed trace is cut
#: only where that window is the recorded one (64 tokens).
MAX_TOKENS = 512


def halves(set_name: str, seed: int) -> tuple[list[RecordedQuestion], list[RecordedQuestion]]:
    """The choosing and the reporting half of a set, as :mod:`bench.traces.simulate` splits it."""
    if set_name == "real":
        records = [parse_record(v, f"{RECORDING}:{n}") for n, v in read_jsonl(RECORDING, "rec")]
        loaded = merge(records)
        order = np.random.default_rng(seed).permutation(len(loaded))
        half = len(loaded) // 2
        return [loaded[i] for i in sorted(order[:half])], [loaded[i] for i in sorted(order[half:])]
    family, degree = set_name.split("-d")
    d = float(degree)
    ratio = 1.2 if d > 0 else 1.0
    choose = trace_recording(family, 100, 32, d, ratio, seed=seed + 1)
    report = trace_recording(family, 100, 32, d, ratio, seed=seed)
    # Two draws of one family share ids: the choosing half's are renamed.
    choose = [
        RecordedQuestion(f"w{q.id}", q.samples, q.prompt, q.messages, q.gold, q.extra)
        for q in choose
    ]
    return choose, report


def answer_format(question: RecordedQuestion) -> str:
    """The answer kind a question's answers are keyed by."""
    value = question.extra.get("answer_format", "auto")
    return value if isinstance(value, str) else "auto"


def gold_key(question: RecordedQuestion) -> str | None:
    """The question's right answer, keyed: its gold, else its recorded plurality."""
    kind = answer_format(question)
    if question.gold is not None:
        return canonical_key(question.gold, kind)
    counts = Counter(s.answer for s in question.samples if s.answer is not None)
    return canonical_key(counts.most_common(1)[0][0], kind) if counts else None


async def _solve(
    client: httpx.AsyncClient,
    questions: Sequence[RecordedQuestion],
    budget: int,
    who: str,
    **fields: Any,
) -> list[dict[str, Any]]:
    """Every question answered: one request per answer format, all at once."""
    by_format: dict[str, list[RecordedQuestion]] = {}
    for q in questions:
        by_format.setdefault(answer_format(q), []).append(q)

    async def one(kind: str, group: list[RecordedQuestion]) -> list[dict[str, Any]]:
        body = {
            "questions": [{"id": q.id, "prompt": q.prompt or q.id} for q in group],
            "budget_per_question": budget,
            "answer": {"kind": kind},
            **fields,
        }
        reply = await client.post("/solve", json=body, headers={CLIENT_HEADER: who})
        if reply.status_code != 200:
            raise RuntimeError(f"/solve answered {reply.status_code}: {reply.text[:500]}")
        answers: list[dict[str, Any]] = reply.json()["answers"]
        return answers

    groups = await asyncio.gather(*(one(k, g) for k, g in by_format.items()))
    return [a for group in groups for a in group]


def _figures(
    answers: list[dict[str, Any]], questions: Sequence[RecordedQuestion], seconds: float
) -> dict[str, Any]:
    gold = {q.id: (gold_key(q), answer_format(q)) for q in questions}
    wrong = 0
    stops: Counter[str] = Counter()
    for answer in answers:
        key, kind = gold[answer["id"]]
        given = answer["answer"]
        wrong += given is None or key is None or canonical_key(given, kind) != key
        stops.update(answer.get("stops", {}))
    n = len(answers)
    return {
        "error": wrong / n,
        "samples": sum(a["samples"] for a in answers) / n,
        "tokens": sum(a["usage"]["completion_tokens"] for a in answers) / n,
        "seconds": seconds,
        "stops": {k: v / n for k, v in stops.items() if v},
    }


async def _run(
    port: int,
    choose: list[RecordedQuestion],
    report: list[RecordedQuestion],
    rule: str,
    budget: int,
    seed: int,
    scale: float,
) -> dict[str, Any]:
    who = f"{rule}#{seed}"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=3600) as client:
        fields: dict[str, Any] = {"sampling": {"seed": seed, "max_tokens": MAX_TOKENS}}
        if rule == "sc@32":  # a question's 32 samples in one request, all at once
            fields.update(policy="sc", in_flight_per_question=32, concurrency=4096)
            budget = 32
        else:
            fields["traces"] = rule
            await _solve(client, choose, budget, who, **fields)  # the client's earlier traffic
        start = time.perf_counter()
        answers = await _solve(client, report, budget, who, **fields)
        seconds = (time.perf_counter() - start) / scale
    return _figures(answers, report, seconds)


def evaluate(set_name: str, rules: Sequence[str], args: argparse.Namespace) -> str:
    """The table of one set."""
    choose, report = halves(set_name, args.seed)
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "set.jsonl"
        write_recording(data, [*choose, *report])
        settings = Settings(
            engine="replay",
            data=data,
            replay_profile=args.profile,
            replay_time_scale=args.time_scale,
            replay_capacity=args.capacity,
            client_header=CLIENT_HEADER,
            default_concurrency=args.capacity,
        )
        app = create_app(settings)
        server = uvicorn.Server(uvicorn.Config(app, port=0, log_level="warning"))
        thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            rows = []
            for budget, rule in [(32, "sc@32")] + [(b, r) for b in args.budgets for r in rules]:
                runs = [
                    asyncio.run(_run(port, choose, report, rule, budget, seed, args.time_scale))
                    for seed in range(args.reps)
                ]
                rows.append((budget, rule, runs))
        finally:
            server.should_exit = True
            thread.join()
    sc_tokens = statistics.fmean(r["tokens"] for r in rows[0][2])
    lines = [
        f"### {set_name}: {len(report)} questions reported, after {len(choose)} taught; "
        f"{args.reps} seeds\n",
        "| rule | budget/q | error | samples/q | tokens/q | tokens vs SC@32 | modelled s "
        "| stopped/q |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for budget, rule, runs in rows:
        stops: Counter[str] = Counter()
        for r in runs:
            stops.update(r["stops"])
        mean = {k: statistics.fmean(r[k] for r in runs) for k in ("error", "samples", "tokens")}
        seconds = statistics.fmean(r["seconds"] for r in runs)
        stopped = ", ".join(
            f"{k} {v / len(runs):.1f}" for k, v in sorted(stops.items()) if k != "finished"
        )
        lines.append(
            f"| `{rule}` | {budget} | {mean['error']:.3f} | {mean['samples']:.1f} | "
            f"{mean['tokens']:.0f} | {mean['tokens'] / sc_tokens:.2f} | {seconds:.1f} | "
            f"{stopped or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="flat-d1,real,flat-d0,peaked-d1")
    parser.add_argument("--rules", nargs="+", default=list(RULES))
    parser.add_argument(
        "--budgets", type=int, nargs="+", default=[12, 24], help="samples a question"
    )
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="qwen2.5-7b-h100")
    parser.add_argument("--time-scale", type=float, default=0.2)
    parser.add_argument("--capacity", type=int, default=256)
    args = parser.parse_args(argv)
    for set_name in filter(None, args.sets.split(",")):
        print(evaluate(set_name, args.rules, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
