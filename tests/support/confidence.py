"""What a sample's confidence must look like once a real engine has read it."""

from __future__ import annotations

import math

from blendserve.core.signals import Confidence, ConfidenceSpec


def assert_read(
    confidence: Confidence | None, completion_tokens: int, spec: ConfidenceSpec
) -> None:
    """``confidence`` was read from every token of a sample of ``completion_tokens`` by
    ``spec``: a finite positive mean, one trajectory group a block (the last maybe short),
    the mean within the groups' range and no lower than the lowest window.

    The last holds for a sample of whole windows (its mean is that of disjoint windows, none
    below the lowest), which the tests' samples are; a sample cut mid-window may have a mean
    below its lowest full window.
    """
    assert confidence is not None
    assert completion_tokens % spec.window == 0, (completion_tokens, spec)
    assert math.isfinite(confidence.mean) and confidence.mean > 0, confidence
    assert confidence.tokens == completion_tokens, (confidence, completion_tokens)
    assert (confidence.window, confidence.block) == (spec.window, spec.block), confidence
    assert len(confidence.groups) == math.ceil(completion_tokens / spec.block), confidence
    low, high = min(confidence.groups), max(confidence.groups)
    assert low - 1e-9 <= confidence.mean <= high + 1e-9, confidence
    assert confidence.lowest_group <= confidence.mean + 1e-9, confidence
