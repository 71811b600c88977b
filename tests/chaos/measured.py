"""A fuzzer's target process, measured from inside (the fuzzer's side: ``live_fuzz.Target``).

Each fuzzer attacks a target in its own process (``wire_target.py``: a trainer,
``inference_target.py``: a central-inference trainer, ``relay_target.py``: a host relay),
so that what it measures is the target's alone:

- ``max_busy``: the longest its event loop's thread was busy between two ticks of a
  10 ms ticker (a stall), ``max_gap`` the longest wall-clock gap (see :class:`Gauges`);
- ``rss_growth_mb``: VmHWM (peak resident memory) minus VmRSS at the baseline (VmHWM
  reset there through ``/proc/self/clear_refs``);
- ``reactions``: every refusal it made, by reason: each :class:`transports.RateLimitedLog`
  call (counted before the rate limit, which only spares the log) and each warning;
- a trainer's ``problems``: frames of the honest worker lost, repeated or acting with the
  weights of another version than their stamp (see :class:`Honest`, :class:`HonestTrainer`).

:class:`Measured` speaks the fuzzer's commands: on stdin, one a line, each answered with
one JSON line on stdout: ``report`` (the numbers above and the target's own), ``baseline``
(reset the peaks). End of stdin ends the target; one that ends by itself prints
``{"event": "ended", "error": ...}``. :func:`run` makes SIGUSR1 dump every thread's stack
to stderr (a target that stopped answering shows where it is stuck).
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import json
import logging
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import torch

from asyncrl.testing import ValuePolicy
from transports import RateLimitedLog

#: The targets' liveness: a silent peer is lost in 1.5 s (the fuzzers count on it).
LIVENESS: dict[str, Any] = {"heartbeat_interval": 0.2, "peer_timeout": 1.5}
TICK = 0.01

reactions: collections.Counter[str] = collections.Counter()
warnings: collections.deque[str] = collections.deque(maxlen=20)
_log = RateLimitedLog.log


def _counted(self: RateLimitedLog, level: int, reason: str, msg: str, *args: Any) -> bool:
    reactions[reason.split("-")[0] if reason.startswith("report-") else reason] += 1
    return _log(self, level, reason, msg, *args)


class _Warnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            reactions["warning"] += 1
            warnings.append(record.getMessage()[:300])


def _status(field: str) -> int:
    """A VmHWM / VmRSS line of /proc/self/status, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


class Gauges:
    """The event loop's longest stall and the peak memory since the last :meth:`reset`.

    A stall is the event loop's own thread busy between two ticks of a 10 ms ticker:
    the CPU time that thread spent in the gap (``max_busy``), which a machine whose
    cores are shared cannot inflate (a process the scheduler leaves waiting spends
    none); ``max_gap`` is the wall-clock gap, which it can (the looser bound catches a
    loop blocked without spending CPU, in a lock or a sleep).
    """

    def __init__(self) -> None:
        self.max_gap = self.max_busy = 0.0
        self.baseline_kib = _status("VmRSS")

    def reset(self) -> None:
        try:  # "5": reset the peak resident set size (VmHWM) to the current one
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
        self.max_gap = self.max_busy = 0.0
        self.baseline_kib = _status("VmRSS")

    async def tick(self) -> None:
        last, last_cpu = time.monotonic(), time.thread_time()
        while True:
            await anyio.sleep(TICK)
            now, cpu = time.monotonic(), time.thread_time()
            self.max_gap = max(self.max_gap, now - last - TICK)
            self.max_busy = max(self.max_busy, cpu - last_cpu)
            last, last_cpu = now, cpu


class Measured:
    """One target's gauges, refusals counted and commands; ``fields()`` adds its own numbers
    to each report.

    Counting starts at construction (every rate-limited log and warning of the process).
    """

    def __init__(self, fields: Callable[[], dict[str, Any]]) -> None:
        RateLimitedLog.log = _counted  # type: ignore[method-assign]
        logging.getLogger().addHandler(_Warnings())
        logging.getLogger().setLevel(logging.INFO)
        self.gauges = Gauges()
        self.fields = fields

    def report(self) -> dict[str, Any]:
        gauges = self.gauges
        return {"event": "report", **self.fields(), "max_gap": round(gauges.max_gap, 3),
                "max_busy": round(gauges.max_busy, 3),
                "rss_growth_mb": round((_status("VmHWM") - gauges.baseline_kib) / 1024, 1),
                "rss_mb": round(_status("VmRSS") / 1024, 1),
                "reactions": dict(reactions), "warnings": list(warnings)[-5:]}

    def baseline(self) -> float:
        """Reset the peaks; the resident memory they start from, in MB."""
        self.gauges.reset()
        return round(self.gauges.baseline_kib / 1024, 1)

    def start(self, tg: anyio.abc.TaskGroup) -> None:
        """The ticker and the commands in ``tg`` (the end of stdin cancels ``tg``)."""
        tg.start_soon(self.gauges.tick)
        tg.start_soon(self._commands, tg.cancel_scope)

    async def _commands(self, scope: anyio.CancelScope) -> None:
        while line := await anyio.to_thread.run_sync(sys.stdin.readline,
                                                     abandon_on_cancel=True):
            if line.strip() == "baseline":
                say(event="baseline", rss_mb=self.baseline())
            else:
                say(**self.report())
        scope.cancel()

    @contextlib.contextmanager
    def ending(self) -> Iterator[None]:
        """Around the target's run: one that ends by itself says how (the fuzzer wants to
        know), with its last numbers, and exits 1."""
        try:
            yield
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            try:
                last = {k: v for k, v in self.report().items() if k != "event"}
            except Exception:  # the numbers of a target broken enough not to give them
                last = {}
            say(event="ended", error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc()[-4000:], **last)
            raise SystemExit(1) from None


class Honest:
    """The honest worker's batches, checked as they come (no list to re-read in the loop).

    Within each env (pid, instance of :class:`~asyncrl.testing.IdentityEnv`) the steps
    continue from one batch to the next with no gap or repeat; each frame's action is
    the :class:`~asyncrl.testing.ValuePolicy` value of the version it is stamped with.
    """

    def __init__(self) -> None:
        self.last: dict[tuple[int, int], int] = {}
        self.values: dict[int, float] = {}
        self.problems: list[str] = []

    def check(self, batch: Any, index: int) -> None:
        ids = batch["next", "observation"].reshape(-1, 3).to(torch.float64).round().long()
        for pid, instance, step in ids.tolist():
            last = self.last.get((pid, instance))
            if last is not None and step != last + 1:
                self.problem(f"batch {index}: env {instance} of pid {pid} went from step "
                             f"{last} to {step}")
            self.last[(pid, instance)] = step
        versions = batch["collector", "policy_version"].reshape(-1).tolist()
        actions = batch["action"].reshape(-1).tolist()
        for version, action in zip(versions, actions, strict=True):
            if round(self.values.get(int(version), float("nan"))) != int(action):
                self.problem(f"batch {index}: a frame stamped version {version} acted "
                             f"{action}, expected {self.values.get(int(version))}")
                break

    def problem(self, text: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(text)


class HonestTrainer:
    """A trainer target's side: it trains for ever as ``helpers.train`` does (a new
    :class:`~asyncrl.testing.ValuePolicy` weight version after every batch) and checks its
    honest worker's frames (:class:`Honest`); :attr:`measured` reports them."""

    def __init__(self) -> None:
        self.honest = Honest()
        self.counts = {"batches": 0, "honest": 0, "others": 0}
        self.policy = ValuePolicy(0.0)
        self.measured = Measured(lambda: {**self.counts, "problems": self.honest.problems[:5]})

    def started(self, collector: Any) -> None:
        """``collector`` is serving: its first version noted, its endpoint told."""
        self.honest.values[collector.policy_version] = self.policy.value.item()
        say(event="listening", endpoint=collector.endpoint)

    async def train(self, collector: Any, batch: Any, ours: Any, **update: Any) -> None:
        """Count ``batch`` (``ours``: the honest worker's frames in it, checked; None: not
        one), then send the next weight version (``update_policy_weights(**update)``)."""
        self.counts["batches"] += 1
        if ours is not None and ours.numel():
            self.honest.check(ours, self.counts["honest"])
            self.counts["honest"] += 1
        if ours is None or ours.numel() < batch.numel():
            self.counts["others"] += 1
        self.policy.value.data.fill_(collector.policy_version + 1)
        await collector.update_policy_weights(**update)
        self.honest.values[collector.policy_version] = self.policy.value.item()

    def ready(self, **recipe: object) -> None:
        """The honest worker delivered: the peaks start here; ``recipe`` tells the fuzzer
        what a valid peer sends."""
        say(event="ready", rss_mb=self.measured.baseline(), **recipe)


def run(main: Callable[..., Awaitable[None]], *args: str) -> None:
    """``main(*args)`` on the backend named by the command line's first argument."""
    faulthandler.register(signal.SIGUSR1)  # a fuzzer that gets no answer asks for the stacks
    anyio.run(main, *args, backend=sys.argv[1])


__all__ = ["LIVENESS", "Gauges", "Honest", "HonestTrainer", "Measured", "run", "say"]
