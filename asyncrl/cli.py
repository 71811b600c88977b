"""``asyncrl`` command line: ``asyncrl worker``, ``asyncrl keys``, ``asyncrl bench``.

``asyncrl worker`` serves both roles a remote host can have: ``--role rollout`` (the
default: workers of a MultiCollector) and ``--role env`` (an env worker of an
AsyncBatchedCollector); ``asyncrl env-worker`` is the latter's older name, kept as an alias.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from ._cli_env import apply_environment, check_environment, subparsers, with_long_option
from ._inference.cli import add_parser as add_env_worker_parser
from ._inference.cli import run_env_worker_command
from ._observe.probes import add_probe_options
from ._spawn import logs as _logs

#: What ``asyncrl --help`` says (plain text: argparse prints it as is).
DESCRIPTION = ("asyncrl: async-first, ZeroMQ-based experience collection for reinforcement "
               "learning. Run workers that join a trainer's collector over the network, "
               "make CURVE keys for them, or run a benchmark from a source checkout. Every "
               "option can also come from the environment: --peer-timeout from "
               "ASYNCRL_PEER_TIMEOUT (each option's help names its variable; the command "
               "line wins; flags take 1/0, true/false, yes/no, on/off).")

#: The worker's exit codes (asyncrl._spawn.exit_codes' EXIT_* and this module's argument errors).
WORKER_EXIT_CODES = """exit codes:
  0  closed by the coordinator, or stopped by SIGTERM / SIGINT (Ctrl-C)
  1  an env or policy error (reported to the coordinator first)
  2  bad arguments (an import path that does not resolve, bad keys, a value < 1, a
     malformed --connect or a host name there that does not resolve, --workers above
     --max-workers)
  3  the coordinator is gone: it closed without telling this worker, it never answered
     (--peer-timeout), its connection stayed down longer than --give-up-after, or it was
     restarted (a new instance) and no --reconnect
  4  the coordinator refused this worker (see its log: specs, keys), revoked this
     host's CURVE key while it ran, or the run stayed full (remote_workers) for
     --join-timeout
  5  no welcome within --join-timeout: something accepts connections there but
     does not answer as an asyncrl collector"""

EXIT_CODES = """exit codes:
  0  success
  2  bad arguments (argparse's usage errors too)
  asyncrl worker: see 'asyncrl worker --help'"""

KEYS_EXIT_CODES = """exit codes:
  0  done (keys written, revoked or listed)
  2  bad arguments, or DIR cannot be written or read (keys exist, a name is taken, an
     unknown name, permissions)"""

BENCH_EXIT_CODES = """exit codes:
  the benchmark's own (0: it ran)
  2  bad arguments, or no benchmarks/NAME.py in a source checkout here"""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help; prose wrapped, the exit-code tables as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:  # a table: its lines are already laid out
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("asyncrl")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0.0.0+unknown"


#: What ``asyncrl worker --role`` runs (the hello's ``role``).
ROLES = ("rollout", "env")
#: ``asyncrl worker`` options an env worker (``--role env``) has no use for, with their
#: defaults: given otherwise, they are refused naming the role (never ignored).
ROLLOUT_ONLY: dict[str, Any] = {
    "policy": None, "device": None, "info_key": None, "workers": 1, "threads": 1,
    "reconnect": False, "give_up_after": 120.0, "no_relay": False, "log_file": None,
}

#: Default bound of ``--workers`` (``--max-workers``): a typo such as 100000000 is an
#: error at start, not a host that builds worker identities until it is killed.
MAX_WORKERS = 1024


def address(text: str) -> str:
    """``--connect``'s type: a ZeroMQ address to connect to, checked (a usage error if not)."""
    from transports import parse_endpoint

    try:
        parse_endpoint(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _check_addresses(parser: argparse.ArgumentParser) -> None:
    """Every command's ``--connect`` is an address (same name, same meaning: see _cli_env)."""
    for command in subparsers(parser).values():
        connect = with_long_option(command, "--connect")
        if connect is not None:
            connect.type = address


BENCHMARKS = ("codec", "channels", "weights", "collect", "relay", "scaling", "profile_worker",
              "rollout_loop")


def info_keys_of(flags: list[str] | None) -> list[tuple[str, ...]] | None:
    """``--info-key`` values as info_keys paths: ``stats.x`` is ``("stats", "x")``.

    >>> info_keys_of(["episode", "stats.x"])
    [('episode',), ('stats', 'x')]
    """
    return None if not flags else [tuple(flag.split(".")) for flag in flags]


def _worker_parser(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="run worker processes that join a coordinator over ZeroMQ",
        description="Run K worker processes on this host that join the coordinator at "
                    "--connect. Env and policy are import paths resolved on this host: code "
                    "never travels over the network. SIGTERM (docker stop, systemd) and "
                    "Ctrl-C stop them cleanly. With --role env, one env worker of an "
                    "AsyncBatchedCollector (central inference) instead: it steps "
                    "--envs-per-worker envs and the trainer's policy acts for them (no "
                    "--policy, --device, --info-key, --threads, --workers, --reconnect, "
                    "--give-up-after, --no-relay or --log-file there). Both roles say the "
                    "same hello; a trainer of the other kind refuses it naming the role.",
        epilog=WORKER_EXIT_CODES, formatter_class=_HelpFormatter,
    )
    p.add_argument("--connect", required=True, metavar="tcp://HOST:PORT",
                   default=argparse.SUPPRESS,
                   help="the coordinator's address (MultiCollector(listen=...)); required")
    p.add_argument("--env", required=True, metavar="ID_OR_IMPORT_PATH",
                   default=argparse.SUPPRESS,
                   help="a gymnasium id (CartPole-v1) or 'pkg.mod:factory'; required")
    p.add_argument("--role", choices=ROLES, default="rollout",
                   help="'rollout': workers of a MultiSyncCollector / MultiAsyncCollector, "
                        "each with its own copy of the policy; 'env': an env worker of an "
                        "AsyncBatchedCollector (central inference: listen= and "
                        "remote_workers=), as 'asyncrl env-worker' runs it")
    p.add_argument("--policy", metavar="pkg.mod:factory", default=None,
                   help="import path of a function returning the policy; without it, "
                        "random actions")
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="where each worker's policy runs on this host ('cpu', 'cuda', "
                        "'cuda:1'; default: where the policy factory put it); checked here "
                        "at start: a device this host lacks is an error, never a fallback")
    p.add_argument("--envs-per-worker", type=int, default=1, metavar="N",
                   help="envs each worker steps as one batch (a vector env)")
    p.add_argument("--info-key", action="append", default=None, metavar="KEY",
                   help="an env info entry each batch carries (repeat it per entry; "
                        "'episode' for RecordEpisodeStatistics; a nested entry as "
                        "'stats.x'). Not needed: the trainer's info_keys, as all its "
                        "rollout options, reach this host in its welcome; given, it must "
                        "equal the trainer's (else the host is refused naming both)")
    p.add_argument("--workers", type=int, default=1, metavar="K",
                   help="worker processes to run on this host (at most --max-workers)")
    p.add_argument("--max-workers", type=int, default=MAX_WORKERS, metavar="K",
                   help="the most --workers this host accepts: a larger count is an error "
                        "at start (a typo would otherwise fork until memory runs out)")
    p.add_argument("--threads", type=int, default=1, metavar="T",
                   help="torch (and OpenMP/MKL) threads per worker process (as TorchRL's "
                        "num_sub_threads: K workers on K cores do not oversubscribe)")
    p.add_argument("--peer-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="exit when the coordinator is silent this long")
    p.add_argument("--join-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long each worker waits to be welcomed: a run that is full "
                        "(remote_workers) is asked again with a backoff until a place frees, "
                        "a silent listener is given up on (exit code 5)")
    p.add_argument("--keys", metavar="DIR", default=None,
                   help="CURVE keys: a folder made by 'asyncrl keys add-host DIR NAME' "
                        "(DIR/hosts/NAME) or 'asyncrl keys generate DIR' (needs worker.key_secret "
                        "and coordinator.key); without it, ASYNCRL_CURVE_SECRET_KEY(_FILE) and "
                        "ASYNCRL_CURVE_SERVER_KEY(_FILE) if set (see docs/security.md)")
    p.add_argument("--reconnect", action="store_true",
                   help="when the coordinator goes silent, wait for it (or a restarted one) "
                        "for up to an hour and join again, instead of exiting; when a trainer "
                        "stops before its run is over (SIGTERM, a rollout restart), wait up to "
                        "--give-up-after for the next one; a finished run sends hosts home")
    p.add_argument("--give-up-after", type=float, default=120.0, metavar="SECONDS",
                   help="without --reconnect: a worker that was admitted and lost its "
                        "coordinator's connection (a cut link) waits this long for that same "
                        "coordinator to answer again and joins again; then it exits (code 3); "
                        "0: exit at once. With --reconnect: how long to wait for the next "
                        "trainer after one stopped before its run was over (then code 3)")
    p.add_argument("--no-relay", action="store_true",
                   help="with --workers > 1, let each worker receive its own copy of every "
                        "weight update instead of one copy per host through a local relay")
    p.add_argument("--app-dir", default=".", metavar="DIR",
                   help="put DIR first on the import path for --env and --policy "
                        "('.': the current directory, as 'python -m' does)")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio",
                   help="the anyio backend each worker's event loop runs on")
    p.add_argument("--log-level", choices=_logs.LEVELS, default="INFO", type=str.upper,
                   help="log level of this host and its workers (asyncrl and transports "
                        "loggers; other libraries log warnings and up)")
    p.add_argument("--log-file", metavar="PATH", default=None,
                   help="also append this host's and its workers' log lines to PATH "
                        "(besides stderr)")
    p.add_argument("--no-forward-logs", action="store_true",
                   help="do not send the workers' log records to the trainer (by default "
                        "they reach its 'asyncrl.worker' logger with the worker, host and pid "
                        "as fields; see docs/operations.md)")
    add_probe_options(p)


def _keys_parser(sub: Any) -> None:
    p = sub.add_parser("keys", help="CURVE keys for encrypted, authenticated collection",
                       description="Make CURVE keys (ZeroMQ's encryption and "
                                   "authentication) for a collector and its worker hosts.",
                       epilog=KEYS_EXIT_CODES, formatter_class=_HelpFormatter)
    keys_sub = p.add_subparsers(dest="keys_command", required=True)
    g = keys_sub.add_parser(
        "generate", help="write coordinator and worker key pairs to DIR",
        description="Write DIR/coordinator.key(_secret), DIR/worker.key(_secret) and "
                    "DIR/authorized/ (public keys the coordinator accepts). Give the "
                    "coordinator the whole DIR (MultiCollector(curve_keys=DIR)); give worker "
                    "hosts worker.key_secret and coordinator.key (asyncrl worker --keys DIR).",
        epilog=KEYS_EXIT_CODES, formatter_class=_HelpFormatter)
    g.add_argument("directory", metavar="DIR", help="where to write the keys (made if missing)")
    a = keys_sub.add_parser(
        "add-host", help="make a key pair of its own for one worker host, and authorize it",
        description="Write DIR/hosts/NAME/ (the host's worker.key(_secret) and coordinator.key: "
                    "copy that folder to host NAME and run 'asyncrl worker --keys FOLDER') and "
                    "authorize its public key (DIR/authorized/NAME.key). A running collector "
                    "accepts it within a second or two, without a restart.",
        epilog=KEYS_EXIT_CODES, formatter_class=_HelpFormatter)
    a.add_argument("directory", metavar="DIR", help="a directory made by 'asyncrl keys generate'")
    a.add_argument("name", metavar="NAME", help="the host's name (letters, digits, . _ -)")
    r = keys_sub.add_parser(
        "revoke", help="revoke a host's key: its workers are disconnected and refused",
        description="Move DIR/authorized/NAME.key to DIR/revoked/ and delete the host's secret "
                    "key in DIR/hosts/NAME. A running collector disconnects the host's workers "
                    "within a second or two and refuses the key from then on. 'worker' revokes "
                    "the pair shared by hosts without a key of their own.",
        epilog=KEYS_EXIT_CODES, formatter_class=_HelpFormatter)
    r.add_argument("directory", metavar="DIR", help="a directory made by 'asyncrl keys generate'")
    r.add_argument("name", metavar="NAME", help="the host to revoke (see 'asyncrl keys list')")
    lst = keys_sub.add_parser(
        "list", help="list the public keys of DIR: name, state, fingerprint",
        description="One line per public key in DIR/authorized/ and DIR/revoked/: its name, "
                    "whether it is authorized or revoked, and the first 8 characters of the key "
                    "(as the collector's log lines show them).",
        epilog=KEYS_EXIT_CODES, formatter_class=_HelpFormatter)
    lst.add_argument("directory", metavar="DIR", help="a directory made by 'asyncrl keys generate'")


def _bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="run a benchmark from a source checkout (python -m benchmarks.NAME)",
        description="Run benchmarks/NAME.py of asyncrl's source tree (the benchmarks are not "
                    "installed with the package): from the checkout that holds the running "
                    "asyncrl, else from the current directory.",
        epilog=BENCH_EXIT_CODES, formatter_class=_HelpFormatter)
    p.add_argument("name", choices=BENCHMARKS, help="the benchmark: %(choices)s")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The ``asyncrl`` parser; with ``environ``, its ``ASYNCRL_*`` variables are the defaults."""
    parser = argparse.ArgumentParser(prog="asyncrl", description=DESCRIPTION,
                                     epilog=EXIT_CODES, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands")
    _worker_parser(sub)
    add_env_worker_parser(sub)
    _keys_parser(sub)
    _bench_parser(sub)
    _check_addresses(parser)
    apply_environment(parser, environ)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(os.environ)
    args = parser.parse_args(argv)
    check_environment(parser, args)
    if args.command == "bench":
        return run_benchmark(args.name, args.args)
    if args.command == "keys":
        return keys_command(args)
    if args.command == "env-worker":
        return run_env_worker_command(args)
    if args.role == "env":
        return _run_env_role(args)
    return run_workers(args)


def _run_env_role(args: argparse.Namespace) -> int:
    """``asyncrl worker --role env``: one env worker of an AsyncBatchedCollector."""
    given = [f"--{name.replace('_', '-')}" for name, default in ROLLOUT_ONLY.items()
             if getattr(args, name) != default]
    if given:
        print(f"asyncrl worker: {', '.join(given)} cannot apply to --role env: an env worker "
              "of central inference steps its envs only (the trainer's policy acts for them, "
              "on the trainer's device); drop them, or join a MultiSyncCollector / "
              "MultiAsyncCollector with --role rollout", file=sys.stderr)
        return 2
    args.envs = args.envs_per_worker  # the envs this env worker steps, as one request
    return run_env_worker_command(args, command="asyncrl worker --role env")


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


def keys_command(args: argparse.Namespace) -> int:
    """``asyncrl keys generate | add-host | revoke | list``."""
    import transports

    try:
        if args.keys_command == "generate":
            root = transports.generate_keys(args.directory)
            print(f"wrote CURVE keys to {root}: coordinator.key(_secret), worker.key(_secret), "
                  "authorized/")
        elif args.keys_command == "add-host":
            host = transports.add_host(args.directory, args.name)
            print(f"wrote {host}: copy this folder to host {args.name} and run 'asyncrl worker "
                  "--keys FOLDER' there (or point ASYNCRL_CURVE_SECRET_KEY_FILE and "
                  f"ASYNCRL_CURVE_SERVER_KEY_FILE at its files); {args.name} is authorized")
        elif args.keys_command == "revoke":
            revoked = transports.revoke_host(args.directory, args.name)
            print(f"revoked {args.name} ({revoked}): running collectors disconnect its "
                  "workers and refuse its key")
        else:
            for entry in transports.list_keys(args.directory):
                print(f"{entry.name}\t{entry.state}\t{entry.fingerprint}")
    except (OSError, ValueError, transports.TransportError) as exc:
        print(f"asyncrl keys: {exc}", file=sys.stderr)
        return 2
    return 0


def _connect_resolves(connect: str, *, reconnect: bool) -> bool:
    """False (after one line on stderr) if ``connect``'s host name does not resolve.

    With ``--reconnect`` only a warning: the name may appear later (a Kubernetes
    pod's DNS record exists once it is ready) and the workers keep asking.
    """
    from transports import check_resolves, parse_endpoint

    try:
        check_resolves(parse_endpoint(connect, argument="--connect"))
    except OSError as exc:
        if reconnect:
            logging.getLogger("asyncrl.cli").warning("--connect: %s; --reconnect: the workers "
                                                     "keep trying", exc)
            return True
        print(f"asyncrl worker: --connect: {exc}", file=sys.stderr)
        return False
    return True


def run_workers(args: argparse.Namespace) -> int:
    from ._rollout.envs import resolve_import_path
    from ._worker.spec import WorkerSpec, host_rollout_options

    level = _logs.parse_level(args.log_level)
    log_format = "%(asctime)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.WARNING, format=log_format)
    for name in ("asyncrl", "transports"):
        logging.getLogger(name).setLevel(level)
    if args.log_file is not None:
        try:
            _logs.add_file(args.log_file)
        except OSError as exc:
            print(f"asyncrl worker: --log-file {args.log_file}: {exc}", file=sys.stderr)
            return 2
    if args.workers < 1 or args.envs_per_worker < 1 or args.threads < 1:
        print("asyncrl worker: --workers, --envs-per-worker and --threads must be >= 1, got "
              f"{args.workers}, {args.envs_per_worker} and {args.threads}", file=sys.stderr)
        return 2
    if args.workers > args.max_workers:
        print(f"asyncrl worker: --workers {args.workers} is more than --max-workers "
              f"{args.max_workers} (ASYNCRL_MAX_WORKERS): give a smaller count, or raise "
              "--max-workers if this host really runs that many", file=sys.stderr)
        return 2
    if not args.give_up_after >= 0:
        print(f"asyncrl worker: --give-up-after must be >= 0, got {args.give_up_after}",
              file=sys.stderr)
        return 2
    if not args.peer_timeout > 0 or not args.join_timeout > 0:
        print(f"asyncrl worker: --peer-timeout and --join-timeout must be > 0, got "
              f"{args.peer_timeout} and {args.join_timeout}", file=sys.stderr)
        return 2
    if not _connect_resolves(args.connect, reconnect=args.reconnect):
        return 2
    app_dir = os.path.abspath(args.app_dir)
    if app_dir not in sys.path:
        sys.path.insert(0, app_dir)  # spawned workers inherit it
    try:
        if ":" in args.env:
            resolve_import_path(args.env)
        if args.policy:
            resolve_import_path(args.policy)
        from transports import CurveClient

        CurveClient.load(args.keys)  # --keys DIR, else ASYNCRL_CURVE_* variables if set
    except Exception as exc:
        print(f"asyncrl worker: {exc}", file=sys.stderr)
        return 2
    try:
        rollout = host_rollout_options(args.device, info_keys_of(args.info_key))
    except (TypeError, ValueError) as exc:
        print(f"asyncrl worker: {exc}", file=sys.stderr)
        return 2
    spec = WorkerSpec(create_env_fn=args.env, envs_per_worker=args.envs_per_worker,
                      policy_factory=args.policy, torch_threads=args.threads, rollout=rollout)
    from ._worker.host import HostWorkers

    host = HostWorkers(args.connect, spec, workers=args.workers, relay=not args.no_relay,
                       peer_timeout=args.peer_timeout, reconnect=args.reconnect,
                       give_up_after=args.give_up_after,
                       curve_keys=args.keys, backend=args.backend,
                       log_config=_logs.capture(), probe_port=args.probe_port,
                       probe_host=args.probe_host, join_timeout=args.join_timeout,
                       log_file=args.log_file, forward_logs=not args.no_forward_logs)
    try:
        return host.run()
    except OSError as exc:  # the probe port is taken or cannot be bound
        print(f"asyncrl worker: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
