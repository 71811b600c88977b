"""``asyncrl worker --role env`` (alias ``asyncrl env-worker``): a remote env host of an
AsyncBatchedCollector (central inference)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

import anyio

from .._observe.probes import ProbeServer, add_probe_options
from .._spawn.child import ending_error
from .._spawn.stop_signals import wait_stop_signal


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "env-worker",
        help="an alias of 'asyncrl worker --role env': step envs for an "
             "AsyncBatchedCollector (central inference) over the network",
        description="An alias of 'asyncrl worker --role env' (--envs is its "
                    "--envs-per-worker). "
                    "Join the AsyncBatchedCollector listening at --connect (its listen= and "
                    "remote_workers=) and step --envs envs for it: observations go to its "
                    "inference loop, actions come back, transitions go to its batches. The env "
                    "is a gym id or an import path resolved on this host: code never travels. "
                    "Exits 0 when the collector closes, 1 on an error or a refusal, 5 when no "
                    "welcome came within --join-timeout (as 'asyncrl worker').")
    p.add_argument("--connect", required=True, metavar="tcp://HOST:PORT",
                   help="the collector's endpoint (collector.endpoint)")
    p.add_argument("--env", required=True, metavar="ID_OR_IMPORT_PATH",
                   help="a gymnasium id (Pendulum-v1) or pkg.mod:factory")
    p.add_argument("--envs", type=int, default=1, metavar="N",
                   help="envs stepped by this process, sent as one request (default 1)")
    p.add_argument("--peer-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="seconds of silence after which the collector counts as gone")
    p.add_argument("--join-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the collector's welcome")
    p.add_argument("--keys", metavar="DIR", default=None,
                   help="CURVE keys (asyncrl keys generate): the collector's curve_keys=DIR")
    p.add_argument("--app-dir", default=".", metavar="DIR",
                   help="put DIR on sys.path to resolve --env (default: the current directory)")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--no-forward-logs", action="store_true",
                   help="do not send this process's log records to the collector (by default "
                        "they reach the trainer's 'asyncrl.worker' logger with the slot, host "
                        "and pid as fields; see docs/operations.md)")
    add_probe_options(p)


def run_env_worker_command(args: argparse.Namespace, command: str = "asyncrl env-worker") -> int:
    from .._errors import RefusedError
    from .._spawn.exit_codes import EXIT_JOIN_TIMEOUT
    from .remote_env_stepper import JoinTimeout, run_remote_env_worker

    logging.basicConfig(level=logging.WARNING, format=f"{command}: %(message)s")
    forwarder = stderr = None
    if not args.no_forward_logs:
        from .._worker.log_forward import forward_logs

        # Records go to the collector once welcomed; those never sent, to stderr at exit.
        forwarder, stderr = forward_logs(logging.getLogger().handlers[0])
    if args.envs < 1 or not args.peer_timeout > 0 or not args.join_timeout > 0:
        print(f"{command}: --envs must be >= 1 and the timeouts > 0, got {args.envs}, "
              f"{args.peer_timeout} and {args.join_timeout}", file=sys.stderr)
        return 2
    from transports import check_resolves, parse_endpoint

    try:  # a name that does not resolve is a typo, not a trainer still starting
        check_resolves(parse_endpoint(args.connect, argument="--connect"))
    except OSError as exc:
        print(f"{command}: --connect: {exc}", file=sys.stderr)
        return 2
    app_dir = os.path.abspath(args.app_dir)
    if app_dir not in sys.path:
        sys.path.insert(0, app_dir)

    admitted = False

    def admission(value: bool) -> None:
        nonlocal admitted
        admitted = value

    async def main() -> int:
        code = 0  # stopped by a signal
        server = None
        if args.probe_port is not None:  # liveness, and readiness: welcomed by the collector
            server = ProbeServer(lambda: {"ready": admitted}, host=args.probe_host,
                                 port=args.probe_port)
            await server.bind()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, tg.cancel_scope)
            if server is not None:
                await tg.start(server.serve)
            code = await run_remote_env_worker(
                args.connect, args.env, envs=args.envs, peer_timeout=args.peer_timeout,
                join_timeout=args.join_timeout, curve_keys=args.keys, on_admission=admission,
                log_forwarder=forwarder)
            tg.cancel_scope.cancel()
        return code

    try:
        try:
            code = anyio.run(main, backend=args.backend)
        except BaseExceptionGroup as group:  # the task group's: the error that ended it
            raise ending_error(group) from None
        finally:
            if forwarder is not None and stderr is not None:
                forwarder.write_undelivered(stderr)
    except JoinTimeout as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return EXIT_JOIN_TIMEOUT
    except RefusedError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"{command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    from transports import shutdown

    shutdown()
    return code if isinstance(code, int) else 0


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    # SIGTERM and Ctrl-C stop stepping; the link says goodbye on its way out.
    await wait_stop_signal()
    scope.cancel()
