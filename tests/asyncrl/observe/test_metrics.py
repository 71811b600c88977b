"""``asyncrl.metrics`` (Prometheus, read at scrape time) and ``asyncrl.Progress`` (tqdm).

Exact exposition lines from a known snapshot; a real collector's frame
counter and weight-sync histogram; and clear errors naming the extra when
prometheus-client or tqdm is missing.
"""

from __future__ import annotations

import importlib
import io
import sys

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from asyncrl import (
    CollectorStatistics,
    MultiAsyncCollector,
    Progress,
    WorkerStatistics,
)
from asyncrl.metrics import CollectorMetrics
from asyncrl.testing import CountingEnv, ParamPolicy

LIMIT = 120


class Snapshot:
    """A collector stand-in whose statistics() is fixed."""

    total_frames = 1000

    def __init__(self, stats: CollectorStatistics) -> None:
        self.stats = stats

    def statistics(self) -> CollectorStatistics:
        return self.stats


STATS = CollectorStatistics(
    frames=640, frames_per_second=123.5, batches=10, policy_version=3, policy_lag=1,
    episodes=4, episode_return_mean=21.5, workers=(
        WorkerStatistics(0, "w0", "h", 100, "collecting", frames=512, batches=8, ahead=1,
                         last_batch_age=0.5, heartbeat_age=0.25),
        WorkerStatistics(1, "w1", "h", 101, "lost", frames=128, batches=2, exit_code=-9,
                         last_batch_age=3.0),
    ))


def scrape(collector: object, **labels: str) -> list[str]:
    registry = CollectorRegistry()
    CollectorMetrics(collector, registry=registry, labels=labels or None)
    return generate_latest(registry).decode().splitlines()


def test_the_exposition_reads_the_snapshot() -> None:
    lines = scrape(Snapshot(STATS))
    for line in [
        "asyncrl_frames_total 640.0",
        "asyncrl_batches_total 10.0",
        "asyncrl_frames_per_second 123.5",
        "asyncrl_policy_version 3.0",
        "asyncrl_policy_lag 1.0",
        "asyncrl_episodes_total 4.0",
        "asyncrl_episode_return_mean 21.5",
        "asyncrl_paused 0.0",
        'asyncrl_workers{state="collecting"} 1.0',
        'asyncrl_workers{state="lost"} 1.0',
        'asyncrl_workers{state="joining"} 0.0',
        'asyncrl_worker_state{host="h",state="lost",worker="1"} 1.0',
        'asyncrl_worker_state{host="h",state="idle",worker="1"} 0.0',
        'asyncrl_worker_frames_total{host="h",worker="0"} 512.0',
        'asyncrl_worker_batches_total{host="h",worker="1"} 2.0',
        'asyncrl_worker_ahead{host="h",worker="0"} 1.0',
        'asyncrl_worker_last_batch_age_seconds{host="h",worker="1"} 3.0',
        'asyncrl_worker_heartbeat_age_seconds{host="h",worker="0"} 0.25',
        'asyncrl_worker_exit_code{host="h",worker="1"} -9.0',
    ]:
        assert line in lines, line
    assert 'asyncrl_worker_pid{host="h",worker="0"} 100.0' in lines
    # Only live workers have a heartbeat age, only lost ones an exit code.
    assert not any(line.startswith("asyncrl_worker_heartbeat_age_seconds{") and 'worker="1"'
                   in line for line in lines)
    assert not any(line.startswith("asyncrl_worker_exit_code{") and 'worker="0"' in line
                   for line in lines)


def test_a_restarted_slot_keeps_one_series_for_its_newest_process() -> None:
    restarted = CollectorStatistics(workers=(
        WorkerStatistics(0, "w0", "h", 100, "lost", frames=64, exit_code=-9),
        WorkerStatistics(1, "w1", "h", 101, "collecting", frames=32),
        WorkerStatistics(0, "w0", "h", 102, "collecting", frames=16),
        WorkerStatistics(1, "w1", "h", 103, "joining"),  # admission order: the later one wins
    ))
    lines = scrape(Snapshot(restarted))
    pids = sorted(line for line in lines if line.startswith("asyncrl_worker_pid{"))
    assert pids == ['asyncrl_worker_pid{host="h",worker="0"} 102.0',
                    'asyncrl_worker_pid{host="h",worker="1"} 103.0']
    assert 'asyncrl_worker_frames_total{host="h",worker="0"} 16.0' in lines
    assert not any(line.startswith("asyncrl_worker_exit_code{") for line in lines)


def test_served_refusals_are_a_counter_per_reason() -> None:
    refused = CollectorStatistics(served_refusals={"busy": 3, "malformed": 1})
    lines = scrape(Snapshot(refused), run="a")
    assert sorted(line for line in lines if line.startswith("asyncrl_served_refusals")) == [
        'asyncrl_served_refusals_total{reason="busy",run="a"} 3.0',
        'asyncrl_served_refusals_total{reason="malformed",run="a"} 1.0',
        'asyncrl_served_refusals_total{reason="not admitted",run="a"} 0.0',
        'asyncrl_served_refusals_total{reason="unknown module",run="a"} 0.0',
    ]
    assert "# TYPE asyncrl_served_refusals_total counter" in lines


def test_labels_tell_collectors_apart_and_unregister_stops_export() -> None:
    registry = CollectorRegistry()
    metrics = CollectorMetrics(Snapshot(STATS), registry=registry, labels={"run": "a"})
    assert 'asyncrl_frames_total{run="a"} 640.0' in generate_latest(registry).decode()
    metrics.unregister()
    metrics.unregister()  # idempotent
    assert "asyncrl_frames_total" not in generate_latest(registry).decode()


@pytest.mark.anyio
async def test_a_running_collector_exports_frames_and_weight_sync_latency() -> None:
    registry = CollectorRegistry()
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(CountingEnv, ParamPolicy(), num_workers=1,
                                       frames_per_batch=8, total_frames=-1) as c:
            CollectorMetrics(c, registry=registry)
            await c.__anext__()
            await c.update_policy_weights()
            await c.update_policy_weights()
            await c.__anext__()
            text = generate_latest(registry).decode().splitlines()
    assert f"asyncrl_frames_total {c.frames_collected:.1f}" in text
    assert 'asyncrl_weight_sync_seconds_count{model_id="policy"} 2.0' in text
    assert 'asyncrl_weight_sync_seconds_bucket{le="+Inf",model_id="policy"} 2.0' in text
    assert 'asyncrl_policy_version 2.0' in text


def _without(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError


def test_metrics_without_prometheus_client_names_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _without("prometheus_client", monkeypatch)
    for name in ("prometheus_client.core", "prometheus_client.registry"):
        _without(name, monkeypatch)
    monkeypatch.delitem(sys.modules, "asyncrl.metrics")
    with pytest.raises(ImportError, match=r'pip install "asyncrl\[metrics\]"'):
        importlib.import_module("asyncrl.metrics")
    monkeypatch.undo()
    importlib.import_module("asyncrl.metrics")


def test_progress_shows_frames_rate_return_and_lag() -> None:
    out = io.StringIO()
    with Progress(Snapshot(STATS), file=out, mininterval=0) as progress:
        progress.update(loss="0.5")
        assert progress.bar.n == 640 and progress.bar.total == 1000
    text = out.getvalue()
    for part in ("640/1.00k", "fps=124", "ret=21.5", "lag=1", "v=3", "workers=1/2",
                 "loss=0.5"):
        assert part in text, (part, text)


def test_progress_without_tqdm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _without("tqdm", monkeypatch)
    _without("tqdm.auto", monkeypatch)
    with pytest.raises(ImportError, match=r'pip install "asyncrl\[progress\]"'):
        Progress(Snapshot(STATS))


# -- the collector's state as a whole (issue #26) ----------------------------------------
def test_the_collector_state_is_one_gauge_per_state() -> None:
    from dataclasses import replace

    lines = scrape(Snapshot(replace(STATS, state="failed")))
    assert 'asyncrl_collector_state{state="failed"} 1.0' in lines
    for other in ("starting", "running", "waiting", "paused", "closed"):
        assert f'asyncrl_collector_state{{state="{other}"}} 0.0' in lines
    assert 'asyncrl_collector_state{state="running"} 1.0' in scrape(Snapshot(STATS))


@pytest.mark.anyio
async def test_the_state_goes_starting_waiting_running_paused_closed() -> None:
    import subprocess

    from tests.multihost.processes import wait_exit

    collector = MultiAsyncCollector(CountingEnv, ParamPolicy(), num_workers=1,
                                    remote_workers=1, listen="tcp://127.0.0.1:0",
                                    frames_per_batch=16, total_frames=-1)
    assert collector.statistics().state == "starting"
    with anyio.fail_after(LIMIT):
        async with collector:
            # One local worker may join; the remote one does not come: the run waits.
            with pytest.raises(TimeoutError):
                await collector.wait_ready(timeout=1)
            assert collector.statistics().state == "waiting"
            assert 'asyncrl_collector_state{state="waiting"} 1.0' in scrape(collector)
            host = subprocess.Popen(
                [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", collector.endpoint,
                 "--env", "asyncrl.testing:CountingEnv", "--policy", "asyncrl.testing:ParamPolicy"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)
            try:
                await collector.wait_ready(timeout=60)
                assert collector.statistics().state == "running"
                async with collector.pause():
                    assert collector.statistics().state == "paused"
                assert collector.statistics().state == "running"
            except BaseException:
                host.kill()
                raise
        assert collector.statistics().state == "closed"
        code = await wait_exit(host)
        assert code == 0, host.stdout.read() if host.stdout else ""


@pytest.mark.anyio
async def test_a_failed_run_says_failed_and_stays_so_once_closed() -> None:
    from asyncrl.testing import failing_env_at_step

    with anyio.fail_after(LIMIT):
        collector = MultiAsyncCollector(failing_env_at_step, num_workers=1,
                                        frames_per_batch=16, total_frames=-1)
        with pytest.raises(Exception, match="step"):
            async with collector:
                async for _ in collector:
                    pass
    assert collector.statistics().state == "failed"
    assert 'asyncrl_collector_state{state="failed"} 1.0' in scrape(collector)


class Remote(Snapshot):
    """A collector stand-in with 1 local slot and 2 remote places."""

    num_workers = 1
    remote_workers = 2


def test_gone_remote_workers_leave_the_series_and_counts_clear_once_replaced() -> None:
    lines = (WorkerStatistics(0, "w0", "h", 100, "collecting"),
             WorkerStatistics(1, "r1", "pod-a", 201, "lost"),
             WorkerStatistics(2, "r2", "pod-b", 202, "left"),
             WorkerStatistics(3, "r3", "pod-c", 203, "idle"))  # took one of the places
    collector = Remote(CollectorStatistics(workers=lines))
    registry = CollectorRegistry()
    CollectorMetrics(collector, registry=registry)
    text = generate_latest(registry).decode().splitlines()
    assert "asyncrl_workers_expected 3.0" in text
    # One place is empty: lost before left; the other gone worker's place was taken.
    assert 'asyncrl_workers{state="lost"} 1.0' in text
    assert 'asyncrl_workers{state="left"} 0.0' in text
    assert "asyncrl_workers_lost_total 1.0" in text and "asyncrl_workers_left_total 1.0" in text
    pids = sorted(line for line in text if line.startswith("asyncrl_worker_pid{"))
    assert pids == ['asyncrl_worker_pid{host="h",worker="0"} 100.0',
                    'asyncrl_worker_pid{host="pod-c",worker="3"} 203.0']
    # Another replacement joins: nothing is lost now, the totals stay (counted once).
    collector.stats = CollectorStatistics(workers=(*lines, WorkerStatistics(
        4, "r4", "pod-d", 204, "collecting")))
    text = generate_latest(registry).decode().splitlines()
    assert 'asyncrl_workers{state="lost"} 0.0' in text
    assert "asyncrl_workers_lost_total 1.0" in text
    # The registry forgot the old lines (bounded) and a new loss came: the total grows by one.
    collector.stats = CollectorStatistics(workers=(
        lines[0], WorkerStatistics(3, "r3", "pod-c", 203, "lost"),
        WorkerStatistics(4, "r4", "pod-d", 204, "collecting")))
    text = generate_latest(registry).decode().splitlines()
    assert "asyncrl_workers_lost_total 2.0" in text
    assert 'asyncrl_workers{state="lost"} 1.0' in text
