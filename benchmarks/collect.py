"""Collection throughput, start-up time and worker memory: asyncrl against TorchRL.

    python -m benchmarks.collect             # the default matrix (about 8 min, 2 idle cores)
    python -m benchmarks.collect --quick     # sync 2x1 per env and policy, smoke run
    python -m benchmarks.collect --envs Pendulum-v1 --policies mlp256 --cases 4x1 --modes async
    python -m benchmarks.collect --cases sync,async   # the earlier benchmark: random, CartPole

What is measured looks like training, in the same run for both libraries:

- envs: ``CartPole-v1`` (discrete) and ``Pendulum-v1`` (continuous);
- policies: ``random`` (each library's own random policy), ``mlp64`` and ``mlp256``
  (``obs -> 64|256 -> 64|256 -> action`` MLP with Tanh, a ``TensorDictModule`` writing
  ``"action"``: argmax of the logits on CartPole, ``2 * tanh`` on Pendulum). The **same
  policy object** (built once per repeat, CPU, seeded) is given to both libraries;
- layouts ``workers x envs per worker``: ``2x1``, ``2x8`` (TorchRL: ``SerialEnv(8, ...)`` per
  worker; asyncrl: ``envs_per_worker=8``) and ``4x1``; ``sync`` (``MultiSyncCollector``,
  each batch split over the workers) and ``async`` (``MultiAsyncCollector``, each batch
  from one worker); ``--frames-per-batch`` frames per batch (1,024 by default);
- after every batch the trainer calls ``update_policy_weights_()`` (TorchRL, its default
  shared-memory scheme) or ``await update_policy_weights()`` (asyncrl, its default ZeroMQ
  scheme), as a training loop does (``--no-update-weights`` turns it off; the random policy
  has no weights to send).

Both libraries run with their own defaults, nothing tuned by hand: TorchRL caps its
workers (``num_sub_threads=1``) and the trainer (``num_threads``: cores minus workers),
asyncrl does what it does by default; the trainer's ``torch.get_num_threads()`` during the
timed window is recorded for each run.

For each configuration and repeat a fresh collector is built (libraries interleaved, so
drifts hit both alike); the time from the constructor call to the first batch is "first
batch"; the first batch is also the warm-up; then ``--windows`` timed windows follow back
to back, each of at least ``--batches`` batches and ``--min-seconds`` (at most
``--max-seconds``), and the run's frames/s is their median; "peak RSS" is ``VmHWM`` of
each worker process, read before shutdown. Medians over ``--repeats`` (default 1, which
keeps the full matrix, 36 cases x 2 libraries, near 8 minutes on 2 idle cores; use
``--repeats 3`` for numbers to publish); ratios are asyncrl / TorchRL. Targets (issue
11): frames/s >= 3x, first batch <= 0.3x; (issue 4) peak RSS per worker <= 1x.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

ENVS = ("CartPole-v1", "Pendulum-v1")
POLICIES = ("random", "mlp64", "mlp256")
LAYOUTS = {"2x1": (2, 1), "2x8": (2, 8), "4x1": (4, 1), "2x16": (2, 16)}
MODES = ("sync", "async")
DEFAULT_LAYOUTS = ("2x1", "2x8", "4x1")
#: The earlier benchmark's case names, still accepted by ``--cases``: (mode, layout).
LEGACY_CASES = {"sync": ("sync", "2x1"), "async": ("async", "2x1"),
                "sync16": ("sync", "2x16"), "async16": ("async", "2x16")}
FRAMES_PER_BATCH = 1024  # a multiple of every layout's workers x envs
SEED = 0


@dataclass(frozen=True)
class Case:
    env: str
    policy: str
    sync: bool
    num_workers: int
    envs_per_worker: int
    frames_per_batch: int

    @property
    def layout(self) -> str:
        return f"{self.num_workers}x{self.envs_per_worker}"

    @property
    def mode(self) -> str:
        return "sync" if self.sync else "async"

    @property
    def name(self) -> str:
        return f"{self.env} {self.policy} {self.mode} {self.layout}"

    def expected_shape(self) -> list[int]:
        """asyncrl's batch shape (TorchRL's, docs/batch_shapes.md): sync ``[workers, envs, T]``,
        async ``[envs, T]``; without the env dim for one env per worker."""
        envs = [self.envs_per_worker] if self.envs_per_worker > 1 else []
        workers = [self.num_workers] if self.sync else []
        per_worker = self.frames_per_batch // (self.num_workers if self.sync else 1)
        return [*workers, *envs, per_worker // self.envs_per_worker]


@dataclass
class Run:
    """One repeat of one case with one library."""

    fps: float  # median over the run's timed windows
    first_batch_s: float
    worker_rss_mb: list[float]
    frames: int
    batch_shape: list[int]
    trainer_threads: int = 0  # torch.get_num_threads() in the trainer during the window
    weight_updates: int = 0
    window_fps: list[float] = field(default_factory=list)
    close_error: str | None = None  # raised while closing, after the measurement
    leftover_pids: list[int] = field(default_factory=list)  # workers alive 10 s after close


@dataclass
class Result:
    library: str
    case: str
    runs: list[Run] = field(default_factory=list)
    error: str | None = None

    def median(self, attr: str) -> float:
        if not self.runs:
            return float("nan")
        if attr == "worker_rss_mb":
            return statistics.median(max(r.worker_rss_mb, default=float("nan"))
                                     for r in self.runs)
        return statistics.median(getattr(r, attr) for r in self.runs)


@dataclass(frozen=True)
class Window:
    """How long a timed window lasts: at least ``batches`` and ``min_s``, at most ``max_s``."""

    batches: int
    min_s: float
    max_s: float
    windows: int = 1  # back to back in one run; the run's frames/s is their median

    def done(self, count: int, elapsed: float) -> bool:
        return count >= 1 and (elapsed >= self.max_s
                               or (count >= self.batches and elapsed >= self.min_s))


# -- policies ----------------------------------------------------------------------------------
class Argmax(nn.Module):
    """Greedy discrete action from logits: a cheap, deterministic head both libraries run."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)


class Scale(nn.Module):
    """``scale * x``: maps a tanh output onto Pendulum's action range [-2, 2]."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


#: env id -> (observation size, head size, head modules after the last Linear)
ENV_HEADS: dict[str, tuple[int, int, Callable[[], list[nn.Module]]]] = {
    "CartPole-v1": (4, 2, lambda: [Argmax()]),
    "Pendulum-v1": (3, 1, lambda: [nn.Tanh(), Scale(2.0)]),
}


def make_policy(name: str, env_id: str) -> Any:
    """The policy both libraries get: None for ``random``, else an MLP ``TensorDictModule``."""
    if name == "random":
        return None
    if not name.startswith("mlp") or not name[3:].isdigit():
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}")
    if env_id not in ENV_HEADS:
        raise ValueError(f"no MLP head for env {env_id!r}; expected one of {', '.join(ENV_HEADS)}")
    from tensordict.nn import TensorDictModule

    # Through the module's import name, also when run as ``python -m``: the workers
    # unpickle Argmax and Scale as benchmarks.collect's, never as __main__'s.
    from benchmarks import collect

    width = int(name[3:])
    obs, out, head = collect.ENV_HEADS[env_id]
    torch.manual_seed(SEED)  # the same weights in every repeat
    net = nn.Sequential(nn.Linear(obs, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                        nn.Linear(width, out), *head())
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])


# -- process inspection ------------------------------------------------------------------------
def peak_rss_mb(pid: int) -> float:
    """``VmHWM`` (peak resident set size) of ``pid`` in MiB; NaN if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


HELPERS = (b"resource_tracker", b"forkserver")  # multiprocessing's own helper processes


def spawned_children() -> set[int]:
    """Pids of this process's worker children (not multiprocessing's helper processes)."""
    me = os.getpid()
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if not any(helper in cmdline for helper in HELPERS):
            pids.add(int(entry))
    return pids


def _wait_children_gone(before: set[int], timeout: float = 10.0) -> list[int]:
    """Wait for the workers started since ``before`` to exit; return those still alive."""
    deadline = time.monotonic() + timeout
    while spawned_children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(spawned_children() - before)


# -- TorchRL -------------------------------------------------------------------------------------
def _torchrl_env_factory(env_id: str, envs_per_worker: int) -> Callable[[], Any]:
    from torchrl.envs import GymEnv, SerialEnv

    # Integer actions (not one-hot) on CartPole, as gymnasium and asyncrl have them, so
    # one policy module serves both libraries; Box action spaces ignore the flag.
    single = functools.partial(GymEnv, env_id, categorical_action_encoding=True)
    if envs_per_worker == 1:
        return single
    return functools.partial(SerialEnv, envs_per_worker, single)


def run_torchrl(case: Case, window: Window, update_weights: bool) -> Run:
    from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

    cls = MultiSyncCollector if case.sync else MultiAsyncCollector
    policy = make_policy(case.policy, case.env)
    update = update_weights and policy is not None
    before = spawned_children()
    start = time.perf_counter()
    collector = cls(
        [_torchrl_env_factory(case.env, case.envs_per_worker)] * case.num_workers, policy,
        frames_per_batch=case.frames_per_batch, total_frames=-1,
    )
    try:
        it = iter(collector)
        first = next(it)
        first_batch_s = time.perf_counter() - start
        updates = 0
        if update:
            collector.update_policy_weights_()
            updates += 1
        rates = []
        for _ in range(window.windows):
            frames, count, t0 = 0, 0, time.perf_counter()
            while not window.done(count, time.perf_counter() - t0):
                frames, count = frames + next(it).numel(), count + 1
                if update:  # the trainer's step would go here; then the new weights go out
                    collector.update_policy_weights_()
                    updates += 1
            rates.append(frames / (time.perf_counter() - t0))
        fps = statistics.median(rates)
        threads = torch.get_num_threads()
        workers = sorted(spawned_children() - before)
        run = Run(fps, first_batch_s, [peak_rss_mb(pid) for pid in workers], frames,
                  list(first.shape), threads, updates, rates)
    finally:
        collector.shutdown()
    run.leftover_pids = _wait_children_gone(before)
    return run


# -- asyncrl -------------------------------------------------------------------------------------
async def _asyncrl_once(case: Case, window: Window, update_weights: bool) -> Run:
    from asyncrl import MultiCollector

    policy = make_policy(case.policy, case.env)
    update = update_weights and policy is not None
    run: Run | None = None
    start = time.perf_counter()
    try:
        async with MultiCollector(
            case.env, policy, num_workers=case.num_workers, sync=case.sync,
            envs_per_worker=case.envs_per_worker, frames_per_batch=case.frames_per_batch,
            total_frames=-1,
        ) as collector:
            it = collector.__aiter__()
            first = await it.__anext__()
            first_batch_s = time.perf_counter() - start
            updates = 0
            if update:
                await collector.update_policy_weights()
                updates += 1
            rates = []
            for _ in range(window.windows):
                frames, count, t0 = 0, 0, time.perf_counter()
                while not window.done(count, time.perf_counter() - t0):
                    frames, count = frames + (await it.__anext__()).numel(), count + 1
                    if update:
                        await collector.update_policy_weights()
                        updates += 1
                rates.append(frames / (time.perf_counter() - t0))
            fps = statistics.median(rates)
            run = Run(fps, first_batch_s, [peak_rss_mb(p) for p in collector.worker_pids],
                      frames, list(first.shape), torch.get_num_threads(), updates, rates)
    except Exception as exc:
        if run is None:
            raise
        # The numbers are in; report a failing close next to them instead of losing them.
        run.close_error = f"{type(exc).__name__}: {exc}"
    assert run is not None
    return run


def run_asyncrl(case: Case, window: Window, update_weights: bool) -> Run:
    import anyio

    threads = torch.get_num_threads()
    before = spawned_children()
    try:
        run = anyio.run(_asyncrl_once, case, window, update_weights)
    finally:
        # Whatever asyncrl did to the trainer's threads must not carry over into the next
        # run (TorchRL restores its own on shutdown).
        torch.set_num_threads(threads)
    run.leftover_pids = _wait_children_gone(before)
    return run


RUNNERS: dict[str, Callable[[Case, Window, bool], Run]] = {"asyncrl": run_asyncrl,
                                                           "torchrl": run_torchrl}


# -- report --------------------------------------------------------------------------------------
def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs and theirs == theirs else float("nan")


def _fmt(fmt: str, value: float) -> str:
    return "n/a" if value != value else fmt.format(value)


METRICS = (  # attribute, label, format, target ratio, higher is better
    ("fps", "frames/s", "{:,.0f}", 3.0, True),
    ("first_batch_s", "first batch (s)", "{:.2f}", 0.3, False),
    ("worker_rss_mb", "peak RSS / worker (MiB)", "{:.0f}", 1.0, False),
)


def _ratio_cell(ratio: float, target: float, higher: bool) -> str:
    """The ratio, in bold when it misses the target."""
    if ratio != ratio:
        return "n/a"
    ok = ratio >= target if higher else ratio <= target
    return f"{ratio:.2f}x" if ok else f"**{ratio:.2f}x**"


def markdown_table(results: dict[tuple[str, str], Result], cases: list[Case]) -> str:
    """One row per case; each metric as asyncrl, TorchRL, ratio (bold: target missed)."""
    head = ["env", "policy", "mode", "workers x envs"]
    for _, label, _, target, higher in METRICS:
        sign = ">=" if higher else "<="
        head += [f"{label} asyncrl", "TorchRL", f"ratio ({sign} {target:g}x)"]
    head.append("trainer threads (asyncrl / TorchRL)")
    lines = ["| " + " | ".join(head) + " |",
             "|" + "---|" * 4 + "---:|" * (3 * len(METRICS)) + ":---:|"]
    for case in cases:
        ours, theirs = results.get(("asyncrl", case.name)), results.get(("torchrl", case.name))
        cells = [case.env, case.policy, case.mode, case.layout]
        for attr, _, fmt, target, higher in METRICS:
            a = ours.median(attr) if ours else float("nan")
            t = theirs.median(attr) if theirs else float("nan")
            cells += [_fmt(fmt, a), _fmt(fmt, t), _ratio_cell(_ratio(a, t), target, higher)]
        threads = [_fmt("{:.0f}", r.median("trainer_threads")) if r else "n/a"
                   for r in (ours, theirs)]
        cells.append(" / ".join(threads))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment() -> str:
    versions = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for name in ("tensordict", "torchrl", "gymnasium", "zmq"):
        try:
            module = __import__(name)
            versions.append(f"{name} {getattr(module, '__version__', '?')}")
        except ImportError:
            versions.append(f"{name} missing")
    import multiprocessing as mp

    versions.append(f"TorchRL start method {mp.get_start_method(allow_none=True)}")
    return f"{os.cpu_count()} CPUs, {platform.machine()}, " + ", ".join(versions)


def _problems(run: Run) -> list[str]:
    problems = []
    if run.close_error:
        problems.append(f"closing the collector raised {run.close_error}")
    if run.leftover_pids:
        problems.append(f"worker processes {run.leftover_pids} still alive 10 s after close")
    return problems


# -- main ------------------------------------------------------------------------------------------
def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.collect",
                                description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 repeat, 1 window of 2 batches / 0.3 s, sync 2x1 only "
                        "unless --cases says otherwise")
    p.add_argument("--repeats", type=int, help="fresh collectors per case (default 1; "
                   "3 for numbers to publish)")
    p.add_argument("--windows", type=int, help="timed windows per repeat, back to back "
                   "after the first (warm-up) batch; a run's frames/s is their median "
                   "(default 3)")
    p.add_argument("--batches", type=int,
                   help="batches per timed window, at least (default 1)")
    p.add_argument("--min-seconds", type=float, help="a timed window lasts at least this "
                   "(default 0.5)")
    p.add_argument("--max-seconds", type=float, default=5.0,
                   help="... and at most this, once one batch came (default 5)")
    p.add_argument("--envs", help=f"comma-separated: {', '.join(ENVS)} (default: both; "
                   "CartPole-v1 when --cases has only the earlier names)")
    p.add_argument("--policies", help=f"comma-separated: {', '.join(POLICIES)} (or mlpN for "
                   "width N; default: all; random when --cases has only the earlier names)")
    p.add_argument("--cases", help=f"comma-separated layouts ({', '.join(LAYOUTS)}), "
                   "MODE-LAYOUT (sync-2x8), or the earlier names "
                   f"({', '.join(LEGACY_CASES)}); default {','.join(DEFAULT_LAYOUTS)}")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated: sync, async (for the cases given as layouts)")
    p.add_argument("--frames-per-batch", type=int, default=FRAMES_PER_BATCH)
    p.add_argument("--update-weights", action=argparse.BooleanOptionalAction, default=True,
                   help="send the policy's weights after every batch, as a trainer does")
    p.add_argument("--libraries", default="asyncrl,torchrl",
                   help="comma-separated: asyncrl, torchrl")
    p.add_argument("--torchrl-start-method", choices=("spawn", "fork", "forkserver"),
                   help="multiprocessing start method for TorchRL's workers (default: "
                        "TorchRL's own, spawn; asyncrl always spawns)")
    p.add_argument("--json", metavar="PATH", help="also write every run to PATH")
    args = p.parse_args(argv)
    defaults = (1, 1, 2, 0.3) if args.quick else (1, 3, 1, 0.5)
    for name, default in zip(("repeats", "windows", "batches", "min_seconds"), defaults,
                             strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.cases is None:
        args.cases = "sync-2x1" if args.quick else ",".join(DEFAULT_LAYOUTS)
    # The earlier benchmark's commands (--cases sync,async) keep measuring what they did:
    # the random policy on CartPole.
    legacy = all(c in LEGACY_CASES for c in _split(args.cases))
    if args.envs is None:
        args.envs = ENVS[0] if legacy else ",".join(ENVS)
    if args.policies is None:
        args.policies = "random" if legacy else ",".join(POLICIES)
    return args


def build_cases(args: argparse.Namespace) -> list[Case]:
    """Every (env, policy, mode, layout) asked for, in a stable order."""
    modes = _split(args.modes)
    if set(modes) - set(MODES):
        raise ValueError(f"unknown modes {sorted(set(modes) - set(MODES))}; expected "
                         f"{', '.join(MODES)}")
    pairs: list[tuple[str, str]] = []
    for item in _split(args.cases):
        if item in LEGACY_CASES:
            pairs.append(LEGACY_CASES[item])
        elif item in LAYOUTS:
            pairs += [(mode, item) for mode in modes]
        elif "-" in item and item.split("-", 1)[0] in MODES and item.split("-", 1)[1] in LAYOUTS:
            mode, layout = item.split("-", 1)
            pairs.append((mode, layout))
        else:
            raise ValueError(f"unknown case {item!r}; expected a layout ({', '.join(LAYOUTS)}), "
                             f"MODE-LAYOUT such as sync-2x8, or one of {', '.join(LEGACY_CASES)}")
    cases = []
    for env in _split(args.envs):
        for policy in _split(args.policies):
            make_policy(policy, env)  # a bad name fails now, not after minutes of runs
            for mode, layout in dict.fromkeys(pairs):
                workers, per_worker = LAYOUTS[layout]
                cases.append(Case(env, policy, mode == "sync", workers, per_worker,
                                  args.frames_per_batch))
    return cases


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m benchmarks.collect " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    try:
        cases = build_cases(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    libraries = _split(args.libraries)
    unknown = set(libraries) - set(RUNNERS)
    if unknown:
        print(f"unknown libraries {sorted(unknown)}; expected asyncrl and/or torchrl",
              file=sys.stderr)
        return 2
    if "torchrl" in libraries:
        # TorchRL picks its start method (spawn) when imported; import it before anything
        # fixes multiprocessing's default context, or it silently falls back to fork.
        import multiprocessing as mp

        import torchrl  # noqa: F401

        if args.torchrl_start_method:
            mp.set_start_method(args.torchrl_start_method, force=True)
    warnings.filterwarnings("ignore")
    window = Window(args.batches, args.min_seconds, args.max_seconds, args.windows)
    results: dict[tuple[str, str], Result] = {}
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    trainer_threads = torch.get_num_threads()
    for case in cases:
        for repeat in range(args.repeats):
            for library in libraries:  # interleaved, so drifts hit both alike
                result = results.setdefault((library, case.name), Result(library, case.name))
                if result.error is not None:
                    continue
                try:
                    run = RUNNERS[library](case, window, args.update_weights)
                except Exception as exc:
                    result.error = f"{type(exc).__name__}: {exc}"
                    print(f"{library:8} {case.name:32} #{repeat}: FAILED {result.error}",
                          file=sys.stderr, flush=True)
                    continue
                result.runs.append(run)
                print(f"{library:8} {case.name:32} #{repeat}: {run.fps:9,.0f} frames/s  "
                      f"first batch {run.first_batch_s:5.2f} s  worker RSS "
                      f"{', '.join(f'{m:.0f}' for m in run.worker_rss_mb)} MiB  "
                      f"batch {run.batch_shape}  trainer threads {run.trainer_threads}",
                      file=sys.stderr, flush=True)
                for problem in _problems(run):
                    print(f"{'':8} {'':32}     {problem}", file=sys.stderr, flush=True)
                gc.collect()
    weights = ("update_policy_weights after every batch" if args.update_weights
               else "no weight updates")
    print(f"\n`{command}`\n\n{environment()}; trainer torch threads at start "
          f"{trainer_threads}; {args.frames_per_batch} frames per batch; {weights}; "
          f"{args.repeats} repeats x {args.windows} windows of >= {args.batches} batches "
          f"and >= {args.min_seconds:g} s;"
          f" total {time.perf_counter() - started:.0f} s; 1-min load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print(markdown_table(results, cases))
    failed = [r for r in results.values() if r.error]
    for r in failed:
        print(f"\n{r.library} {r.case}: {r.error}")
    for r in results.values():
        problems = sorted({p for run in r.runs for p in _problems(run)})
        failed += [r] if problems else []
        for problem in problems:
            print(f"\n{r.library} {r.case}: {problem}")
    if args.json:
        by_name = {case.name: case for case in cases}
        with open(args.json, "w") as f:
            json.dump({"command": command, "environment": environment(),
                       "trainer_threads_at_start": trainer_threads,
                       "update_weights": args.update_weights,
                       "results": [{**asdict(r), **asdict(by_name[r.case]),
                                    "median_fps": r.median("fps"),
                                    "median_first_batch_s": r.median("first_batch_s")}
                                   for r in results.values()]}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
