"""A fuzzer against a live process: the process, its health, the state machine, the run.

Every wire fuzzer (``test_wire_fuzz*.py``, ``test_inference_fuzz.py``) attacks a target in
its own process and asserts the same things of it, so they share:

- :class:`Target`: a target script (``wire_target.py``, ``inference_target.py``,
  ``relay_target.py``; see ``measured.py``) in its own process, asked for its numbers;
  :class:`Live`, one started in a scratch directory, and :func:`live_fixture`, the pytest
  fixture that starts one per backend and removes it after;
- :func:`check_gauges` / :func:`check_health`: its peak RSS grew by at most
  :data:`RSS_GROWTH_MB`, its event loop never stalled more than :data:`MAX_GAP`, and a
  trainer's honest frames are exact;
- :class:`FuzzMachine` and :func:`fuzz`: a hypothesis state machine that keeps its first
  failure with the steps that led to it, run with the fuzzers' CI settings (a fixed seed
  unless ``WIRE_FUZZ_RANDOM`` is set, no shrinking: the target is live).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

#: What a target may add to its peak resident memory while attacked.
RSS_GROWTH_MB = 64
#: The longest its event loop's thread may be busy without running its ticker.
MAX_GAP = 0.5
#: The longest wall-clock gap between two ticks: looser, as a shared machine's scheduler
#: can leave the target waiting for a core longer than MAX_GAP (see measured.Gauges).
MAX_WALL_GAP = 5.0
#: Bound on each wait for the target (2 shared cores, a spawned worker, torch imports).
WAIT = 30.0
#: CI draws the same examples every run; ``WIRE_FUZZ_RANDOM=1`` draws new ones (a campaign).
DERANDOMIZE = not os.environ.get("WIRE_FUZZ_RANDOM")
SCRIPT = Path(__file__).with_name("wire_target.py")


class TargetEnded(AssertionError):
    """The target process ended, or stopped answering: the run did not go on."""


class Target:
    """``script BACKEND *args`` in its own process (``wire_target.py`` by default; any
    script that speaks ``measured.py``'s commands), once it said where it listens;
    ``report()`` asks it for its numbers."""

    def __init__(self, backend: str, env: dict[str, str], script: Path = SCRIPT,
                 *args: str) -> None:
        self.backend = backend
        self.process = subprocess.Popen(
            [sys.executable, str(script), backend, *args], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.endpoint: str = self.wait("listening", 90)["endpoint"]

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put({"event": "exit"})

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr = [*self.stderr[-200:], line.rstrip()]

    def wait(self, event: str, timeout: float = WAIT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TargetEnded(f"the target sent no {event!r} within {timeout:.0f} s; "
                                  f"its stacks:\n{self.stacks()}") from None
            if got["event"] == event:
                return got
            if got["event"] in ("ended", "exit"):
                raise TargetEnded(f"the target's run ended while waiting for {event!r}: "
                                  f"{got.get('error', 'its process exited')}\n"
                                  f"{got.get('traceback', '')}\n"
                                  f"stderr ends: {self.stderr[-15:]}")

    def stacks(self) -> str:
        """Every thread's stack in the target (faulthandler on SIGUSR1), from its stderr."""
        if self.process.poll() is not None:
            return "\n".join(self.stderr[-40:])
        seen = len(self.stderr)
        os.kill(self.process.pid, signal.SIGUSR1)
        time.sleep(1.0)
        return "\n".join(self.stderr[max(0, seen - 5):][-80:])

    def command(self, line: str, event: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except OSError:
            pass  # gone: wait() says why
        return self.wait(event)

    def report(self) -> dict[str, Any]:
        return self.command("report", "report")  # the loop answers: a stall shows here too

    def progressed(self, after: int, timeout: float = WAIT) -> dict[str, Any]:
        """A report once the honest worker delivered more than ``after`` batches."""
        deadline = time.monotonic() + timeout
        while True:
            report = self.report()
            if report["honest"] > after:
                return report
            if time.monotonic() > deadline:
                raise TargetEnded(f"the honest worker delivered no batch in {timeout:.0f} s "
                                  f"(still {report['honest']}): the run did not go on; "
                                  f"last warnings {report['warnings']}")
            time.sleep(0.2)

    def close(self) -> None:
        if self.process.stdin is not None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()


def check_gauges(report: dict[str, Any], what: str, who: str = "target") -> None:
    """The peak memory and the event loop of ``who`` within bounds."""
    assert report["rss_growth_mb"] <= RSS_GROWTH_MB, (
        f"{what}: the {who}'s peak memory grew by {report['rss_growth_mb']} MB "
        f"(at most {RSS_GROWTH_MB})")
    assert report["max_busy"] <= MAX_GAP, (
        f"{what}: the {who}'s event loop was held {report['max_busy']} s of CPU time "
        f"between two ticks (at most {MAX_GAP})")


def check_health(report: dict[str, Any], what: str) -> None:
    """The honest worker's frames are exact, memory and event loop within bounds."""
    assert not report["problems"], f"{what}: honest batches are wrong: {report['problems']}"
    check_gauges(report, what)
    assert report["max_gap"] <= MAX_WALL_GAP, (
        f"{what}: the target's event loop stalled {report['max_gap']} s (at most "
        f"{MAX_WALL_GAP} of wall-clock time)")


def target_env(root: Path) -> dict[str, str]:
    """This process's environment for a target: its temporary files (sockets, segments)
    under ``root``, this checkout first on its path."""
    env = dict(os.environ, TMPDIR=str(root))
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    return env


class Live:
    """A :class:`Target` started with its files under ``root``; :attr:`names` numbers the
    peers a fuzzer makes."""

    def __init__(self, backend: str, root: Path, script: Path = SCRIPT, *args: str) -> None:
        self.target = Target(backend, target_env(root), script, *args)
        self.names = itertools.count()

    def close(self) -> None:
        self.target.close()


class _Closable(Protocol):
    def close(self) -> None: ...


L = TypeVar("L", bound=_Closable)


def live_fixture(start: Callable[[str, Path], L], prefix: str) -> Any:
    """A pytest fixture, parametrized indirectly by backend: ``start(backend, root)`` in a
    scratch directory ``root`` (named ``prefix...`` under /tmp), closed and removed after:
    ``live = live_fixture(Live, "fuzz-")`` in a test module."""

    @pytest.fixture
    def fixture(request: pytest.FixtureRequest) -> Iterator[L]:
        root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        try:
            live = start(request.param, root)
            try:
                yield live
            finally:
                live.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)

    return fixture


@contextlib.contextmanager
def noting_first_failure(history: list[str], failures: list[str]) -> Iterator[None]:
    """Keep the first failure in ``failures`` with the steps that led to it: hypothesis
    replays a failing example, and against a live target the replay meets another state."""
    try:
        yield
    except Exception as exc:
        if not failures:
            steps = "\n  ".join(history[-12:])
            failures.append(f"{type(exc).__name__}: {exc}\nlast steps:\n  {steps}")
        raise


class FuzzMachine(RuleBasedStateMachine):
    """A fuzzer's state machine: the steps it took (:attr:`history`) and, under
    :meth:`noted`, the first failure with them (:attr:`failures`, its own per :func:`fuzz`):
    hypothesis replays a failing example to confirm it, and against a live target the
    replay meets another state (it fails at another step, or not), which it reports as
    flaky data generation instead."""

    failures: ClassVar[list[str]] = []

    def __init__(self) -> None:
        super().__init__()
        self.history: list[str] = []

    def noted(self) -> contextlib.AbstractContextManager[None]:
        """Keep the first failure and the steps that led to it."""
        return noting_first_failure(self.history, self.failures)


def fuzz(machine: type[FuzzMachine], *, examples: int, steps: int, **live: Any) -> None:
    """Run ``machine`` against ``live`` (set as its class attributes) with the fuzzers' CI
    settings; a failure is raised as the first one seen, with the steps before it."""
    failures: list[str] = []
    # Named as the fuzzers always named it: with a fixed seed, hypothesis derives the
    # examples from the name of a machine it cannot read the source of.
    bound = type(f"{machine.__name__}Live", (machine,), {**live, "failures": failures})
    try:
        run_state_machine_as_test(bound, settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None,
            derandomize=DERANDOMIZE, database=None, suppress_health_check=list(HealthCheck),
            # No shrinking: the target is live, so a replay meets another state; the first
            # failure, with the step that caused it, is the report.
            phases=[Phase.explicit, Phase.generate]))
    except Exception as exc:
        if failures:
            raise AssertionError(failures[0]) from exc
        raise


__all__ = [
    "DERANDOMIZE",
    "MAX_GAP",
    "MAX_WALL_GAP",
    "RSS_GROWTH_MB",
    "WAIT",
    "FuzzMachine",
    "Live",
    "Target",
    "TargetEnded",
    "check_gauges",
    "check_health",
    "fuzz",
    "live_fixture",
    "noting_first_failure",
    "target_env",
]
