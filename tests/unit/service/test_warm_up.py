"""The service compiles the allocation policy before it serves its first request."""

import subprocess
import sys
import textwrap
from pathlib import Path

DATA = Path(__file__).parents[2] / "fixtures" / "replay_small.jsonl"


def test_the_policy_kernels_are_ready_before_the_first_request() -> None:
    # A fresh process: in this one another test may have compiled them already.
    code = textwrap.dedent(
        f"""
        import sys
        from fastapi.testclient import TestClient
        from blendserve.core.policies import _blend_kernel as kernel
        from blendserve.service import Settings, create_app

        app = create_app(Settings(engine="replay", data={str(DATA)!r}))
        # numba loads with the first kernel, not with the service's modules (a vLLM
        # CPU worker re-imports them and trips on llvmlite's bindings).
        assert "numba" not in sys.modules
        with TestClient(app):
            kernels = (kernel.move_question, kernel.set_selectable, kernel.take_best)
            print(all(getattr(k, "signatures", None) for k in kernels))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "True"
