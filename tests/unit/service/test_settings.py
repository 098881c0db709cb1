import pytest
from blendserve.service import Settings
from pydantic import ValidationError


@pytest.mark.parametrize("policy", ["blend", "asc:cap=16", "esc:window=3"])
def test_a_servable_default_policy_is_taken(policy: str) -> None:
    assert Settings(sc_policy=policy).sc_policy == policy


@pytest.mark.parametrize("policy", ["esc:window=0", "asc:cap=nan", "oracle", "fancy"])
def test_a_default_policy_no_job_could_run_is_refused_at_start(policy: str) -> None:
    with pytest.raises(ValidationError, match="sc_policy"):
        Settings(sc_policy=policy)
