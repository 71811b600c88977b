"""Every code block of README.md and docs/ runs as written (or says why it cannot).

Python blocks run as programs in a fresh interpreter (workers are processes,
so a block's functions must live in a real ``__main__``), inside the setup the
page declares for them (see ``tests/docs/markdown_blocks.py``), in an empty
directory of their own with the repository on the import path. Shell blocks
are checked without running them: ``asyncrl`` command lines must parse with
the real CLI, a script's ``--flags`` must appear in its ``--help``, and the
files they name must exist.
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .markdown_blocks import ROOT, CodeBlock, code_blocks, markdown_files, shell_commands

#: A block's whole run, workers included: blocks use small frame counts.
BLOCK_TIMEOUT = 180

_BLOCKS = [block for path in markdown_files() for block in code_blocks(path)]
_PYTHON = [b for b in _BLOCKS if b.lang == "python"]
_SHELL = [b for b in _BLOCKS if b.lang in ("bash", "sh", "shell")]
#: Commands a shell block may use without a check of their own.
_UNCHECKED = {"cd", "export", "pip", "git", "kill", "curl", "sudo", "systemctl", "ip"}


def _group_members(group: int) -> dict[int, str]:
    """Live (not zombie) processes of process group ``group``: pid -> command line."""
    members = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] not in ("Z", "X") and int(fields[2]) == group:
                pid = int(stat.parent.name)
                members[pid] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")\
                    .decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue
    return members


def _group_survivors(group: int, grace: float = 10.0) -> dict[int, str]:
    """What is still running in ``group`` once its leader exited and ``grace`` passed.

    multiprocessing's helpers (fork server, resource tracker) exit when their
    parent's pipes close, a moment after it: they get the grace to do so.
    """
    deadline = time.monotonic() + grace
    members = _group_members(group)
    while members and time.monotonic() < deadline:
        time.sleep(0.1)
        members = _group_members(group)
    return members


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _skip_if_asked(block: CodeBlock) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")


@pytest.mark.parametrize("block", _PYTHON, ids=[b.id for b in _PYTHON])
def test_python_block_runs(block: CodeBlock, tmp_path: Path) -> None:
    _skip_if_asked(block)
    program = tmp_path / "doc_block.py"
    program.write_text(block.program())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "PYTHONUNBUFFERED": "1"}
    # In a directory of its own (a block may write files: keys/, checkpoints), and in a
    # process group of its own: whatever it started is found, and killed, afterwards.
    proc = subprocess.Popen([sys.executable, str(program)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{block.id} did not finish in {BLOCK_TIMEOUT} s; output:\n"
                    f"{stdout[-3000:]}\n{stderr[-6000:]}")
    finally:
        left = _group_survivors(proc.pid)
        _kill_group(proc.pid)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert not left, f"{block.id} left processes running after it exited: {left}"
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}\n--- program ---\n{block.program()}"
        f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-6000:]}")


@pytest.mark.parametrize("block", _SHELL, ids=[b.id for b in _SHELL])
def test_shell_block_commands_are_valid(block: CodeBlock) -> None:
    _skip_if_asked(block)
    for line in shell_commands(block.code):
        for command in _split_command_list(line):
            _check_command(block, shlex.split(command))


def test_every_block_is_checked() -> None:
    """A block in a language nobody checks must be plain text, output or data."""
    checked = {"python", "bash", "sh", "shell"}
    unrunnable = {"text", "console", "json", "toml", "yaml", "ini", "pycon", "markdown",
                  "prometheus", "http"}
    odd = [f"{b.id} ({b.lang})" for b in _BLOCKS if b.lang not in checked | unrunnable]
    assert not odd, f"code blocks in a language the doc tests do not know: {odd}"


def _split_command_list(line: str) -> list[str]:
    parts = [line]
    for sep in ("&&", "||", ";", "|"):
        parts = [p for part in parts for p in part.split(sep)]
    return [p.strip() for p in parts if p.strip()]


def _check_command(block: CodeBlock, argv: list[str]) -> None:
    environ = {}
    while argv and "=" in argv[0] and not argv[0].startswith("-"):  # VAR=value cmd
        name, _, value = argv[0].partition("=")
        environ[name] = value
        argv = argv[1:]
    program = Path(argv[0]).name
    args = argv[1:]
    if program == "asyncrl":
        _check_cli(block, args, environ)
    elif program == "docker":
        _check_docker(block, args)
    elif program == "kubectl":
        _check_kubectl(block, args)
    elif program.startswith("python"):
        _check_python_command(block, args)
    elif program == "bash":
        assert (ROOT / args[0]).is_file(), f"{block.id}: {args[0]} does not exist"
    elif program == "uvicorn":
        _check_import_path(block, next(a for a in args if ":" in a and not a.startswith("-")))
    else:
        assert program in _UNCHECKED, (
            f"{block.id}: the doc tests cannot check the command {program!r}: add a check to "
            "tests/docs/test_doc_blocks.py or write the block as text")


def _check_cli(block: CodeBlock, args: list[str], environ: dict[str, str] | None = None) -> None:
    from asyncrl._cli_env import check_environment
    from asyncrl.cli import build_parser

    try:
        parser = build_parser(environ or {})  # ASYNCRL_* given on the line count
        check_environment(parser, parser.parse_args(args))
    except SystemExit as exc:
        if exc.code not in (0, None):  # --help and --version exit 0
            pytest.fail(f"{block.id}: 'asyncrl {' '.join(args)}' does not parse "
                        f"(exit {exc.code})")


#: What `asyncrl keys generate DIR` writes (a Secret made from them names these).
_KEY_FILES = {"coordinator.key", "coordinator.key_secret", "worker.key", "worker.key_secret"}


def _check_docker(block: CodeBlock, args: list[str]) -> None:
    """`docker build`: the Dockerfile and its build arguments exist; `docker run IMAGE
    ARGS`: ARGS are an `asyncrl` command line (the image's entrypoint)."""
    if args[0] == "build":
        dockerfile = (ROOT / "Dockerfile").read_text()
        for i, arg in enumerate(args):
            if arg == "--build-arg":
                name = args[i + 1].split("=", 1)[0]
                assert f"ARG {name}" in dockerfile, f"{block.id}: the Dockerfile has no {name}"
        assert args[-1] == ".", f"{block.id}: build from the repository root"
    elif args[0] == "run":
        rest = args[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        _check_cli(block, rest[1:])
    else:
        pytest.fail(f"{block.id}: the doc tests cannot check 'docker {args[0]}'")


def _check_kubectl(block: CodeBlock, args: list[str]) -> None:
    """Files and directories it applies exist; Secrets are made of `asyncrl keys` files;
    the deployments and services it names are in deploy/."""
    import yaml

    names = {f"{d['kind'].lower()}/{d['metadata']['name']}"
             for p in (ROOT / "deploy").rglob("*.yaml") for d in yaml.safe_load_all(p.read_text())
             if d and "metadata" in d}
    for i, arg in enumerate(args):
        if arg in ("-f", "-k") and args[i + 1] != "-":  # `-f -`: standard input
            assert (ROOT / args[i + 1]).exists(), f"{block.id}: {args[i + 1]} does not exist"
        elif arg.startswith("--from-file="):
            path = Path(arg.split("=")[-1])
            # a key file, or a folder of `asyncrl keys`: authorized/, revoked/, hosts/NAME/
            assert path.name in _KEY_FILES or path.name in ("authorized", "revoked") \
                or path.parent.name == "hosts", f"{block.id}: {path} is no key file or folder"
        elif "/" in arg and arg.split("/", 1)[0] in ("deployment", "service", "statefulset"):
            assert arg in names, f"{block.id}: no {arg} in deploy/"
    if args[:2] == ["get", "rayjob"]:
        assert f"rayjob/{args[2]}" in names, f"{block.id}: no RayJob {args[2]} in deploy/"


def _check_python_command(block: CodeBlock, args: list[str]) -> None:
    if args[0] == "-m":
        target, rest = args[1], args[2:]
        help_text = _help_of(lambda: runpy.run_module(target, run_name="__main__"), target)
    else:
        script = ROOT / args[0]
        assert script.is_file(), f"{block.id}: {args[0]} does not exist"
        target, rest = args[0], args[1:]
        help_text = _help_of(lambda: runpy.run_path(str(script), run_name="__main__"), target)
    for arg in rest:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in help_text, f"{block.id}: {target} has no option {flag}"


def _help_of(run: object, name: str) -> str:
    out = io.StringIO()
    argv = sys.argv
    sys.argv = [name, "--help"]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
            run()  # type: ignore[operator]
    finally:
        sys.argv = argv
    assert exited.value.code in (0, None), f"{name} --help exited {exited.value.code}"
    return out.getvalue()


def _check_import_path(block: CodeBlock, path: str) -> None:
    from asyncrl._rollout.envs import resolve_import_path

    resolve_import_path(path)
