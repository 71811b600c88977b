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
state: starting, running, waiting, paused, failed, closed; 0 for the others).

Workers, fit for alerts that clear: ``asyncrl_workers_expected`` (local + remote
workers the run wants), ``asyncrl_workers{state}``: how many are joining,
collecting, idle or waiting now, and how many places are empty *now* because a
worker was lost or left (a replacement clears them); ``asyncrl_workers_lost_total``
and ``asyncrl_workers_left_total`` count every loss and clean departure (counters).

How batches reached the trainer: ``asyncrl_batches_arrived_total{channel}`` and
``asyncrl_batch_bytes_arrived_total{channel}`` (``shared_memory`` or ``socket``), and
``asyncrl_shared_memory_fallbacks_total`` (local workers a full ``/dev/shm`` kept on
the socket), all counters.

Served modules: ``asyncrl_served_refusals_total{reason}`` (a counter), remote hosts'
calls refused by reason (``statistics().served_refusals``: ``not admitted``,
``malformed``, ``unknown module``, ``busy``; each 0 until it happens).

Per live worker (labels ``worker``, its index, and ``host``): ``asyncrl_worker_pid``,
``asyncrl_worker_state{state}`` (1 for its state, 0 for the others),
``asyncrl_worker_frames_total``, ``asyncrl_worker_batches_total``,
``asyncrl_worker_ahead``, ``asyncrl_worker_last_batch_age_seconds``,
``asyncrl_worker_heartbeat_age_seconds`` and ``asyncrl_worker_exit_code``. The
series are bounded by the expected workers: a gone remote worker's series leave at
once (a rejoin gets a new index), a local slot's stay with its last process (and its
exit code) until a replacement takes the slot.

Weights: ``asyncrl_weight_sync_seconds{model_id}``, a histogram of the seconds
from each ``send_async`` to its last acknowledgement; ``asyncrl_weights_version``
and ``asyncrl_weights_acked_version{model_id}`` (the lowest version a live worker
acknowledged: the difference lasting means a worker does not apply weights).

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
from ._observe.statistics import (
    SERVED_REFUSAL_REASONS,
    CollectorState,
    WorkerState,
    WorkerStatistics,
)

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
        self._gone = GoneCounter()
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

        yield from _arrivals(stats, names, values)
        yield _served_refusals(stats, names, values)
        yield from self._worker_counts(stats.workers, names, values)
        yield from _per_worker(shown_workers(stats.workers, local_slots(self.collector)),
                               names, values)
        latency = HistogramMetricFamily("asyncrl_weight_sync_seconds",
                                        "Weight sends: seconds from the send to the last "
                                        "acknowledgement.", labels=[*names, "model_id"])
        for model_id, histogram in weight_sync_histograms(self.collector).items():
            latency.add_metric([*values, model_id], _buckets(histogram),
                               sum_value=histogram.sum)
        yield latency
        yield from _weight_versions(self.collector, names, values)

    def _worker_counts(self, workers: tuple[WorkerStatistics, ...], names: list[str],
                       values: list[str]) -> Iterator[Metric]:
        expected = expected_workers(self.collector)
        yield _gauge("asyncrl_workers_expected", "Workers the run wants (local and remote).",
                     names, values, expected or 0)
        by_state = GaugeMetricFamily("asyncrl_workers", "Workers per state now; lost and "
                                     "left: places empty now since a worker was lost or "
                                     "left (a replacement clears them).",
                                     labels=[*names, "state"])
        for name, count in worker_counts(workers, expected, local_slots(self.collector)).items():
            by_state.add_metric([*values, name], count)
        yield by_state
        lost, left = self._gone.update(workers)
        for name, total, doc in (("lost", lost, "Workers lost (ended, silent, refused)."),
                                 ("left", left, "Remote workers that left cleanly.")):
            family = CounterMetricFamily(f"asyncrl_workers_{name}", doc, labels=names)
            family.add_metric(values, total)
            yield family


class GoneCounter:
    """Counts lost and left workers across scrapes, from the lines each snapshot lists.

    A snapshot lists the registry's recent gone workers (bounded); a line not seen
    at the previous scrape is a new one. So the totals only grow, whatever the
    registry forgets, as long as fewer than its bound (1024) are lost between scrapes.

    >>> counter = GoneCounter()
    >>> counter.update([WorkerStatistics(0, "w0", "h", 7, "lost")])
    (1, 0)
    >>> counter.update([WorkerStatistics(0, "w0", "h", 7, "lost")])
    (1, 0)
    """

    def __init__(self) -> None:
        self.lost = 0
        self.left = 0
        self._seen: set[tuple[int, int, str, str]] = set()

    def update(self, workers: Iterable[WorkerStatistics]) -> tuple[int, int]:
        seen = {(w.index, w.pid, w.name, str(w.state)) for w in workers
                if w.state in ("lost", "left")}
        for _, _, _, state in seen - self._seen:
            if state == "lost":
                self.lost += 1
            else:
                self.left += 1
        self._seen = seen  # bounded by what the snapshot lists
        return self.lost, self.left


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


def local_slots(collector: Any) -> int | None:
    """How many indices are local slots (reused by a respawn); None: unknown, all are."""
    if not hasattr(collector, "remote_workers"):
        return None
    count = getattr(collector, "num_workers", None)
    return count if isinstance(count, int) else None


def expected_workers(collector: Any) -> int | None:
    """Local plus remote workers the collector wants (None: it does not say)."""
    local, remote = getattr(collector, "num_workers", None), getattr(collector, "remote_workers", 0)
    if not isinstance(local, int) or not isinstance(remote, int):
        return None
    return local + remote


def shown_workers(workers: Iterable[WorkerStatistics], slots: int | None
                  ) -> list[WorkerStatistics]:
    """The workers with series of their own: one per local slot (its newest), and every
    live remote worker; a gone remote worker never comes back under its index."""
    return [w for w in newest_per_slot(workers)
            if w.state not in ("lost", "left") or slots is None or w.index < slots]


def worker_counts(workers: Iterable[WorkerStatistics], expected: int | None,
                  slots: int | None) -> dict[WorkerState, int]:
    """``{state: count}`` now; ``lost`` / ``left``: the places they left that no admitted
    worker took yet (a respawn still joining does not clear them; its admission does).

    A local slot's place is taken by the next worker admitted in it; a remote
    worker's by any remote joiner, since a run has ``expected`` places in all.

    >>> lines = [WorkerStatistics(2, "r", "h", 1, "lost"), WorkerStatistics(3, "r", "h", 2, "idle")]
    >>> worker_counts(lines, expected=2, slots=1)["lost"]
    1
    >>> worker_counts(lines, expected=1, slots=1)["lost"]  # the joiner took its place
    0
    """
    workers = list(workers)
    counts: dict[WorkerState, int] = {state: 0 for state in STATES}
    for w in workers:
        if w.state not in ("lost", "left"):
            counts[w.state] += 1
    gone = {"lost": 0, "left": 0}
    for w in newest_per_slot(w for w in workers if w.state not in ("joining", "waiting")):
        if w.state in gone:
            gone[w.state] += 1
    if expected is not None:  # remote joiners take any empty place
        empty = max(0, expected - counts["collecting"] - counts["idle"])
        counts["lost"] = min(gone["lost"], empty)
        counts["left"] = min(gone["left"], empty - counts["lost"])
    else:
        counts["lost"], counts["left"] = gone["lost"], gone["left"]
    return counts


def weight_sync_histograms(collector: Any) -> dict[str, LatencyHistogram]:
    """``{model_id: histogram}`` of ``collector``'s weight senders (none before it opened)."""
    senders = collector._weight_senders() if hasattr(collector, "_weight_senders") else {}
    return {model_id: sender.sync_latency for model_id, sender in senders.items()
            if hasattr(sender, "sync_latency")}


def _weight_versions(collector: Any, names: list[str], values: list[str]
                     ) -> Iterator[Metric]:
    sent = GaugeMetricFamily("asyncrl_weights_version", "Newest weights version sent.",
                             labels=[*names, "model_id"])
    acked = GaugeMetricFamily("asyncrl_weights_acked_version", "Lowest version a live "
                              "worker acknowledged (absent without live workers).",
                              labels=[*names, "model_id"])
    senders = collector._weight_senders() if hasattr(collector, "_weight_senders") else {}
    for model_id, sender in senders.items():
        sent.add_metric([*values, model_id], sender.version)
        versions = getattr(sender, "acked_versions", None)
        if versions:
            acked.add_metric([*values, model_id], min(versions.values()))
    yield from (sent, acked)


def _arrivals(stats: Any, names: list[str], values: list[str]) -> Iterator[Metric]:
    """Batches and bytes by the way they came (shared memory, socket); fallbacks."""
    batches = CounterMetricFamily("asyncrl_batches_arrived", "Batches that reached the "
                                  "trainer, by channel.", labels=[*names, "channel"])
    nbytes = CounterMetricFamily("asyncrl_batch_bytes_arrived", "Tensor bytes of the batches "
                                 "that reached the trainer, by channel.",
                                 labels=[*names, "channel"])
    for channel in ("shared_memory", "socket"):
        batches.add_metric([*values, channel], getattr(stats, f"{channel}_batches", 0))
        nbytes.add_metric([*values, channel], getattr(stats, f"{channel}_bytes", 0))
    fallbacks = CounterMetricFamily("asyncrl_shared_memory_fallbacks", "Local workers a full "
                                    "/dev/shm kept on the socket.", labels=names)
    fallbacks.add_metric(values, getattr(stats, "shared_memory_fallbacks", 0))
    yield from (batches, nbytes, fallbacks)


def _served_refusals(stats: Any, names: list[str], values: list[str]) -> Metric:
    """Remote calls to served modules refused, by reason: every known reason (0 until it
    happens, so that a rate alert has a series), and any other the snapshot names."""
    counts = dict(getattr(stats, "served_refusals", None) or {})
    refused = CounterMetricFamily("asyncrl_served_refusals", "Remote hosts' calls to served "
                                  "modules refused, by reason.", labels=[*names, "reason"])
    for reason in [*SERVED_REFUSAL_REASONS, *sorted(set(counts) - set(SERVED_REFUSAL_REASONS))]:
        refused.add_metric([*values, reason], counts.get(reason, 0))
    return refused


def _gauge(name: str, doc: str, names: list[str], values: list[str],
           value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=names)
    family.add_metric(values, value)
    return family


def _per_worker(workers: list[WorkerStatistics], names: list[str], values: list[str]
                ) -> Iterator[Metric]:
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
    for w in workers:
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


def _buckets(histogram: LatencyHistogram) -> list[tuple[str, float]]:
    return [("+Inf" if bound == float("inf") else repr(bound), count)
            for bound, count in histogram.cumulative()]


__all__ = ["CollectorMetrics", "GoneCounter", "expected_workers", "local_slots", "newest_per_slot",
           "shown_workers", "weight_sync_histograms", "worker_counts"]
