"""Trainer-side batch shaping (asyncrl.collectors._assemble): joining shares, masked padding."""

from __future__ import annotations

import doctest

import pytest
import torch
from tensordict import TensorDict

import asyncrl.collectors._assemble
from asyncrl import CollectorError
from asyncrl.collectors._assemble import MASK_KEY, assemble


def share(envs: int, steps: int, value: float) -> TensorDict:
    return TensorDict({"x": torch.full((envs, steps, 2), value),
                       ("next", "reward"): torch.full((envs, steps, 1), value)}, [envs, steps])


def test_equal_shares_are_concatenated_without_a_mask() -> None:
    batch = assemble([share(2, 3, 1.0), share(2, 3, 2.0)], 0)
    assert batch.batch_size == torch.Size([4, 3])
    assert MASK_KEY not in batch.keys(include_nested=True)


@pytest.mark.parametrize(("cat_results", "size"), [(0, [4, 3]), (-2, [4, 3]), (1, [2, 6]),
                                                   ("stack", [2, 2, 3])])
def test_cat_results_picks_the_dim(cat_results: object, size: list[int]) -> None:
    batch = assemble([share(2, 3, 1.0), share(2, 3, 2.0)], cat_results)  # type: ignore[arg-type]
    assert batch.batch_size == torch.Size(size)


def test_a_short_share_is_zero_padded_and_masked() -> None:
    batch = assemble([share(2, 3, 1.0), share(2, 1, 2.0)], 0)
    mask = batch.get(MASK_KEY)
    assert mask.tolist() == [[True] * 3] * 2 + [[True, False, False]] * 2
    assert (batch.get("x")[2:, 1:] == 0).all() and (batch.get("x")[2:, 0] == 2.0).all()
    assert (batch.get(("next", "reward"))[:2] == 1.0).all()


def test_nothing_to_assemble_is_an_error() -> None:
    with pytest.raises(CollectorError, match="no share to assemble"):
        assemble([], 0)


def test_doctests() -> None:
    result = doctest.testmod(asyncrl.collectors._assemble)
    assert result.failed == 0 and result.attempted > 0
