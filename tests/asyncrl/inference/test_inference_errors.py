"""Central inference's own errors stand in asyncrl's tree, and keep their old base."""

from __future__ import annotations

import pytest

from asyncrl import AsyncRLError, BadBatchError, CollectorError
from asyncrl._inference.chunk_ring import TornChunkError
from asyncrl._inference.graphed_batch import CaptureError


@pytest.mark.parametrize(("error", "family"), [(TornChunkError, BadBatchError),
                                               (CaptureError, CollectorError)])
def test_central_inference_errors_are_asyncrl_errors_and_still_runtime_errors(
        error: type[Exception], family: type[Exception]) -> None:
    assert issubclass(error, family) and issubclass(error, AsyncRLError)
    assert issubclass(error, RuntimeError)  # what callers caught before
