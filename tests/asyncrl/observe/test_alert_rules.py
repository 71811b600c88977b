"""deploy/k8s/monitoring: the PrometheusRule's alerts, evaluated against a live collector.

No promtool or Prometheus here: ``promql.py`` (beside this file) evaluates the
subset of PromQL the rules use, and fails on anything else. The alerts must fire
for the fault they name and clear once it is gone: a worker SIGKILLed fires
``AsyncrlWorkersLost`` and ``AsyncrlWorkersBelowExpected``, its replacement clears
them, and ``asyncrl_workers_lost_total`` keeps the count.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from asyncrl import MultiAsyncCollector
from asyncrl.metrics import CollectorMetrics, worker_counts
from asyncrl.testing import CountingEnv, ParamPolicy

from .promql import Query, Scrape, duration, parse_scrape

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "deploy" / "k8s" / "monitoring"
LIMIT = 120


def alerts() -> dict[str, dict[str, Any]]:
    rule = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def firing(history: list[Scrape]) -> set[str]:
    """The alerts whose expression has a result at the last scrape (``for`` aside)."""
    return {name for name, rule in alerts().items() if Query(rule["expr"])(history)}


def test_every_rule_parses_and_says_what_and_how_bad() -> None:
    rules = alerts()
    assert {"AsyncrlNoWorkers", "AsyncrlWorkersBelowExpected", "AsyncrlWorkersLost",
            "AsyncrlRunFailed", "AsyncrlBatchesStalled", "AsyncrlWeightsNotAcked",
            "AsyncrlTrainerDown"} <= set(rules)
    for name, rule in rules.items():
        Query(rule["expr"])  # SyntaxError for anything the evaluator does not know
        duration(rule["for"])
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_the_evaluator_refuses_what_it_does_not_know() -> None:
    with pytest.raises(SyntaxError, match="got 'without'"):
        Query("sum without (job) (up)")
    with pytest.raises(SyntaxError, match="unexpected 'offset'"):
        Query("up offset 5m")
    with pytest.raises(SyntaxError, match="unexpected '5x"):
        Query("increase(up[5x])")


def test_the_service_monitor_selects_the_trainer_service_and_its_port() -> None:
    monitor = yaml.safe_load((MONITORING / "service-monitor.yaml").read_text())
    assert monitor["kind"] == "ServiceMonitor"
    services = [d for d in yaml.safe_load_all((ROOT / "deploy/k8s/trainer.yaml").read_text())
                if d and d["kind"] == "Service"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    [service] = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]
    assert "http" in ports
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == ["prometheus-rule.yaml", "service-monitor.yaml"]


def test_stalled_and_unacknowledged_alerts_on_fixed_scrapes() -> None:
    def scrape(batches: int, paused: int, sent: int, acked: int) -> str:
        return (f"asyncrl_batches_total {batches}\nasyncrl_paused {paused}\n"
                f'asyncrl_weights_version{{model_id="policy"}} {sent}\n'
                f'asyncrl_weights_acked_version{{model_id="policy"}} {acked}\n')
    stalled = [parse_scrape(scrape(5, 0, 3, 3), 0), parse_scrape(scrape(5, 0, 3, 3), 600)]
    assert firing(stalled) == {"AsyncrlBatchesStalled"}
    paused = [parse_scrape(scrape(5, 1, 3, 3), 0), parse_scrape(scrape(5, 1, 3, 3), 600)]
    assert firing(paused) == set()
    behind = [parse_scrape(scrape(5, 0, 4, 2), 0), parse_scrape(scrape(9, 0, 4, 2), 600)]
    assert firing(behind) == {"AsyncrlWeightsNotAcked"}
    assert Query(alerts()["AsyncrlWeightsNotAcked"]["expr"])(behind) == {
        frozenset({("model_id", "policy")}): 2.0}
    down = [parse_scrape('up{job="asyncrl-trainer",pod="t"} 0\n')]
    assert firing(down) == {"AsyncrlTrainerDown"}


def _scrape(registry: CollectorRegistry, at: float) -> Scrape:
    return parse_scrape(generate_latest(registry).decode(), at)


async def _until(collector: MultiAsyncCollector, ok: Any) -> None:
    while not ok(collector.statistics()):
        await anyio.sleep(0.02)


def _live(stats: Any) -> int:
    return sum(1 for w in stats.workers if w.state in ("collecting", "idle"))


def _lost(stats: Any) -> int:
    return worker_counts(stats.workers, 2, 2)["lost"]


@pytest.mark.anyio
async def test_a_killed_worker_fires_the_loss_alerts_and_its_replacement_clears_them(
        anyio_backend: str) -> None:
    registry = CollectorRegistry()
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(CountingEnv, ParamPolicy(), num_workers=2,
                                       frames_per_batch=8, total_frames=-1,
                                       on_worker_loss="restart") as c:
            CollectorMetrics(c, registry=registry)
            async with anyio.create_task_group() as tg:
                async def consume() -> None:
                    async for _ in c:
                        await anyio.sleep(0.01)
                tg.start_soon(consume)
                await _until(c, lambda s: _live(s) == 2 and s.batches > 0)
                await c.update_policy_weights()
                healthy = _scrape(registry, 0)
                assert firing([healthy]) == set()
                killed = c.worker_pids[0]
                os.kill(killed, signal.SIGKILL)
                await _until(c, lambda s: _lost(s) == 1)
                broken = _scrape(registry, 60)
                await _until(c, lambda s: _live(s) == 2 and _lost(s) == 0)
                await _until(c, lambda s: s.batches > 2)
                await c.update_policy_weights()  # acked by the replacement too
                mended = _scrape(registry, 120)
                tg.cancel_scope.cancel()
    assert {"AsyncrlWorkersLost", "AsyncrlWorkersBelowExpected"} <= firing([healthy, broken])
    assert firing([healthy, broken, mended]) == set()
    samples = mended[1]
    assert samples[("asyncrl_workers_lost_total", frozenset())] == 1.0
    assert samples[("asyncrl_workers", frozenset({("state", "lost")}))] == 0.0
    assert samples[("asyncrl_workers_expected", frozenset())] == 2.0
    pids = {v for (name, _), v in samples.items() if name == "asyncrl_worker_pid"}
    assert len(pids) == 2 and killed not in pids  # the killed process's series are gone
