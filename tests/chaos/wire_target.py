"""The wire fuzzer's target: a trainer in its own process, measured from inside.

Usage: python wire_target.py BACKEND   (asyncio or trio)

Runs a ``MultiAsyncCollector`` over :class:`~asyncrl.testing.IdentityEnv` with one honest
local worker and ``remote_workers=1`` on a tcp ``listen=`` without keys (a place the
fuzzer's hostile peer can take), and trains on it for ever as ``helpers.train`` does:
a new weight version after every batch. Its own process, so that what it measures is
the target's alone:

- ``max_busy``: the longest its event loop's thread was busy between two ticks of a
  10 ms ticker (a stall), ``max_gap`` the longest wall-clock gap (see :class:`Gauges`);
- ``rss_growth_mb``: VmHWM (peak resident memory) minus VmRSS at the baseline (taken
  once the honest worker delivered; VmHWM reset there through ``/proc/self/clear_refs``);
- ``problems``: frames of the honest worker lost, repeated or acting with the weights
  of another version than their stamp (see :class:`Honest`);
- ``reactions``: every refusal it made, by reason: each :class:`transports.RateLimitedLog`
  call (counted before the rate limit, which only spares the log) and each warning.

Reads commands on stdin, one a line, and answers each with one JSON line on stdout:
``report`` (the numbers above), ``baseline`` (reset the peaks). End of stdin ends it;
a run that ends by itself prints ``{"event": "ended", "error": ...}``. SIGUSR1 dumps every
thread's stack to stderr (a target that stopped answering shows where it is stuck).
"""

from __future__ import annotations

import collections
import faulthandler
import json
import logging
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import torch

from asyncrl import MultiAsyncCollector
from asyncrl.testing import ValuePolicy, identity_env
from transports import RateLimitedLog

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


def _layout(batch: Any) -> list[list[Any]]:
    """``[key path, dtype, shape]`` of each leaf of one honest batch (in the fuzzer's
    hands the recipe of a valid one)."""
    return [[list((k,) if isinstance(k, str) else k), str(v.dtype).removeprefix("torch."),
             list(v.shape)] for k, v in batch.items(include_nested=True, leaves_only=True)]


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def main() -> None:
    RateLimitedLog.log = _counted  # type: ignore[method-assign]
    logging.getLogger().addHandler(_Warnings())
    logging.getLogger().setLevel(logging.INFO)
    gauges = Gauges()
    honest = Honest()
    counts = {"batches": 0, "honest": 0, "others": 0}
    policy = ValuePolicy(0.0)
    values = honest.values

    def report() -> dict[str, Any]:
        return {"event": "report", **counts, "max_gap": round(gauges.max_gap, 3),
                "max_busy": round(gauges.max_busy, 3),
                "rss_growth_mb": round((_status("VmHWM") - gauges.baseline_kib) / 1024, 1),
                "rss_mb": round(_status("VmRSS") / 1024, 1), "problems": honest.problems[:5],
                "reactions": dict(reactions), "warnings": list(warnings)[-5:]}

    async def commands(scope: anyio.CancelScope) -> None:
        while line := await anyio.to_thread.run_sync(sys.stdin.readline,
                                                     abandon_on_cancel=True):
            if line.strip() == "baseline":
                gauges.reset()
                say(event="baseline", rss_mb=round(gauges.baseline_kib / 1024, 1))
            else:
                say(**report())
        scope.cancel()

    try:
        async with MultiAsyncCollector(identity_env, policy, num_workers=1, remote_workers=1,
                                       listen="tcp://127.0.0.1:0", frames_per_batch=20,
                                       on_worker_loss="continue", total_frames=-1,
                                       **LIVENESS) as c, \
                anyio.create_task_group() as tg:
            tg.start_soon(gauges.tick)
            tg.start_soon(commands, tg.cancel_scope)
            values[c.policy_version] = policy.value.item()
            say(event="listening", endpoint=c.endpoint)
            async for batch in c:
                counts["batches"] += 1
                if set(batch["collector", "worker_id"].flatten().tolist()) == {0}:
                    honest.check(batch, counts["honest"])
                    counts["honest"] += 1
                else:
                    counts["others"] += 1
                policy.value.data.fill_(c.policy_version + 1)
                await c.update_policy_weights(worker_ids=[0])
                values[c.policy_version] = policy.value.item()
                if counts["honest"] == 1:
                    gauges.reset()
                    say(event="ready", rss_mb=round(gauges.baseline_kib / 1024, 1),
                        layout=_layout(batch))
    except BaseException as exc:  # the fuzzer wants to know how the run ended
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            raise
        say(event="ended", error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc()[-4000:], **{k: v for k, v in report().items()
                                                          if k != "event"})
        raise SystemExit(1) from None


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # a fuzzer that gets no answer asks for the stacks
    anyio.run(main, backend=sys.argv[1])
