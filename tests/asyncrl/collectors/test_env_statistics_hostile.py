"""Statistics from workers are hostile: ``sync_env_statistics()`` and ``load_state_dict()``
against a worker that answers NaN, negative variance, absurd counts or the wrong shape,
and against a worker that fails while the others are written (issue 43, attack 3).

A fake coordinator stands for the workers: it answers each ``state_dict`` control with
the env state the test gives that worker and records each ``load_state_dict`` it is
sent, so the test sees exactly what was merged and what was written where.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from gymnasium.wrappers import NormalizeObservation

from asyncrl import CollectorError, MultiSyncCollector
from asyncrl._coordinator.records import WorkerInfo
from asyncrl._coordinator.registry import WorkerRegistry
from asyncrl.collectors.multi.env_state import WorkerEnvState
from transports import PeerLostError, RemoteError

from .test_env_state_collectors import OffsetEnv

pytestmark = pytest.mark.anyio

KEY = ("env0", "0.NormalizeObservation")
SHARE = 8  # frames per worker per batch
FRAMES = 64  # frames each worker delivered


def _stats(mean: Any, var: Any, count: Any) -> dict[str, Any]:
    return {"mean": mean, "var": var, "count": count}


def _state(stats: dict[str, Any]) -> dict[str, Any]:
    return {KEY[0]: {KEY[1]: {"obs_rms": stats}}}


HONEST = [_stats(np.array([1.0, 2.0]), np.array([1.0, 4.0]), 20.0),
          _stats(np.array([3.0, 0.0]), np.array([2.0, 1.0]), 30.0),
          _stats(np.array([5.0, 2.0]), np.array([1.0, 1.0]), 50.0)]


class FakeWorkers:
    """The coordinator ``WorkerEnvState`` talks to, with three workers."""

    def __init__(self, states: list[Any], *, fail_load: dict[int, Exception] | None = None,
                 frames: int = FRAMES) -> None:
        self.states = states
        self.fail_load = fail_load or {}
        live = [WorkerInfo(index=i, peer=b"w%d" % i, name=f"worker-{i}", host="h", pid=100 + i)
                for i in range(len(states))]
        self.outbox = SimpleNamespace(catch_up_hooks=[])
        self.registry = WorkerRegistry()
        self.roster = SimpleNamespace(live_workers=live)
        for worker in live:
            self.registry.joined(worker)
            self.registry.delivered(worker, frames)
        self.config = SimpleNamespace(share_of=lambda index: SHARE)
        self.loaded: dict[int, dict[str, Any]] = {}

    async def control(self, worker: WorkerInfo, op: str, **args: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        if op == "state_dict":
            return {"env_state_dict": self.states[worker.index]}
        assert op == "load_state_dict"
        if worker.index in self.fail_load:
            raise self.fail_load[worker.index]
        self.loaded[worker.index] = args
        return None

    def obs_written(self, index: int) -> dict[str, Any]:
        return self.loaded[index]["env_state_dict"][KEY[0]][KEY[1]]["obs_rms"]  # type: ignore


def _chan(parts: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, float]:
    count = sum(p["count"] for p in parts)
    mean = sum(p["mean"] * p["count"] for p in parts) / count
    second = sum((p["var"] + p["mean"] ** 2) * p["count"] for p in parts) / count
    return mean, second - mean ** 2, count


HOSTILE = {
    "a NaN mean": (_stats(np.array([np.nan, 0.0]), np.ones(2), 10.0), "mean.*not finite"),
    "an infinite variance": (_stats(np.zeros(2), np.array([1.0, np.inf]), 10.0),
                             "var.*not finite"),
    "a negative variance": (_stats(np.zeros(2), np.array([1.0, -0.5]), 10.0),
                            r"var.*negative"),
    "a negative count": (_stats(np.zeros(2), np.ones(2), -5.0), r"count -5.0.*>= 0"),
    "a NaN count": (_stats(np.zeros(2), np.ones(2), float("nan")), r"count nan"),
    "an infinite count": (_stats(np.zeros(2), np.ones(2), float("inf")), r"count inf"),
    "a count no collection explains": (
        _stats(np.zeros(2), np.ones(2), 1e12),
        r"count 1e\+12 is more than the 0 it was known to hold plus 4 x \(64 frames "
        r"delivered \+ 0 owed \+ one share of 8\) = 288 observations"),
    "another shape": (_stats(np.zeros(3), np.ones(3), 10.0), r"shape \(3,\).*\(2,\)"),
    "strings": (_stats(np.array(["a", "b"]), np.ones(2), 10.0), r"mean.*numbers.*<U1"),
    "a string count": (_stats(np.zeros(2), np.ones(2), "10"), r"count '10'"),
    "a bool count": (_stats(np.zeros(2), np.ones(2), True), r"count True"),
    "a mean of another shape than its var": (_stats(np.zeros(2), np.ones((2, 1)), 10.0),
                                             r"shape \(2, 1\)"),
    "not statistics at all": ({"mean": np.zeros(2)}, r"mean, var, count"),
    "a mean so large the merge overflows": (
        _stats(np.array([1e200, 0.0]), np.ones(2), 10.0), r"overflow"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_one_workers_hostile_statistics_are_refused_for_it_and_the_others_merge(
        case: str, caplog: pytest.LogCaptureFixture) -> None:
    bad, reason = HOSTILE[case]
    workers = FakeWorkers([_state(HONEST[0]), _state(bad), _state(HONEST[2])])
    with anyio.fail_after(10), caplog.at_level(logging.WARNING, "asyncrl.collectors"):
        merged = await WorkerEnvState().sync(workers)  # type: ignore[arg-type]
    mean, var, count = _chan([HONEST[0], HONEST[2]])
    np.testing.assert_allclose(merged["mean"], mean, rtol=1e-12)
    np.testing.assert_allclose(merged["var"], var, rtol=1e-12)
    assert merged["count"] == count
    assert sorted(workers.loaded) == [0, 2]  # not written back to the hostile worker
    for index in (0, 2):
        np.testing.assert_array_equal(workers.obs_written(index)["mean"], merged["mean"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "sync_env_statistics(): refused worker 1's statistics (not merged, not written " \
           "back): env0 0.NormalizeObservation.obs_rms" in warnings[0]
    assert __import__("re").search(reason, warnings[0]), warnings[0]


async def test_every_refused_worker_is_named_in_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    nan = _stats(np.array([np.nan, 0.0]), np.ones(2), 10.0)
    workers = FakeWorkers([_state(nan), _state(HONEST[1]), _state(nan)])
    with anyio.fail_after(10), caplog.at_level(logging.WARNING, "asyncrl.collectors"):
        merged = await WorkerEnvState().sync(workers)  # type: ignore[arg-type]
    assert merged["count"] == HONEST[1]["count"]
    assert sorted(workers.loaded) == [1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "refused worker 0's statistics" in warnings[0]
    assert "; worker 2's" in warnings[0]


async def test_when_every_worker_is_refused_nothing_is_written() -> None:
    nan = _stats(np.array([np.nan, 0.0]), np.ones(2), 10.0)
    workers = FakeWorkers([_state(nan), _state(nan)])
    with anyio.fail_after(10), pytest.raises(
            CollectorError, match=r"every worker's statistics were refused.*worker 0.*"
                                  r"not finite.*worker 1"):
        await WorkerEnvState().sync(workers)  # type: ignore[arg-type]
    assert workers.loaded == {}


async def test_counts_grow_only_as_far_as_the_frames_collected_since_the_last_merge() -> None:
    """After a merge, a worker's count is judged from the merged count it was given."""
    workers = FakeWorkers([_state(HONEST[0]), _state(HONEST[1])])
    keeper = WorkerEnvState()
    with anyio.fail_after(10):
        first = await keeper.sync(workers)  # type: ignore[arg-type]
        grown = dict(first, count=first["count"] + 200.0)  # within 4 x (64 + 8)
        workers.states = [_state(grown), _state(dict(first, count=first["count"] + 300.0))]
        second = await keeper.sync(workers)  # type: ignore[arg-type]
    assert second["count"] == first["count"] + 200.0  # worker 1's 300 are more than 288
    assert sorted(workers.loaded) == [0, 1]  # (worker 1 was written by the first merge)


async def test_a_worker_that_fails_during_the_write_is_named_with_what_each_holds() -> None:
    lost = PeerLostError([b"w1"], "before it acknowledged the load")
    workers = FakeWorkers([_state(s) for s in HONEST], fail_load={1: lost})
    keeper = WorkerEnvState()
    with anyio.fail_after(10), pytest.raises(CollectorError) as caught:
        await keeper.sync(workers)  # type: ignore[arg-type]
    text = str(caught.value)
    assert "sync_env_statistics(): workers [0, 2] hold the merged statistics; worker 1 " \
           "does not (it keeps its own): PeerLostError: peer(s)" in text
    assert sorted(workers.loaded) == [0, 2]  # every other worker was written all the same
    mean, _, count = _chan(HONEST)
    np.testing.assert_allclose(workers.obs_written(2)["mean"], mean, rtol=1e-12)
    # the next merge counts worker 1's statistics once, the others' from the merge
    workers.fail_load = {}
    merged = [workers.obs_written(0), HONEST[1], workers.obs_written(2)]
    workers.states = [_state(s) for s in merged]
    with anyio.fail_after(10):
        again = await keeper.sync(workers)  # type: ignore[arg-type]
    assert again["count"] == pytest.approx(count, rel=1e-12)
    np.testing.assert_allclose(again["mean"], mean, rtol=1e-12)


async def test_load_state_dict_checks_every_worker_before_writing_any() -> None:
    workers = FakeWorkers([_state(s) for s in HONEST])
    full = {f"worker{i}": {"env_state_dict": _state(s)} for i, s in enumerate(HONEST)}
    with anyio.fail_after(10):
        with pytest.raises(KeyError, match=r"no 'worker2' in the state dict"):
            await WorkerEnvState().load_state_dict(  # type: ignore[arg-type]
                workers, {k: v for k, v in full.items() if k != "worker2"})
        assert workers.loaded == {}
        nan = dict(full, worker2={"env_state_dict": _state(
            _stats(np.array([np.nan, 0.0]), np.ones(2), 10.0))})
        with pytest.raises(CollectorError, match=r"load_state_dict: worker2's env0 "
                                                 r"0.NormalizeObservation.obs_rms.*not finite"):
            await WorkerEnvState().load_state_dict(workers, nan)  # type: ignore[arg-type]
        assert workers.loaded == {}
        with pytest.raises(TypeError, match=r"'worker1' is a dict.*got list"):
            await WorkerEnvState().load_state_dict(  # type: ignore[arg-type]
                workers, dict(full, worker1=[]))
        assert workers.loaded == {}


async def test_load_state_dict_names_the_workers_written_when_one_fails() -> None:
    refused = RemoteError("env0 has no wrapper '0.TimeLimit'", peer=b"w0",
                          remote_type="builtins.ValueError")
    workers = FakeWorkers([_state(s) for s in HONEST], fail_load={0: refused})
    full = {f"worker{i}": {"env_state_dict": _state(s)} for i, s in enumerate(HONEST)}
    with anyio.fail_after(10), pytest.raises(CollectorError) as caught:
        await WorkerEnvState().load_state_dict(workers, full)  # type: ignore[arg-type]
    assert "load_state_dict: workers [1, 2] hold the state dict's state; worker 0 does " \
           "not (it keeps its own): builtins.ValueError" in str(caught.value)
    assert "env0 has no wrapper '0.TimeLimit'" in str(caught.value)
    assert sorted(workers.loaded) == [1, 2]


class NanOnceEnv(OffsetEnv):
    """:class:`OffsetEnv` whose observation at step ``nan_at`` of its first episode is NaN."""

    def __init__(self, offset: float = 0.0, nan_at: int | None = None) -> None:
        super().__init__(offset)
        self.nan_at = nan_at

    def _obs(self) -> np.ndarray:
        obs = super()._obs()
        if self.t == self.nan_at:
            self.nan_at = None
            obs = np.array([np.nan, 0.0], dtype=np.float32)
        return obs


def normalized_nan_once(offset: float = 0.0, nan_at: int | None = None) -> Any:
    return NormalizeObservation(NanOnceEnv(offset, nan_at))


async def test_one_nan_observation_in_one_worker_reaches_no_other_worker(
        caplog: pytest.LogCaptureFixture) -> None:
    """The attack as found: one NaN observation under NormalizeObservation, then a merge."""
    with anyio.fail_after(120), caplog.at_level(logging.WARNING, "asyncrl.collectors"):
        async with MultiSyncCollector(
                normalized_nan_once, num_workers=2, frames_per_batch=8, total_frames=16,
                create_env_kwargs=[{"offset": 0.0}, {"offset": 10.0, "nan_at": 2}]) as c:
            async for _ in c:
                pass
            before = await c.getattr_env("obs_rms", worker_ids=[0, 1])
            merged = await c.sync_env_statistics()
            after = await c.getattr_env("obs_rms", worker_ids=[0, 1])
    assert np.isnan(before[1]["mean"][0]) and np.isfinite(before[0]["mean"]).all()
    np.testing.assert_allclose(merged["mean"], before[0]["mean"], rtol=1e-6)  # worker 0 alone
    np.testing.assert_allclose(after[0]["mean"], before[0]["mean"], rtol=1e-6)
    assert np.isnan(after[1]["mean"][0])  # not written back: it keeps its own
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warnings if "sync_env_statistics()" in w] == [
        "sync_env_statistics(): refused worker 1's statistics (not merged, not written back): "
        "env0 0.NormalizeObservation.obs_rms: mean is not finite (1 NaN or infinite entries "
        "of 2)"]
