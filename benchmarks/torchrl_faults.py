"""What TorchRL's multi-process collectors do under the faults of asyncrl's chaos suite.

Runs TorchRL's MultiSyncCollector and MultiAsyncCollector (CartPole-v1 through
torchrl.envs.GymEnv, 2 workers, 200 frames per batch) under each fault, each case in
its own process bounded by --timeout, and prints what happened: raised what after
how long, hung, or carried on. The results are in docs/reliability.md.

    python -m benchmarks.torchrl_faults [--timeout 60] [--only kill,stop,block,env_error]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks import ROOT

FAULT_AT = 3  # the fault happens after this many batches
AFTER = 8  # batches wanted after the fault to call it "carried on"
FAULTS = {
    "kill": "a worker SIGKILLed",
    "stop": "a worker SIGSTOPped for 20 s, then SIGCONT",
    "block": "the trainer loop blocked 15 s (time.sleep) between batches",
    "env_error": "an exception in a worker's env (RuntimeError at its 600th step)",
    "trainer_kill": "the trainer process SIGKILLed",
    "hang": "worker 1's env step never returns (at its 600th step; process alive)",
    "dtype": "worker 1's env returns float64 observations from its 600th step (spec: float32)",
    "shape": "worker 1's env returns observations of shape (5,) from its 600th step (spec: (4,))",
}


# -- the child: one collector, one fault -------------------------------------------------
def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def make_env():
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def make_failing_env():
    from torchrl.envs import GymWrapper

    from asyncrl.testing import CountingEnv

    return GymWrapper(CountingEnv(length=100, fail_at_step=600))


class _Shifting:
    """CartPole whose observations hang, change dtype or change shape at step 600."""

    def __init__(self, fault: str) -> None:
        import gymnasium as gym

        self.env = gym.make("CartPole-v1")
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self.fault = fault
        self.steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, **kwargs: Any) -> Any:
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        import numpy as np

        self.steps += 1
        obs, *rest = self.env.step(action)
        if self.steps >= 600:
            if self.fault == "hang":
                time.sleep(3600)
            elif self.fault == "dtype":
                obs = obs.astype(np.float64)
            elif self.fault == "shape":
                obs = np.concatenate([obs, obs[:1]])
        return (obs, *rest)


def make_shifting_env(fault: str) -> Any:
    import gymnasium as gym
    from torchrl.envs import GymWrapper

    class Env(gym.Env):  # a real gym.Env around _Shifting, as GymWrapper wants
        def __init__(self) -> None:
            self.inner = _Shifting(fault)
            self.observation_space = self.inner.observation_space
            self.action_space = self.inner.action_space

        def reset(self, *, seed: Any = None, options: Any = None) -> Any:
            return self.inner.reset(seed=seed, options=options)

        def step(self, action: Any) -> Any:
            return self.inner.step(action)

    return GymWrapper(Env())


def child(mode: str, fault: str) -> None:
    from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

    cls = MultiSyncCollector if mode == "sync" else MultiAsyncCollector
    import functools

    factory = make_failing_env if fault == "env_error" else make_env
    factories = [factory, factory]
    if fault in ("hang", "dtype", "shape"):  # in worker 1 only
        factories[1] = functools.partial(make_shifting_env, fault)
    collector = cls(factories, policy=None, frames_per_batch=200, total_frames=-1)
    pids = [p.pid for p in collector.procs]
    say(event="ready", pids=pids)
    start = time.monotonic()
    try:
        for i, batch in enumerate(collector):
            say(event="batch", i=i, t=time.monotonic() - start,
                dtype=str(batch["next", "observation"].dtype))
            if i == FAULT_AT:
                say(event="fault", t=time.monotonic() - start)
                if fault == "kill":
                    os.kill(pids[1], signal.SIGKILL)
                elif fault == "stop":
                    os.kill(pids[1], signal.SIGSTOP)
                    threading.Timer(20, os.kill, (pids[1], signal.SIGCONT)).start()
                elif fault == "block":
                    time.sleep(15)
                elif fault == "trainer_kill":
                    time.sleep(600)  # the parent kills this process now
            if i >= FAULT_AT + AFTER:
                break
    except BaseException as exc:
        say(event="raised", type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            message=str(exc)[:300], t=time.monotonic() - start)
        os._exit(1)
    say(event="done", t=time.monotonic() - start)
    collector.shutdown()


# -- the parent: run each case with a deadline, describe it ----------------------------
def run_case(mode: str, fault: str, timeout: float) -> str:
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.torchrl_faults", "--child", mode, fault],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        cwd=ROOT)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump(stream: Any) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, args=(process.stdout,), daemon=True).start()
    events, other, fault_t, deadline = [], [], None, time.monotonic() + timeout + 120
    pids: list[int] = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            line = ""
        if line is None:
            break
        if line.startswith("{"):
            event = json.loads(line)
            events.append(event)
            if event["event"] == "ready":
                pids = event["pids"]
            if event["event"] == "fault":
                fault_t, deadline = time.monotonic(), time.monotonic() + timeout
                if fault == "trainer_kill":
                    process.kill()  # the trainer only: do its workers notice?
                    process.wait()
                    return orphans(pids, timeout)
            if event["event"] in ("raised", "done"):
                break
        elif line:
            other.append(line.rstrip())
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the collector, its workers, stopped or not
    except ProcessLookupError:
        pass
    process.wait()
    return describe(events, other, fault_t, timeout, fault)


def orphans(pids: list[int], timeout: float) -> str:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not any(_alive(pid) for pid in pids):
            return f"workers exited {time.monotonic() - start:.1f} s after the trainer died"
        time.sleep(0.1)
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return (f"{len(left)} of {len(pids)} workers still running {timeout:.0f} s after the "
            f"trainer died (orphans; killed by this script)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def describe(events: list[dict], other: list[str], fault_t: float | None,
             timeout: float, fault: str) -> str:
    at = next((e["t"] for e in events if e["event"] == "fault"), None)
    if at is None:
        return f"no fault injected; output: {' | '.join(other[-3:])}"
    last = events[-1]
    after = [e for e in events if e["event"] == "batch" and e["i"] > FAULT_AT]
    batch_times = [at] + [e["t"] for e in after]
    gap = max((b - a for a, b in itertools.pairwise(batch_times)), default=0)
    if last["event"] == "raised" and fault == "env_error":
        batches = sum(1 for e in events if e["event"] == "batch")
        kept = ("the env's RuntimeError and traceback are only in the worker's stderr"
                if any("failed on purpose" in line for line in other) else
                "the env's error is nowhere in the output")
        return (f"raised {last['type']} after {batches} batches: {last['message'][:200]!r}; "
                f"{kept}")
    if last["event"] == "raised":
        return (f"raised {last['type']} {last['t'] - at:.1f} s after the fault, "
                f"after {len(after)} more batches: {last['message'][:200]!r}")
    if last["event"] == "done":
        dtypes = sorted({e.get("dtype", "?") for e in after})
        seen = f"; observation dtypes: {', '.join(dtypes)}" if fault == "dtype" else ""
        return (f"carried on: {len(after)} more batches (longest wait for a batch "
                f"{gap:.1f} s){seen}")
    return (f"hung: {len(after)} more batches, then nothing for {timeout:.0f} s "
            f"(no error; stopped by this script)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.torchrl_faults",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds without an outcome after the fault before a case "
                             "counts as hung")
    parser.add_argument("--only", default=",".join(FAULTS), help="faults to run, comma-separated")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    import torchrl

    print("# python -m benchmarks.torchrl_faults "
          + shlex.join(sys.argv[1:] if argv is None else argv))
    print(f"# torchrl {torchrl.__version__}, CartPole-v1 (GymEnv), 2 workers, 200 frames per "
          f"batch, fault after batch {FAULT_AT}, timeout {args.timeout:.0f} s")
    print("| collector | fault | what happened |")
    print("|---|---|---|")
    for fault in args.only.split(","):
        for mode in ("sync", "async"):
            outcome = run_case(mode, fault, args.timeout)
            name = "MultiSyncCollector" if mode == "sync" else "MultiAsyncCollector"
            print(f"| {name} | {FAULTS[fault]} | {outcome} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
