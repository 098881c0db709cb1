"""Writes the embedded model as a Hugging Face checkpoint that vLLM can serve.

The GGUF file blendserve assembles from its registry packages (Qwen2.5-Coder-0.5B-Instruct,
Q4_K_M) is loaded by transformers (``gguf_file=``, dequantized) and saved with its
tokenizer, so no model hub is needed. Usage: ``python vllm-model.py GGUF OUT_DIR``; a
finished ``OUT_DIR`` (its ``config.json`` written last) is left as it is.
"""

import shutil
import sys
from pathlib import Path


def main(gguf: Path, out: Path) -> None:
    if (out / "config.json").exists():
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    options = {}
    try:  # newer transformers keep GGUF blocks packed unless asked to dequantize
        from transformers import GgufConfig

        options["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype="bfloat16", **options
    )
    # Dense weights now: saved as a plain checkpoint, not as a quantized one.
    model.hf_quantizer = None
    vars(model.config).pop("quantization_config", None)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    # config.json marks a finished checkpoint: moved in last.
    config = partial / "config.json"
    config.rename(partial / "config.json.partial")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    (out / "config.json.partial").rename(out / "config.json")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
