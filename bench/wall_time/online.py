"""Online self-consistency through ``/v1`` with the official SDK, against the grouping window.

Usage: python -m bench.wall_time.online [DATA_DIR] [--questions 300] [--concurrency 1,8,64]
    [--synthetic flat,many,mixed] [--files none] [--max-rounds 4,0] [--modes online]
    [--passes 1] [--profile qwen2.5-7b-h100] [--lengths cot] [--time-scale 0.05]

For each recorded set (questions in a seeded random order; a recording, or
older ``answers`` data), a real uvicorn server on loopback over the replay
engine (``--latency`` seconds a request) answers chat completions sent by
``openai.AsyncOpenAI`` at each client concurrency (``--profile``: the engine
batches continuously, each step priced by a decode-step profile and run
``--time-scale`` times as fast, latencies reported in modelled time; a
recording's samples last their recorded tokens, ``--lengths`` draws the
lengths of samples without them), in each of ``--modes``: the default online mode, the 50 ms
grouping window (``sc_mode=grouped``), and ``sc``, plain SC@32 asked through
the same endpoint (``policy: sc`` with 32 samples a question, sent at once:
two requests of 16 in one wave). Prints mean samples per question, reducible
error (answers that are not the recorded mode) next to SC@32's expected
error on the same questions (32 samples of each, null answers not voting,
ties to the answer first to reach the top count, averaged over 2000 draws),
request latency p50/p99, engine rounds per question (online: the pool's
waves, mean and p50/p95; grouped and sc: engine requests per question,
p50/p95),
engine requests per question and the pacing error after 100, 200 and 500
questions. Every loop is bounded by the question count.

The recorded sets run at the mean budgets of :data:`BUDGETS`. ``--synthetic``
adds synthetic families of the simulator (``--questions`` of each, served
exactly from their distributions), each at the mean budget with which the
simulator's online method reaches SC@32's error on those questions (found
when the bench starts; SC@32 when it never does).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openai
import uvicorn
from blendserve.engines.replay import LENGTHS, LatencyModel, ReplayEngine
from blendserve.engines.step_cost import load_step_cost
from blendserve.recordings.format import RecordedQuestion, merge, parse_record
from blendserve.service import Settings, create_app
from blendserve.sim.data import Dataset
from blendserve.sim.efficiency import sample_efficiency
from blendserve.util.jsonl import read_jsonl
from numpy.typing import NDArray

from bench.records import CountingReplayEngine, Record, StreamEngine, percentiles, synthetic_records

# Mean budgets at which the simulator's online method reaches SC@32's error.
BUDGETS = {
    "esc_lastletters_gpt35.jsonl": 5.2,
    "faithfulcot_date_codex_ltm.jsonl": 3.2,
    "trove_math_codellama7b_pot.jsonl": 19.0,
}
TARGET = 32
#: Draws of SC@32 per question for its expected error.
SC_DRAWS = 2000


def _records(path: Path, limit: int, seed: int) -> list[tuple[RecordedQuestion, str]]:
    """The recorded questions of at least 8 answers and a unique mode, with that mode, in a
    seeded random order (lines of one id are one question)."""
    lines = read_jsonl(path, "recorded answers")
    kept = []
    for question in merge(parse_record(record, f"{path}:{n}") for n, record in lines):
        answers = [a for a in question.answers if a is not None]
        top = Counter(answers).most_common(2)
        if len(answers) >= 8 and (len(top) == 1 or top[0][1] > top[1][1]):
            kept.append((question, top[0][0]))
    random.Random(seed).shuffle(kept)
    return kept[:limit]


def _synthetic(family: str, limit: int, seed: int) -> list[Record]:
    """A synthetic family's questions in a seeded random order, as ``_records`` orders them."""
    kept = synthetic_records(family, limit, seed)
    random.Random(seed).shuffle(kept)
    return kept


def _recorded_distributions(
    records: list[RecordedQuestion],
) -> list[tuple[list[str | None], NDArray[np.float64]]]:
    """Each record's answers (nulls included, as the replay engine serves them) and frequencies."""
    distributions = []
    for record in records:
        answers = record.answers
        values = list(dict.fromkeys(answers))
        counts = np.array([answers.count(v) for v in values], dtype=float)
        distributions.append((values, counts / counts.sum()))
    return distributions


def sc_error(
    distributions: list[tuple[list[str | None], NDArray[np.float64]]],
    modes: list[str],
    draws: int = SC_DRAWS,
    seed: int = 0,
) -> float:
    """SC@32's expected reducible error: the share of questions whose vote misses the mode.

    Each question draws 32 samples ``draws`` times; null answers do not vote,
    a question with no vote is wrong, and a tie goes to the answer that
    reached the top count first (as :class:`VoteState` breaks it).
    """
    rng = np.random.default_rng(seed)
    wrong = 0.0
    for (values, probs), mode in zip(distributions, modes, strict=True):
        k = len(values)
        drawn = np.minimum(
            np.searchsorted(np.cumsum(probs), rng.random((draws, TARGET)), side="right"), k - 1
        )
        voting = np.array([v is not None for v in values])
        rows = np.repeat(np.arange(draws), TARGET)
        counts = np.zeros((draws, k), dtype=np.int64)
        np.add.at(counts, (rows, drawn.ravel()), 1)
        counts[:, ~voting] = 0
        # an answer reaches its final count at its last occurrence
        last = np.full((draws, k), -1, dtype=np.int64)
        np.maximum.at(last, (rows, drawn.ravel()), np.tile(np.arange(TARGET), draws))
        top = counts.max(axis=1, keepdims=True)
        first_to_top = np.where(counts == top, last, TARGET).argmin(axis=1)
        right = (top[:, 0] > 0) & (np.array(values, dtype=object)[first_to_top] == mode)
        wrong += 1.0 - float(right.mean())
    return wrong / len(modes)


def sim_budget(records: list[Record], reps: int) -> float:
    """Mean samples with which the simulator's online method reaches SC@32's error (32: never)."""
    dataset = Dataset("synthetic", [r.id for r in records], [r.probs for r in records])
    # The budget of the online rule deciding wave by wave with no bound on waves
    # (``rounds=0``), as it ran before waves were bounded.
    label = "online:rounds=0"
    result = sample_efficiency(dataset, [TARGET], [label], reps=reps)[0].methods[label]
    return round(result.samples, 1) if result.reached else float(TARGET)


def _serve(engine: ReplayEngine, **settings: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    async def factory() -> ReplayEngine:
        return engine

    app = create_app(Settings(**settings), engine_factory=factory)
    server = uvicorn.Server(uvicorn.Config(app, port=0, log_level="warning", access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}/v1"


async def _ask_all(
    url: str, records: list[dict[str, Any]], concurrency: int, options: dict[str, Any]
) -> list[tuple[float, dict[str, Any]]]:
    gate = asyncio.Semaphore(concurrency)
    results: list[tuple[float, dict[str, Any]]] = []
    async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:

        async def one(record: dict[str, Any]) -> None:
            async with gate:
                start = time.perf_counter()
                reply = await client.chat.completions.create(
                    model="replay",
                    messages=[{"role": "user", "content": str(record["id"])}],
                    extra_body=options,
                )
                vote = (reply.model_extra or {})["blendserve"]
                vote["tokens"] = reply.usage.completion_tokens if reply.usage else 0
                vote["correct"] = vote["answer"] == str(record["mode"])
                results.append((time.perf_counter() - start, vote))

        await asyncio.gather(*(one(r) for r in records))
    return results


@dataclass
class QuestionSet:
    """One table block: the questions a client asks, at which budget, and how they are served.

    Attributes:
        name: the set's name in the table.
        questions: ``id`` (the message sent) and ``mode`` (the right answer) of each.
        budget: mean samples per question asked for.
        sc_error: SC@32's expected reducible error on these questions.
        engine: ``(seed, latency) ->`` the engine serving them.
    """

    name: str
    questions: list[dict[str, Any]]
    budget: float
    sc_error: float
    engine: Callable[[int, LatencyModel], CountingReplayEngine]


def recorded_set(path: Path, limit: int) -> QuestionSet:
    """A recorded set, served by the replay engine from its recorded samples (nulls included,
    with their recorded lengths where the recording has them)."""
    kept = _records(path, limit, seed=0)
    records = [question for question, _ in kept]
    modes = [mode for _, mode in kept]
    return QuestionSet(
        f"{path.stem} ({len(records)} q)",
        [{"id": question.id, "mode": mode} for question, mode in kept],
        BUDGETS[path.name],
        sc_error(_recorded_distributions(records), modes),
        lambda seed, latency: CountingReplayEngine(records, seed=seed, latency=latency),
    )


def synthetic_set(family: str, limit: int, seed: int, reps: int) -> QuestionSet:
    """A synthetic family, served exactly from its distributions, at the simulator's budget."""
    records = _synthetic(family, limit, seed)
    distributions: list[tuple[list[str | None], NDArray[np.float64]]] = [
        (list(r.answers), r.probs) for r in records
    ]
    return QuestionSet(
        f"synthetic {family} ({len(records)} q)",
        [{"id": r.id, "mode": r.mode} for r in records],
        sim_budget(records, reps),
        sc_error(distributions, [r.mode for r in records]),
        lambda engine_seed, latency: StreamEngine(records, engine_seed, latency),
    )


def run(
    questions: QuestionSet,
    mode: str,
    concurrency: int,
    latency: LatencyModel,
    max_rounds: int,
    engine_seed: int = 0,
) -> dict[str, Any]:
    """One pass over the set's questions (the engine's draws seeded by ``engine_seed``)."""
    engine = questions.engine(concurrency + engine_seed, latency)
    budget = questions.budget
    settings = {
        "sc_mode": "online" if mode == "sc" else mode,
        "default_concurrency": 64,
        "max_concurrent_jobs": 256,
        "default_max_rounds": max_rounds,
    }
    server, thread, url = _serve(engine, **settings)
    try:
        blendserve = {"answer": "exact", "budget_per_question": budget}
        if mode == "sc":  # SC@32: a job of the question's 32 samples sent at once
            blendserve = {"answer": "exact", "budget_per_question": TARGET, "policy": "sc"}
        options = {"blendserve": blendserve}
        results = asyncio.run(_ask_all(url, questions.questions, concurrency, options))
        pools = server.config.app.state.service.dropin.pools.pools.values()
        rounds = sum(p.num_rounds for p in pools)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    latencies = np.array([t for t, _ in results]) / latency.time_scale
    samples = np.array([v["samples"] for _, v in results])
    running = np.cumsum(samples) / np.arange(1, len(samples) + 1)

    def pacing(k: int) -> str:
        return f"{running[k - 1] / budget - 1:+.1%}" if len(samples) >= k else "-"

    # Online: the waves of each question, as its pool counted them; grouped:
    # the engine requests of each question (a job's rounds).
    per_question = (
        engine.pool_rounds if mode == "online" else list(engine.requests_per_question.values())
    )
    return {
        "samples": float(samples.mean()),
        "tokens": float(np.mean([v["tokens"] for _, v in results])),
        "error": 1 - float(np.mean([v["correct"] for _, v in results])),
        "p50_ms": 1000 * float(np.percentile(latencies, 50)),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "rounds": rounds / len(results) if mode == "online" else float("nan"),
        "rounds_p50_p95": percentiles(per_question),
        "requests_per_q": engine.stats.requests / len(results),
        "pacing": " / ".join(pacing(k) for k in (100, 200, 500)),
    }


def _mean_of_passes(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Passes with other engine draws, averaged: their means, the highest rounds p50/p95,
    and the first pass's pacing (the questions come in the same order in every pass)."""
    mean = {
        key: float(np.mean([r[key] for r in rows]))
        for key, v in rows[0].items()
        if isinstance(v, float)
    }
    worst = [max(column) for column in zip(*(r["rounds_p50_p95"] for r in rows), strict=True)]
    return {**mean, "rounds_p50_p95": worst, "pacing": rows[0]["pacing"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "data_dir", type=Path, nargs="?", default=Path("../shared/data"),
        help="folder of the recorded sets: recordings (their lengths used where they have "
        "them) or older answers",
    )  # fmt: skip
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per engine request")
    parser.add_argument(
        "--profile", help="a decode-step profile: continuous batching instead of --latency"
    )
    parser.add_argument(
        "--lengths", default="cot", choices=["cot", "reasoning"],
        help="with --profile: the lengths drawn for samples without recorded tokens (synthetic "
        "sets, older answers data); a recording's own lengths are used where it has them",
    )  # fmt: skip
    parser.add_argument(
        "--time-scale", type=float, default=0.05, help="with --profile: real seconds a modelled one"
    )
    parser.add_argument("--modes", default="online,grouped")
    parser.add_argument(
        "--max-rounds", default="4", help="the server's default_max_rounds, each (0: no bound)"
    )
    parser.add_argument(
        "--files", default=",".join(BUDGETS), help="recorded sets (of BUDGETS; none: no recorded)"
    )
    parser.add_argument(
        "--synthetic", default="", help="comma-separated synthetic families (flat,many,mixed,...)"
    )
    parser.add_argument("--synthetic-seed", type=int, default=0)
    parser.add_argument(
        "--passes", type=int, default=1, help="passes with other engine draws, averaged"
    )
    parser.add_argument(
        "--sim-reps", type=int, default=10, help="simulator repetitions finding a family's budget"
    )
    args = parser.parse_args()
    latency = LatencyModel(fixed=args.latency)
    if args.profile:
        latency = LatencyModel(
            step_cost=load_step_cost(args.profile),
            length=LENGTHS[args.lengths],
            time_scale=args.time_scale,
        )
    sets: list[Callable[[], QuestionSet]] = []
    if args.files != "none":
        sets += [
            functools.partial(recorded_set, args.data_dir / name, args.questions)
            for name in args.files.split(",")
        ]
    sets += [
        functools.partial(synthetic_set, family, args.questions, args.synthetic_seed, args.sim_reps)
        for family in filter(None, args.synthetic.split(","))
    ]
    print(
        "| data | mode | max_rounds | clients | budget | samples/q | tokens/q | error "
        "| SC@32 error | p50 ms | p99 ms | rounds/q | rounds p50/p95 | requests/q "
        "| pacing @100/200/500 |"
    )
    print("|" + "---|" * 15)
    for make in sets:
        questions = make()
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            for mode, rounds in itertools.product(
                args.modes.split(","), (int(r) for r in args.max_rounds.split(","))
            ):
                row = _mean_of_passes(
                    [
                        run(questions, mode, concurrency, latency, rounds, 7919 * k)
                        for k in range(args.passes)
                    ]
                )
                p50, p95 = row["rounds_p50_p95"]
                print(
                    f"| {questions.name} | {mode} | {rounds} | {concurrency} "
                    f"| {questions.budget:g} | {row['samples']:.2f} | {row['tokens']:.0f} "
                    f"| {row['error']:.3f} "
                    f"| {questions.sc_error:.3f} "
                    f"| {row['p50_ms']:.0f} | {row['p99_ms']:.0f} | {row['rounds']:.2f} "
                    f"| {p50:.0f} / {p95:.0f} "
                    f"| {row['requests_per_q']:.2f} | {row['pacing']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
