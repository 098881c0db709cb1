"""Blend-ASC decision cost: time per select(1) + observe() through a whole budget.

Usage: python -m bench.overhead.selection [--questions 200,10000] [--samples-per-question 64]

Each question answers "a" with its own probability, else one of two others,
so the vote states spread as in real jobs. Prints microseconds per decision
(selection alone and selection plus the vote update) and decisions per second.
"""

from __future__ import annotations

import argparse
import random
import time

from blendserve.core import PolicySpec


def bench(
    policy_name: str, num_questions: int, per_question: int, seed: int = 0
) -> tuple[float, float]:
    rng = random.Random(seed)
    p_right = [rng.uniform(0.3, 0.95) for _ in range(num_questions)]
    policy = PolicySpec.parse(policy_name).build(
        num_questions, num_questions * per_question, seed=seed
    )
    answers = [rng.random() for _ in range(num_questions * per_question)]
    clock = time.perf_counter_ns
    select_ns = total_ns = 0
    decisions = 0
    while True:
        start = clock()
        chosen = policy.select(1)
        picked = clock()
        if not chosen:
            break
        q = chosen[0]
        u = answers[decisions]
        policy.observe(q, "a" if u < p_right[q] else ("b" if u < 0.5 + p_right[q] / 2 else "c"))
        done = clock()
        select_ns += picked - start
        total_ns += done - start
        decisions += 1
    return select_ns / decisions / 1e3, total_ns / decisions / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", default="200,10000")
    parser.add_argument("--samples-per-question", type=int, default=64)
    parser.add_argument("--policies", default="blend,asc,sc")
    args = parser.parse_args()
    bench("blend", 50, 4)  # load the compiled kernels once
    print("| policy | questions | budget | select us | select+observe us | decisions/s |")
    print("|---|---|---|---|---|---|")
    for name in args.policies.split(","):
        for n in (int(x) for x in args.questions.split(",")):
            per_q = args.samples_per_question if n <= 1000 else 8
            select_us, total_us = bench(name, n, per_q)
            rate = 1e6 / total_us
            budget = n * per_q
            print(f"| {name} | {n} | {budget} | {select_us:.1f} | {total_us:.1f} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
