"""``copy_into``: exactly ``copy_``'s result on every path it takes (weights use it per layer)."""

from __future__ import annotations

import pytest
import torch

from transports._shm import PARALLEL_COPY_GRAIN, copy_into


@pytest.mark.parametrize("numel", [1, 64 * 64, PARALLEL_COPY_GRAIN - 1, PARALLEL_COPY_GRAIN,
                                   4 * PARALLEL_COPY_GRAIN])
def test_a_contiguous_copy_of_any_size_gives_the_source_values(numel: int) -> None:
    source = torch.arange(numel, dtype=torch.float32)
    destination = torch.full((numel,), -1.0)
    copy_into(destination, source)
    assert torch.equal(destination, source)
    assert destination.data_ptr() != source.data_ptr()  # a copy, not a view


@pytest.mark.parametrize("numel", [64, 4 * PARALLEL_COPY_GRAIN])
def test_a_parameter_is_written_in_place_and_stays_a_leaf_that_wants_gradients(
        numel: int) -> None:
    parameter = torch.nn.Parameter(torch.zeros(numel))
    before = parameter.data_ptr()
    copy_into(parameter, torch.ones(numel))
    assert parameter.data_ptr() == before and bool((parameter == 1).all())
    assert parameter.requires_grad and parameter.is_leaf and parameter.grad_fn is None


def test_other_dtypes_and_layouts_are_converted_as_copy_does() -> None:
    destination = torch.zeros(3, 4)
    copy_into(destination, torch.arange(12, dtype=torch.int64).reshape(4, 3).t())
    assert torch.equal(destination, torch.arange(12.0).reshape(4, 3).t())
