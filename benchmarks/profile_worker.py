"""Where a worker's time per env step goes: env, policy, rollout writes, copies, encoding.

    python -m benchmarks.profile_worker                      # Pendulum-v1, mlp256, 1 env
    python -m benchmarks.profile_worker --envs-per-worker 8 --policy mlp64
    python -m benchmarks.profile_worker --env CartPole-v1 --no-thread --top 25

It runs, in this process, what a worker does for each credit
(:class:`asyncrl._rollout.probe.RolloutProbe`, the worker's own code): ``Rollout.collect()`` on
a pool of ``--envs-per-worker`` envs with the benchmark's MLP policy
(``benchmarks.collect.make_policy``: the same module the collection benchmark gives both
libraries), ``.clone()`` of the batch (the message's own copy), then the encoding of the
batch message (what ``Link.send`` hands ZeroMQ). As in a worker, torch runs with
``--threads`` intra-op threads (the worker's default, 1) and the rollout runs in a
separate thread (``anyio.to_thread`` in the worker; ``--no-thread`` runs it on the main
thread).

Two views, both per env step (a step is one ``pool.step`` of all envs of the worker):

1. **direct timing**, no profiler: the whole batch, then the env alone (``step_inplace``
   with the last actions, resets where done) and the policy alone (on the rollout's step
   TensorDict), each timed over as many steps as a batch has; "rollout bookkeeping" is
   what the batch took beyond the two (buffer writes, resets, hooks), "clone" and
   "encode" are timed per batch and divided by its steps;
2. **cProfile**: self time of every function over ``--batches`` batches, summed by
   where the code lives (env, policy, tensordict, rollout loop, codec, numpy, other),
   and the top functions. The profiler's own cost inflates Python-heavy parts (each call
   pays it), so trust view 1 for the split and view 2 for *which* functions.
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from asyncrl._rollout.probe import RolloutProbe
from benchmarks import ROOT
from benchmarks.collect import make_policy

T = TypeVar("T")
#: ``(label, needles)`` rules that sort cProfile's self time (see :func:`categorize`).
Categories = tuple[tuple[str, tuple[str, ...]], ...]

#: cProfile self time is charged to a category by the first rule that matches the
#: function's file (or, for built-ins, its name). Order matters: specific first.
CATEGORIES: Categories = (
    ("env (gymnasium + EnvPool)",
     ("gymnasium/", "asyncrl/_rollout/envs.py", "asyncrl/_rollout/env_specs.py")),
    # tensordict 0.14's TensorDictModule writes each output through TensorDict.from_any,
    # which looks for pandas on disk (importlib.util.find_spec) at every call.
    ("TensorDictModule output: find_spec('pandas')", ("importlib", "posix.stat",
                                                      "_distutils_hack", "_finder.py")),
    ("policy: torch ops", ("torch._C._nn", "torch.tanh", "argmax", "method mul",
                           "built-in method torch.")),
    ("policy: nn.Module / TensorDictModule Python", (
        "torch/nn/", "tensordict/nn/", "asyncrl/_rollout/policies.py", "benchmarks/collect.py",
        "torch/utils/_contextlib", "torch/autograd/grad_mode", "torch/compiler",
        "torch/_dynamo")),
    ("encode (transports codec)", ("transports/", "msgpack")),
    ("tensordict (clone, get/set, batch view)", ("tensordict/", "method clone",
                                                 "method copy_", "method set_")),
    ("rollout loop (asyncrl/_rollout/loop.py)", ("asyncrl/_rollout/loop.py",)),
    ("numpy (buffer writes, env maths)", ("numpy/", "numpy.", "method 'any'", "copyto",
                                          "logical_or", "built-in method numpy")),
)
OTHER = "other (torch dispatch, Python built-ins)"


def categorize(filename: str, funcname: str, categories: Categories = CATEGORIES,
               other: str = OTHER) -> str:
    """The label of the first of ``categories`` whose needle is in ``file:name``, else
    ``other``."""
    where = f"{filename}:{funcname}"
    return next((label for label, needles in categories if any(n in where for n in needles)),
                other)


def in_thread(fn: Callable[[], T], use_thread: bool) -> T:
    """Run ``fn`` in a fresh thread (as ``anyio.to_thread`` does in a worker) or here."""
    if not use_thread:
        return fn()
    out: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # re-raised on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="rollout")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


@dataclass
class Views:
    """What :func:`measure_views` took over its batches."""

    samples: list[dict[str, float]]  # each batch's parts, timed apart (view 1)
    wall: float  # seconds per credit, no profiler
    cpu: float  # this thread's CPU seconds per credit, no profiler
    stats: pstats.Stats  # cProfile over as many credits (view 2)


def measure_views(credit: Callable[[], object], time_parts: Callable[[], dict[str, float]],
                  batches: int, *, threads: int | None, use_thread: bool = True) -> Views:
    """Both views of a worker's credits: ``batches`` samples of ``time_parts()``, then
    ``batches`` credits timed whole, then ``batches`` credits under cProfile; in a fresh
    thread as in a worker (``use_thread``), with ``threads`` torch threads set in it
    (OpenMP keeps the count per thread; None: as they are)."""

    def run() -> Views:
        if threads is not None:
            torch.set_num_threads(threads)
        credit()  # warm-up: first calls pay for lazy initialisation
        samples = [time_parts() for _ in range(batches)]
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(batches):
            credit()
        wall = (time.perf_counter() - t0) / batches
        cpu = (time.thread_time() - c0) / batches
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(batches):
            credit()
        profiler.disable()
        return Views(samples, wall, cpu, pstats.Stats(profiler))

    return in_thread(run, use_thread)


class Profiler:
    """The worker's per-credit work on one rollout, timed piece by piece."""

    def __init__(self, env: str, policy: str, envs_per_worker: int,
                 frames_per_batch: int) -> None:
        self.probe = RolloutProbe(env, make_policy(policy, env), envs_per_worker=envs_per_worker,
                                  frames_per_batch=frames_per_batch)
        self.steps = self.probe.steps

    def credit(self) -> list[Any]:
        """One credit as a worker serves it: collect, copy, encode the batch message."""
        return self.probe.credit()

    def time_parts(self) -> dict[str, float]:
        """Seconds per batch of each part, measured apart, no profiler."""
        t0 = time.perf_counter()
        batch = self.probe.collect()
        t1 = time.perf_counter()
        frames = batch.clone()
        t2 = time.perf_counter()
        self.probe.encode(frames)
        t3 = time.perf_counter()
        return {"batch": t1 - t0, "clone": t2 - t1, "encode": t3 - t2,
                "env": self.probe.time_env(), "policy": self.probe.time_policy()}

    def close(self) -> None:
        self.probe.close()


def direct_table(samples: list[dict[str, float]], steps: int) -> list[str]:
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    bookkeeping = max(0.0, med["batch"] - med["env"] - med["policy"])
    rows = [("env step (EnvPool.step_inplace + resets)", med["env"]),
            ("policy forward (TensorDictModule on the step td)", med["policy"]),
            ("rollout bookkeeping (buffer writes, hooks; batch - env - policy)", bookkeeping),
            ("clone of the batch (the message's own copy)", med["clone"]),
            ("encode the batch message (header + frames for ZeroMQ)", med["encode"])]
    return parts_table(rows, med["batch"] + med["clone"] + med["encode"], steps)


def parts_table(rows: list[tuple[str, float]], total: float, units: int,
                unit: str = "µs / step") -> list[str]:
    """Markdown rows of view 1: each part's share of a credit's ``total`` seconds and its
    time per unit (``units`` of them in a batch)."""
    lines = [f"| part | share | {unit} |", "|---|---:|---:|"]
    lines += [f"| {name} | {100 * sec / total:.1f}% | {1e6 * sec / units:.1f} |"
              for name, sec in rows]
    lines.append(f"| **total per credit** | 100% | **{1e6 * total / units:.1f}** |")
    return lines


def profile_table(stats: pstats.Stats, units: int, top: int, *, per: str = "step",
                  categories: Categories = CATEGORIES, other: str = OTHER) -> list[str]:
    """cProfile's self time summed by ``categories``, then the ``top`` functions, each
    per ``per`` (``units`` of them in ``stats``): markdown rows."""
    by_cat: dict[str, float] = {}
    funcs = []
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, funcname), (_cc, ncalls, tottime, _ct, _callers) in raw.items():
        cat = categorize(filename, funcname, categories, other)
        by_cat[cat] = by_cat.get(cat, 0.0) + tottime
        funcs.append((tottime, ncalls, _short(filename), funcname, cat))
    total = sum(by_cat.values()) or 1.0
    lines = [f"| where (cProfile self time) | share | µs / {per} |", "|---|---:|---:|"]
    for cat, sec in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {cat} | {100 * sec / total:.1f}% | {1e6 * sec / units:.1f} |")
    lines += ["", f"Top {top} functions by self time:", "",
              f"| function | calls / {per} | share | µs / {per} | category |",
              "|---|---:|---:|---:|---|"]
    for tottime, ncalls, filename, funcname, cat in sorted(funcs, reverse=True)[:top]:
        lines.append(f"| `{filename}:{funcname}` | {ncalls / units:.2f} | "
                     f"{100 * tottime / total:.1f}% | {1e6 * tottime / units:.2f} | "
                     f"{cat.split(' (')[0]} |")
    return lines


def _short(filename: str) -> str:
    if filename.startswith(ROOT + "/"):  # asyncrl/_rollout/loop.py, benchmarks/collect.py
        return filename[len(ROOT) + 1:]
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    return filename


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_worker",
                                description=(__doc__ or "").split("\n")[0])
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--policy", default="mlp256", help="random, mlp64, mlp256 (mlpN)")
    p.add_argument("--envs-per-worker", type=int, default=1)
    p.add_argument("--frames-per-batch", type=int, default=512,
                   help="one worker's share (512: sync 2x1 at 1,024 frames per batch)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (a worker's default is 1)")
    p.add_argument("--thread", action=argparse.BooleanOptionalAction, default=True,
                   help="run the rollout in a separate thread, as a worker does")
    p.add_argument("--threads-in-rollout-thread", action=argparse.BooleanOptionalAction,
                   default=True,
                   help="set --threads in the rollout thread too, as the worker does since "
                        "issue 11 (OpenMP's count is per thread; --no-threads-in-rollout-thread "
                        "reproduces the worker before it, which set it in its main thread only)")
    add_view_arguments(p)
    return p.parse_args(argv)


def add_view_arguments(p: argparse.ArgumentParser) -> None:
    """``--batches`` and ``--top``: how much the two views measure and list."""
    p.add_argument("--batches", type=int, default=10, help="batches per view")
    p.add_argument("--top", type=int, default=15, help="functions listed from cProfile")


def command_line(module: str, argv: list[str] | None) -> str:
    """The command that ran ``benchmarks.<module>`` (printed with its numbers)."""
    return f"python -m benchmarks.{module} " + shlex.join(sys.argv[1:] if argv is None else argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = command_line("profile_worker", argv)
    torch.set_num_threads(args.threads)
    prof = Profiler(args.env, args.policy, args.envs_per_worker, args.frames_per_batch)
    try:
        views = measure_views(prof.credit, prof.time_parts, args.batches,
                              threads=args.threads if args.threads_in_rollout_thread else None,
                              use_thread=args.thread)
    finally:
        prof.close()
    steps = prof.steps
    print(f"\n`{command}`\n")
    print(f"{args.env}, {args.policy}, {args.envs_per_worker} env(s) per worker, "
          f"{args.frames_per_batch} frames per batch ({steps} steps), torch threads "
          f"{torch.get_num_threads()} (set in the main thread"
          f"{' and the rollout thread' if args.threads_in_rollout_thread else ''}), rollout in "
          f"{'a thread' if args.thread else 'the main thread'}"
          f"; python {platform.python_version()}, torch {torch.__version__}; "
          f"medians of {args.batches} batches")
    print(f"\nOne credit (collect + clone + encode), no profiler: "
          f"{1e6 * views.wall / steps:.1f} µs per step, "
          f"{args.frames_per_batch / views.wall:,.0f} frames/s for this worker alone\n")
    print("\n".join(direct_table(views.samples, steps)))
    print(f"\ncProfile over {args.batches} credits (the profiler slows Python-heavy code):\n")
    print("\n".join(profile_table(views.stats, steps * args.batches, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
