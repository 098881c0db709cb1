"""lm-evaluation-harness, unchanged, scores a GSM8K task through the drop-in ``/v1``.

The real ``blendserve serve --engine replay`` on loopback; lm-eval's own CLI in
a subprocess with its ``local-completions`` (batches of prompts) and
``local-chat-completions`` API models, several requests at once, on a local
zero-shot copy of its ``gsm8k`` task over the vendored GSM8K fixture (nothing
is downloaded). The replay data is built from the fixture so that the score
is known in advance: a question's recorded answers are all its gold answer,
or all one wrong answer.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from blendserve.testing.command import serve_command

pytestmark = [pytest.mark.lmeval, pytest.mark.slow]

FIXTURE = Path(__file__).parent.parent / "fixtures" / "gsm8k_test_200.jsonl"
BUDGET = 4
TEXT_PROMPTS = "tokenizer_backend=None,tokenized_requests=False"  # no tokenizer here
# The stock gsm8k task, zero-shot, on local JSONL; "blendserve" reaches the service unchanged.
TASK = """\
task: gsm8k_fixture
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: false
    regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
generation_kwargs:
  until: ["Question:", "</s>", "<|im_end|>"]
  do_sample: false
  temperature: 0.0
  blendserve:
    budget_per_question: {budget}
    answer: number
num_fewshot: 0
filter_list:
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
      - function: take_first
metadata:
  version: 3.0
"""


def _gold(answer: str) -> str:
    return answer.split("#### ")[-1].strip().replace(",", "")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The task, and replay data whose vote is known: every fifth question wrong."""
    root = tmp_path_factory.mktemp("lm_eval")
    (root / "tasks").mkdir()
    (root / "tasks" / "gsm8k_fixture.yaml").write_text(TASK.format(data=FIXTURE, budget=BUDGET))
    records = []
    for i, line in enumerate(FIXTURE.read_text().splitlines()):
        doc = json.loads(line)
        gold = _gold(doc["answer"])
        # Unanimous: lm-eval sends one seed with every request, so the replay
        # engine, like vLLM, draws the same samples for the same seed.
        answers = [str(int(gold) + 1) if i % 5 == 4 else gold] * 8
        records.append({"prompt": f"Question: {doc['question']}\nAnswer:", "answers": answers})
    (root / "replay.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def _samples_per_question(url: str) -> tuple[float, float]:
    """Questions answered and samples they took, from the service's own histogram."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {
        name: float(value)
        for name, value in re.findall(
            r"^blendserve_samples_per_question_(count|sum) (\S+)$", text, re.MULTILINE
        )
    }
    return found["count"], found["sum"]


def _lm_eval(workdir: Path, out: Path, model: str, model_args: str, *extra: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "HF_HOME": str(workdir / "hf"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args,
               "--tasks", "gsm8k_fixture", "--include_path", str(workdir / "tasks"),
               "--output_path", str(out), "--log_samples", *extra]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-4000:]
    (results,) = out.rglob("results_*.json")
    (samples,) = out.rglob("samples_gsm8k_fixture_*.jsonl")
    return {
        "results": json.loads(results.read_text())["results"]["gsm8k_fixture"],
        "samples": [json.loads(line) for line in samples.read_text().splitlines()],
    }


@pytest.mark.parametrize(
    ("model", "args", "extra"),
    [
        ("local-completions", TEXT_PROMPTS, ["--batch_size", "4"]),
        ("local-chat-completions", "", ["--apply_chat_template"]),
    ],
    ids=["completions", "chat"],
)
def test_lm_eval_scores_the_fixture_task_with_every_answer_voted(
    workdir: Path, tmp_path: Path, model: str, args: str, extra: list[str]
) -> None:
    data = workdir / "replay.jsonl"
    # lm-eval's gsm8k decodes greedily (temperature 0): the server samples those at 0.8.
    serve = ("--engine", "replay", "--data", str(data), "--sc-greedy-temperature", "0.8")
    with serve_command(*serve, stderr=tmp_path / "serve.log") as (url, _):
        route = "chat/completions" if model.startswith("local-chat") else "completions"
        model_args = f"model=replay,base_url={url}/v1/{route},num_concurrent=8,max_retries=1"
        run = _lm_eval(workdir, tmp_path / "out", model, f"{model_args},{args}".rstrip(","), *extra)
        answered, samples = _samples_per_question(url)
    docs = run["samples"]
    assert len(docs) == 200
    empty = [doc["doc_id"] for doc in docs if not doc["resps"][0][0].strip()]
    assert not empty, f"{len(empty)} questions came back empty: {empty[:20]}"
    assert all(doc["filtered_resps"][0] != "[invalid]" for doc in docs)
    expected = sum(1 for doc in docs if doc["doc_id"] % 5 != 4) / len(docs)
    assert run["results"]["exact_match,flexible-extract"] == pytest.approx(expected)
    assert expected == pytest.approx(0.8)
    print(f"{model}: {samples / answered:.2f} samples per question")
    assert answered == len(docs)
    # Sampled at the greedy temperature, paced to the task's budget (a mean, so
    # some slack): not one greedy sample.
    assert 1 < samples / answered <= 1.25 * BUDGET
