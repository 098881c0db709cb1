import sys

import pytest
from blendserve.errors import EngineUnavailable


def test_without_vllm_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from blendserve.engines.vllm_inprocess import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vLLM were not installed
    with pytest.raises(EngineUnavailable, match=r"pip install -e ./client -e '\.\[vllm\]'"):
        VLLMEngine({"model": "any"})
