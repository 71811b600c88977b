"""Prometheus metrics of a collector, read from ``statistics()`` at scrape time.

Needs the ``metrics`` extra (``pip install "asyncrl[metrics]"``, which installs
``prometheus-client``). :class:`CollectorMetrics` is a custom Prometheus
collector: nothing is counted twice and nothing runs between scrapes; each
scrape reads one :class:`~asyncrl.CollectorStatistics` snapshot and the weight
senders' latency histograms.

Totals: ``asyncrl_frames_total``, ``asyncrl_batches_total``, ``asyncrl_episodes_total``
(counters); ``asyncrl_frames_per_second``, ``asyncrl_policy_version``,
``asyncrl_policy_lag``, ``asyncrl_episode_return_mean`` (once an episode ended),
``asyncrl_paused``, ``asyncrl_collector_state{state}`` (1 for the collector's
state: starting, running, waiting, paused, failed, closed; 0 for the others) and
``asyncrl_workers{state}`` (gauges).

Per worker slot (labels ``worker``, the slot's index, and ``host``): one series per
slot however often its process was restarted, for the newest worker in the slot
(a lost one stays until a replacement takes the slot); ``asyncrl_worker_pid``
(gauge) names its current process. ``asyncrl_worker_state{state}`` (1 for its
state, 0 for the others),
``asyncrl_worker_frames_total``, ``asyncrl_worker_batches_total``,
``asyncrl_worker_ahead``, ``asyncrl_worker_last_batch_age_seconds``,
``asyncrl_worker_heartbeat_age_seconds`` (live workers) and
``asyncrl_worker_exit_code`` (lost local processes).

Weights: ``asyncrl_weight_sync_seconds{model_id}``, a histogram of the seconds
from each ``send_async`` to its last acknowledgement.

>>> from prometheus_client import CollectorRegistry, generate_latest   # doctest: +SKIP
>>> registry = CollectorRegistry()
>>> metrics = CollectorMetrics(collector, registry=registry)
>>> generate_latest(registry)            # what GET /metrics serves
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, get_args

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector as _PrometheusCollector
except ImportError as exc:  # pragma: no cover - exercised with the extra missing
    raise ImportError(
        "asyncrl.metrics needs prometheus-client, which the 'metrics' extra installs: "
        'pip install "asyncrl[metrics]" (or pip install "prometheus-client>=0.17")'
    ) from exc

from ._observe.latency import LatencyHistogram
from ._observe.statistics import CollectorState, WorkerState, WorkerStatistics

STATES: tuple[WorkerState, ...] = ("joining", "collecting", "idle", "lost", "waiting", "left")
COLLECTOR_STATES: tuple[CollectorState, ...] = get_args(CollectorState)
WORKER_LABELS = ["worker", "host"]


class CollectorMetrics(_PrometheusCollector):
    """Export ``collector``'s state to Prometheus; registered in ``registry`` at once.

    ``registry`` defaults (None) to prometheus-client's global ``REGISTRY``; ``labels``
    (e.g. ``{"run": "cartpole"}``) are added to every metric, so that several
    collectors can share a registry. :meth:`unregister` removes it.

    >>> metrics = CollectorMetrics(collector, labels={"run": "a"})   # doctest: +SKIP
    """

    def __init__(self, collector: Any, *, registry: CollectorRegistry | None = None,
                 labels: dict[str, str] | None = None) -> None:
        self.collector = collector
        self.labels = dict(labels or {})
        self._registry: CollectorRegistry | None = REGISTRY if registry is None else registry
        self._registry.register(self)

    def unregister(self) -> None:
        """Stop exporting (idempotent)."""
        if self._registry is not None:
            self._registry.unregister(self)
            self._registry = None

    def describe(self) -> list[Metric]:
        return []  # read at scrape time only: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        stats = self.collector.statistics()
        names, values = list(self.labels), list(self.labels.values())

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        yield counter("asyncrl_frames", "Frames handed to the trainer.", stats.frames)
        yield counter("asyncrl_batches", "Batches handed to the trainer.", stats.batches)
        yield gauge("asyncrl_frames_per_second", "Recent frames per second handed to the "
                    "trainer.", stats.frames_per_second)
        yield gauge("asyncrl_policy_version", "Newest policy weights version sent.",
                    stats.policy_version)
        yield gauge("asyncrl_policy_lag", "Policy versions behind, oldest frame of the last "
                    "batch.", stats.policy_lag)
        yield counter("asyncrl_episodes", "Episodes that ended in delivered batches.",
                      stats.episodes)
        if stats.episode_return_mean is not None:
            yield gauge("asyncrl_episode_return_mean", "Mean return of the recent episodes.",
                        stats.episode_return_mean)
        yield gauge("asyncrl_paused", "1 while the collector is paused.", int(stats.paused))
        run_state = GaugeMetricFamily("asyncrl_collector_state", "1 for the collector's state "
                                      "(waiting: for workers to join or be replaced; failed: "
                                      "the run failed).", labels=[*names, "state"])
        for run_name in COLLECTOR_STATES:
            run_state.add_metric([*values, run_name], int(stats.state == run_name))
        yield run_state

        by_state = GaugeMetricFamily("asyncrl_workers", "Workers per state.",
                                     labels=[*names, "state"])
        for name in STATES:
            by_state.add_metric([*values, name],
                                sum(1 for w in stats.workers if w.state == name))
        yield by_state

        wl = [*names, *WORKER_LABELS]
        state = GaugeMetricFamily("asyncrl_worker_state", "1 for the worker's state.",
                                  labels=[*wl, "state"])
        frames = CounterMetricFamily("asyncrl_worker_frames", "A worker's frames handed to the "
                                     "trainer.", labels=wl)
        batches = CounterMetricFamily("asyncrl_worker_batches", "A worker's delivered batches.",
                                      labels=wl)
        ahead = GaugeMetricFamily("asyncrl_worker_ahead", "Batches asked of a worker or waiting "
                                  "for the trainer.", labels=wl)
        batch_age = GaugeMetricFamily("asyncrl_worker_last_batch_age_seconds",
                                      "Seconds since the worker's last batch.", labels=wl)
        heard = GaugeMetricFamily("asyncrl_worker_heartbeat_age_seconds",
                                  "Seconds since a live worker was last heard.", labels=wl)
        exit_code = GaugeMetricFamily("asyncrl_worker_exit_code",
                                      "A lost local worker's exit code (negative: signal).",
                                      labels=wl)
        pid = GaugeMetricFamily("asyncrl_worker_pid", "The process id of the slot's worker.",
                                labels=wl)
        for w in newest_per_slot(stats.workers):
            lv = [*values, str(w.index), w.host]
            pid.add_metric(lv, w.pid)
            for s in STATES:
                state.add_metric([*lv, s], int(w.state == s))
            frames.add_metric(lv, w.frames)
            batches.add_metric(lv, w.batches)
            ahead.add_metric(lv, w.ahead)
            if w.last_batch_age is not None:
                batch_age.add_metric(lv, w.last_batch_age)
            if w.heartbeat_age is not None:
                heard.add_metric(lv, w.heartbeat_age)
            if w.exit_code is not None:
                exit_code.add_metric(lv, w.exit_code)
        yield from (state, frames, batches, ahead, batch_age, heard, exit_code, pid)

        latency = HistogramMetricFamily("asyncrl_weight_sync_seconds",
                                        "Weight sends: seconds from the send to the last "
                                        "acknowledgement.", labels=[*names, "model_id"])
        for model_id, histogram in weight_sync_histograms(self.collector).items():
            latency.add_metric([*values, model_id], _buckets(histogram),
                               sum_value=histogram.sum)
        yield latency


def newest_per_slot(workers: Iterable[WorkerStatistics]) -> list[WorkerStatistics]:
    """One row per worker slot: its live worker, else the last one it had (lost).

    A restarted slot keeps its index, so its series go on instead of a new one
    per process id; rows come in admission order, so the later one wins.
    """
    slots: dict[int, WorkerStatistics] = {}
    for worker in workers:
        held = slots.get(worker.index)
        if held is None or held.state == "lost" or worker.state != "lost":
            slots[worker.index] = worker
    return list(slots.values())


def weight_sync_histograms(collector: Any) -> dict[str, LatencyHistogram]:
    """``{model_id: histogram}`` of ``collector``'s weight senders (none before it opened)."""
    senders = collector._weight_senders() if hasattr(collector, "_weight_senders") else {}
    return {model_id: sender.sync_latency for model_id, sender in senders.items()
            if hasattr(sender, "sync_latency")}


def _buckets(histogram: LatencyHistogram) -> list[tuple[str, float]]:
    return [("+Inf" if bound == float("inf") else repr(bound), count)
            for bound, count in histogram.cumulative()]


__all__ = ["CollectorMetrics", "newest_per_slot", "weight_sync_histograms"]
