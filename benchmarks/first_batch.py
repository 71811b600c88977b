"""Time from process start to the first batch: asyncrl's README collector against TorchRL.

    python -m benchmarks.first_batch                 # 5 repeats, interleaved
    python -m benchmarks.first_batch --repeats 9 --json out.json
    python -m benchmarks.first_batch --cases floor,asyncrl,asyncrl-late

Each repeat starts fresh interpreters, one after the other (interleaved, so a drift
in the machine's load hits every case alike):

- ``floor``: ``import torch, tensordict, gymnasium, anyio, zmq`` and nothing else;
- ``asyncrl``: the README's example (2-worker CartPole ``MultiSyncCollector``,
  ``frames_per_batch=1000``, its imports in the README's order), as a script file,
  exiting after its first batch;
- ``asyncrl-late``: the same with ``ASYNCRL_EARLY_FORK_SERVER=0`` (the fork server
  started by the collector's constructor, as before issue 38);
- ``asyncrl-dynamo``: the same with ``ASYNCRL_DEFER_DYNAMO=0`` (tensordict imports
  ``torch._dynamo`` as it does when it is imported before asyncrl);
- ``torchrl``: TorchRL's ``MultiSyncCollector`` with the same env, workers, batch size
  and policy, exiting after its first batch.

The time runs from just before the interpreter is started (the parent's
``time.monotonic()``, a clock shared by every process on Linux) to the moment the
child has its first batch (``floor``: has imported). Medians and ratios are printed
with the command that made them. Targets (issue 38 item 4): asyncrl <= floor + 0.5 s
and <= 0.3x TorchRL.

Every module is imported from its bytecode cache, as from an installed package: the
children run without ``PYTHONDONTWRITEBYTECODE`` and asyncrl's cache is written once
before the first repeat (else each start compiled asyncrl's ~200 modules from source:
about 0.3 s of CPU that no installed asyncrl pays, while the floor's libraries had
their caches).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

FLOOR = """
import time
import torch, tensordict, gymnasium, anyio, zmq
print("READY", time.monotonic(), flush=True)
"""

IMPORTS = """
import time
import anyio, torch
from tensordict.nn import TensorDictModule
"""

# The README's order: asyncrl before tensordict (it then imports tensordict without
# torch._dynamo, transports/_lazy_dynamo.py), as isort sorts an installed asyncrl.
ASYNCRL_IMPORTS = """
import time
import anyio, torch
from asyncrl import MultiSyncCollector
from tensordict.nn import TensorDictModule
"""

POLICY = """
net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))

class Sample(torch.nn.Module):
    def forward(self, logits):
        return torch.distributions.Categorical(logits=logits).sample()

policy = TensorDictModule(torch.nn.Sequential(net, Sample()),
                          in_keys=["observation"], out_keys=["action"])
"""

ASYNCRL = ASYNCRL_IMPORTS + POLICY + """
async def main():
    async with MultiSyncCollector("CartPole-v1", policy, num_workers=2,
                                  frames_per_batch=1000, total_frames=10_000) as collector:
        async for batch in collector:
            print("READY", time.monotonic(), flush=True)
            break

if __name__ == "__main__":
    anyio.run(main)
"""

TORCHRL = IMPORTS + POLICY + """
from torchrl.collectors import MultiSyncCollector
from torchrl.envs import GymEnv

def make_env():  # integer actions, as the README's policy samples them
    return GymEnv("CartPole-v1", categorical_action_encoding=True)

if __name__ == "__main__":
    collector = MultiSyncCollector([make_env, make_env], policy, frames_per_batch=1000,
                                   total_frames=10_000)
    for batch in collector:
        print("READY", time.monotonic(), flush=True)
        break
    collector.shutdown()
"""

SCRIPTS = {"floor": FLOOR, "asyncrl": ASYNCRL, "asyncrl-late": ASYNCRL,
           "asyncrl-dynamo": ASYNCRL, "torchrl": TORCHRL}
ENVIRONMENT = {"asyncrl-late": {"ASYNCRL_EARLY_FORK_SERVER": "0"},
               "asyncrl-dynamo": {"ASYNCRL_DEFER_DYNAMO": "0"}}


def run_once(path: str, env: dict[str, str], timeout: float) -> float:
    """Seconds from the interpreter's start to its READY line.

    The output is read line by line: a helper that keeps the pipe open after the
    script is done (TorchRL's workers, multiprocessing's trackers) must not count.
    """
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen([sys.executable, path], stdout=subprocess.PIPE, stderr=errors,
                                 text=True, env=env, cwd=os.path.dirname(path),
                                 start_new_session=True)
        assert child.stdout is not None
        ready = None
        for line in child.stdout:
            if line.startswith("READY "):
                ready = float(line.split()[1])
                break
        try:  # its shutdown is not timed (TorchRL's may take long): killed if slow
            code = child.wait(timeout=timeout if ready is None else 15.0)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)  # whatever it left behind
            child.stdout.close()
        if ready is None:
            errors.seek(0)
            raise RuntimeError(f"{path} exited with {code}:\n{errors.read()[-3000:]}")
    return ready - start


def child_environment(root: str, extra: dict[str, str]) -> dict[str, str]:
    """A child's environment: this tree first on the path, bytecode caches used."""
    env = {**os.environ, **extra}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def warm_bytecode(root: str) -> None:
    """Write asyncrl's bytecode cache (``__pycache__``, ignored by git), untimed."""
    env = child_environment(root, {"ASYNCRL_EARLY_FORK_SERVER": "0"})
    subprocess.run([sys.executable, "-c", "import asyncrl, asyncrl._worker.entry"],
                   check=True, env=env, cwd=root, timeout=300)


def report(cases: list[str], times: dict[str, list[float]]) -> dict[str, float]:
    """Print medians and the ratios the targets name; return the medians."""
    medians = {case: statistics.median(values) for case, values in times.items()}
    print("\ncommand: python -m benchmarks.first_batch " + shlex.join(sys.argv[1:]))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    for case in cases:
        print(f"  {case:12s} median {medians[case]:.2f} s  "
              f"(min {min(times[case]):.2f}, max {max(times[case]):.2f})")
    for case in ("asyncrl", "asyncrl-late"):
        if case in medians and "floor" in medians:
            print(f"  {case} - floor: {medians[case] - medians['floor']:+.2f} s (target <= +0.5 s)")
        if case in medians and "torchrl" in medians:
            print(f"  {case} / torchrl: {medians[case] / medians['torchrl']:.2f}x (target <= 0.3x)")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default="floor,asyncrl,asyncrl-dynamo,asyncrl-late,torchrl")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", help="write the raw times here")
    args = parser.parse_args()
    cases = args.cases.split(",")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    warm_bytecode(root)
    times: dict[str, list[float]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="first-batch-") as tmp:
        for repeat in range(args.repeats):
            for case in cases:
                path = os.path.join(tmp, f"first_batch_{case.replace('-', '_')}.py")
                with open(path, "w") as f:
                    f.write(SCRIPTS[case])
                env = child_environment(root, ENVIRONMENT.get(case, {}))
                times[case].append(run_once(path, env, args.timeout))
            print(f"repeat {repeat}: " + ", ".join(f"{c} {times[c][-1]:.2f} s" for c in cases),
                  flush=True)
    medians = report(cases, times)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"times": times, "medians": medians}, f, indent=1)


if __name__ == "__main__":
    main()
