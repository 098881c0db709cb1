"""Writes the questions of the shipped recording (bench/recordings/README.md): the first 64
GSM8K test questions and the first 40 MATH-500 problems of level 1-3, from the vendored
fixtures, each with its answer key and answer format.

    python bench/recordings/make_questions.py > bench/recordings/questions.jsonl
"""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
GSM8K = "{}\nSolve it step by step. End with the line 'The answer is N.', N a number."
MATH = "{}\nSolve it step by step. Put the final answer in \\boxed{{}}."


def main() -> None:
    lines = (FIXTURES / "gsm8k_test_200.jsonl").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines[:64]):
        item = json.loads(line)
        gold = item["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        question = {"id": f"gsm8k-{i}", "prompt": GSM8K.format(item["question"])}
        print(json.dumps({**question, "gold": gold, "answer_format": "number"}))
    kept = 0
    for line in (FIXTURES / "math500_200.jsonl").read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        if item["level"] > 3 or kept == 40:
            continue
        kept += 1
        question = {"id": f"math500-{item['unique_id']}", "prompt": MATH.format(item["problem"])}
        print(json.dumps({**question, "gold": item["answer"], "answer_format": "math"}))


if __name__ == "__main__":
    main()
