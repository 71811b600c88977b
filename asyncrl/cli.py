"""``asyncrl`` command line: ``asyncrl worker``, ``asyncrl bench``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shlex
import sys
from typing import Any

BENCHMARKS = ("codec", "channels", "weights", "collect", "relay", "scaling", "profile_worker",
              "rollout_loop")


def _worker_parser(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="run worker processes that join a coordinator over ZeroMQ",
        description="Run K worker processes on this host that join the coordinator at "
                    "--connect. Env and policy are import paths resolved on this host: code "
                    "never travels over the network.",
    )
    p.add_argument("--connect", required=True, metavar="tcp://HOST:PORT",
                   help="the coordinator's address (MultiCollector(listen=...))")
    p.add_argument("--env", required=True, metavar="ID_OR_IMPORT_PATH",
                   help="a gymnasium id (CartPole-v1) or 'pkg.mod:factory'")
    p.add_argument("--policy", metavar="pkg.mod:factory", default=None,
                   help="import path of a function returning the policy (default: random)")
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="where each worker's policy runs on this host ('cpu', 'cuda', "
                        "'cuda:1'; default: where the policy factory put it); checked here "
                        "at start: a device this host lacks is an error, never a fallback")
    p.add_argument("--envs-per-worker", type=int, default=1, metavar="N")
    p.add_argument("--workers", type=int, default=1, metavar="K",
                   help="worker processes to run on this host")
    p.add_argument("--threads", type=int, default=1, metavar="T",
                   help="torch (and OpenMP/MKL) threads per worker process (default 1, as "
                        "TorchRL's num_sub_threads: K workers on K cores do not oversubscribe)")
    p.add_argument("--peer-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="exit when the coordinator is silent this long")
    p.add_argument("--keys", metavar="DIR", default=None,
                   help="CURVE keys made by 'asyncrl keys generate DIR' (needs worker.key_secret "
                        "and coordinator.key)")
    p.add_argument("--reconnect", action="store_true",
                   help="when the coordinator goes silent, wait for it (or a restarted one) "
                        "and join again, instead of exiting")
    p.add_argument("--no-relay", action="store_true",
                   help="with --workers > 1, let each worker receive its own copy of every "
                        "weight update instead of one copy per host through a local relay")
    p.add_argument("--app-dir", default=".", metavar="DIR",
                   help="put DIR first on the import path for --env and --policy "
                        "(default: the current directory, as 'python -m' does)")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")


def _keys_parser(sub: Any) -> None:
    p = sub.add_parser("keys", help="CURVE keys for encrypted, authenticated collection")
    keys_sub = p.add_subparsers(dest="keys_command", required=True)
    g = keys_sub.add_parser(
        "generate", help="write coordinator and worker key pairs to DIR",
        description="Write DIR/coordinator.key(_secret), DIR/worker.key(_secret) and "
                    "DIR/authorized/ (public keys the coordinator accepts). Give the "
                    "coordinator the whole DIR (MultiCollector(curve_keys=DIR)); give worker "
                    "hosts worker.key_secret and coordinator.key (asyncrl worker --keys DIR).")
    g.add_argument("directory", metavar="DIR")


def _bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="run a benchmark from a source checkout (python -m benchmarks.NAME)",
        description="Run benchmarks/NAME.py of asyncrl's source tree (the benchmarks are not "
                    "installed with the package): from the checkout that holds the running "
                    "asyncrl, else from the current directory.")
    p.add_argument("name", choices=BENCHMARKS)
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _worker_parser(sub)
    _keys_parser(sub)
    _bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return run_benchmark(args.name, args.args)
    if args.command == "keys":
        return generate_keys_command(args.directory)
    return run_workers(args)


def run_benchmark(name: str, argv: list[str], roots: list[str] | None = None) -> int:
    """Run ``benchmarks.NAME.main(argv)`` from a source checkout; 2 if there is none."""
    if roots is None:
        # The checkout of the running asyncrl first (an editable install or PYTHONPATH: the
        # benchmarks then measure the code beside them), then the current directory.
        roots = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()]
    root = next((r for r in roots if _has_benchmark(r, name)), None)
    if root is None:
        command = shlex.join(["python", "-m", f"benchmarks.{name}", *argv])
        print(f"asyncrl bench: no benchmarks/{name}.py here: the benchmarks ship with asyncrl's "
              "source tree, not with the installed package. From a clone of the repository, "
              f"run:\n    {command}\n(or 'asyncrl bench {name}' in the clone's root)",
              file=sys.stderr)
        return 2
    if root not in sys.path:
        sys.path.insert(0, root)  # spawned processes inherit it, as with 'python -m'
    module = importlib.import_module(f"benchmarks.{name}")
    return int(module.main(argv) or 0)


def _has_benchmark(root: str, name: str) -> bool:
    # An asyncrl checkout, not some other project's top-level "benchmarks" package.
    return (os.path.isfile(os.path.join(root, "benchmarks", "__init__.py"))
            and os.path.isfile(os.path.join(root, "benchmarks", f"{name}.py"))
            and os.path.isdir(os.path.join(root, "asyncrl")))


def generate_keys_command(directory: str) -> int:
    from transports import generate_keys

    try:
        root = generate_keys(directory)
    except (OSError, ValueError) as exc:
        print(f"asyncrl keys: {exc}", file=sys.stderr)
        return 2
    print(f"wrote CURVE keys to {root}: coordinator.key(_secret), worker.key(_secret), "
          "authorized/")
    return 0


def run_workers(args: argparse.Namespace) -> int:
    from ._worker_spec import WorkerSpec, host_rollout_options, resolve_import_path

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.workers < 1 or args.envs_per_worker < 1 or args.threads < 1:
        print("asyncrl worker: --workers, --envs-per-worker and --threads must be >= 1, got "
              f"{args.workers}, {args.envs_per_worker} and {args.threads}", file=sys.stderr)
        return 2
    if not args.peer_timeout > 0:
        print(f"asyncrl worker: --peer-timeout must be > 0, got {args.peer_timeout}",
              file=sys.stderr)
        return 2
    app_dir = os.path.abspath(args.app_dir)
    if app_dir not in sys.path:
        sys.path.insert(0, app_dir)  # spawned workers inherit it
    try:
        if ":" in args.env:
            resolve_import_path(args.env)
        if args.policy:
            resolve_import_path(args.policy)
        if args.keys:
            from transports import CurveClient

            CurveClient.from_dir(args.keys)
    except Exception as exc:
        print(f"asyncrl worker: {exc}", file=sys.stderr)
        return 2
    try:
        rollout = host_rollout_options(args.device)
    except ValueError as exc:
        print(f"asyncrl worker: {exc}", file=sys.stderr)
        return 2
    spec = WorkerSpec(create_env_fn=args.env, envs_per_worker=args.envs_per_worker,
                      policy_factory=args.policy, torch_threads=args.threads, rollout=rollout)
    from ._host import HostWorkers

    host = HostWorkers(args.connect, spec, workers=args.workers, relay=not args.no_relay,
                       peer_timeout=args.peer_timeout, reconnect=args.reconnect,
                       curve_keys=args.keys, backend=args.backend)
    return host.run()


if __name__ == "__main__":
    sys.exit(main())
