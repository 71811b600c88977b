"""Central inference's layout for the machine (``envs_per_worker=None``): one env worker
per core at most, in two splits when they split evenly (issue #45, item 3)."""

from __future__ import annotations

import pytest

from asyncrl.collectors.batched import arguments
from asyncrl.collectors.batched.arguments import BatchingConfig, auto_layout


@pytest.mark.parametrize(("envs", "cores", "layout"), [
    (8, 2, (4, 2)),   # the Atari benchmark's machine: 2 processes, 2 splits of 2 envs
    (8, 16, (1, 1)),  # a core per env: one process per env, as before
    (6, 4, (2, 2)),
    (7, 2, (4, 1)),   # the last worker's 3 envs do not split in two
    (9, 2, (5, 1)),
    (1, 1, (1, 1)),
])
def test_the_layout_puts_at_most_one_env_worker_on_each_core(envs, cores, layout) -> None:
    per_worker, splits = auto_layout(envs, cores)
    assert (per_worker, splits) == layout
    assert -(-envs // per_worker) <= max(cores, 1) or per_worker == 1
    assert per_worker % splits == 0 and (envs % per_worker) % splits == 0


def _check(**kwargs):
    return BatchingConfig.check(num_envs=8, max_batch_size=None, min_batch_size=None,
                                server_timeout=None, transition_chunk_size="auto", **kwargs)


def test_left_out_the_layout_follows_the_cores(monkeypatch) -> None:
    monkeypatch.setattr(arguments, "usable_cores", lambda: 2)
    config = _check(envs_per_worker=None, worker_num_splits=None)
    assert (config.envs_per_worker, config.splits) == (4, 2)
    # given, it is kept
    config = _check(envs_per_worker=1, worker_num_splits=None)
    assert (config.envs_per_worker, config.splits) == (1, 1)


def test_splits_without_envs_per_worker_are_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"worker_num_splits=2 .* give envs_per_worker"):
        _check(envs_per_worker=None, worker_num_splits=2)
