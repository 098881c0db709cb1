"""The installed llama.cpp runs on any x86-64 host with AVX2, not only on the CPU that built it.

A build tuned to its machine (llama.cpp's default, ``GGML_NATIVE=ON``) takes
every instruction that machine advertises, AMX and AVX-512 included, and dies
by ``SIGILL`` on a VM that advertises them without enabling them.
"""

import platform
from pathlib import Path

import pytest
from blendserve.engines.llama_server import REBUILD_HINT, ggml_build

from tests.support.tools import missing

#: Instructions past x86-64 with AVX2 that a portable build must leave to run-time checks.
HOST_ONLY = ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
             "GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")  # fmt: skip


@pytest.fixture(scope="module")
def build() -> dict[str, str]:
    options = ggml_build()
    if not options:
        missing(
            "llama-cpp-python is not installed with its build information: "
            "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install -c constraints.txt -e ./client "
            "-e '.[embedded]' (the README's first command)"
        )
    return options


def test_llama_cpp_was_not_tuned_to_the_machine_that_built_it(build: dict[str, str]) -> None:
    assert build["GGML_NATIVE"] == "OFF", REBUILD_HINT


def test_it_uses_nothing_a_vm_may_refuse_and_avx2_on_x86(build: dict[str, str]) -> None:
    assert {name: build.get(name, "OFF") for name in HOST_ONLY} == dict.fromkeys(HOST_ONLY, "OFF")
    x86 = platform.machine() in ("x86_64", "AMD64")
    wanted = "ON" if x86 else "OFF"  # the x86 options are off on other machines
    assert build["GGML_AVX2"] == build["GGML_FMA"] == build["GGML_F16C"] == wanted


def test_a_tuned_build_is_recognised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "ggml-config.cmake"
    config.write_text('set(GGML_NATIVE "ON")\nset(GGML_AVX2 "OFF")\n', encoding="utf-8")

    class File:
        name = config.name

        def locate(self) -> Path:
            return config

    monkeypatch.setattr("importlib.metadata.files", lambda _: [File()])
    assert ggml_build() == {"GGML_NATIVE": "ON", "GGML_AVX2": "OFF"}
