"""Tokens a second of the installed llama.cpp on the embedded model: how a build compares.

Loads the embedded default's model (Qwen2.5-Coder-0.5B Q4_K_M) in this
process with llama-cpp-python and times, over several repetitions, a prompt's
evaluation and a fixed number of generated tokens (one sequence, greedy, no
early stop). Prints the build's ``GGML_*`` instruction options beside the
medians, so that two builds (tuned to the machine, and portable) can be
compared by running it under each::

    python -m bench.engines.llama_build [--tokens 128] [--repeat 5] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from blendserve.engines.embedded import ensure_model
from blendserve.engines.llama_server import ggml_build

PROMPT = "Write a short story about a lighthouse keeper who counts ships. " * 6
SHOWN = ("GGML_NATIVE", "GGML_AVX2", "GGML_AVX512", "GGML_AVX_VNNI", "GGML_AMX_INT8")


def main() -> None:
    """Times prompt evaluation and generation; prints one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    from llama_cpp import Llama

    path = ensure_model("qwen2.5-coder-0.5b", Path(tempfile.gettempdir()) / "blendserve-models")
    llm = Llama(str(path), n_ctx=1024, n_threads=args.threads, verbose=False)
    prompt = llm.tokenize(PROMPT.encode())
    prefill, decode = [], []
    for _ in range(args.repeat):
        llm.reset()
        started = time.perf_counter()
        llm.eval(prompt)
        prefilled = time.perf_counter()
        token = llm.sample(temp=0.0)
        for _ in range(args.tokens):
            llm.eval([token])
            token = llm.sample(temp=0.0)
        done = time.perf_counter()
        prefill.append(len(prompt) / (prefilled - started))
        decode.append(args.tokens / (done - prefilled))
    build = ggml_build()
    print(
        json.dumps(
            {
                "build": {name.removeprefix("GGML_"): build.get(name) for name in SHOWN},
                "threads": args.threads,
                "prompt_tokens": len(prompt),
                "prefill_tokens_per_s": round(statistics.median(prefill), 1),
                "decode_tokens_per_s": round(statistics.median(decode), 1),
                "decode_min_max": [round(min(decode), 1), round(max(decode), 1)],
            }
        )
    )


if __name__ == "__main__":
    main()
