"""The Dockerfile builds from what the repository has, and its health check works.

No container engine runs here, so the image is not built by these tests (see
docs/deploy.md): they read the Dockerfile and check what a build would need,
and run its HEALTHCHECK command against a real probe server.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import anyio
import pytest

from asyncrl import cli
from asyncrl._cli_env import option_variables, subparsers
from asyncrl._observe.probes import ProbeServer

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of each Dockerfile line, continuations joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def of(kind: str) -> list[str]:
    return [rest for word, rest in instructions() if word == kind]


def ignored(path: str) -> bool:
    """Whether .dockerignore leaves ``path`` out of the build context (last match wins)."""
    verdict = False
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") \
                or (pattern.startswith("**/") and fnmatch.fnmatch(path, pattern[3:])):
            verdict = not negate
    return verdict


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    copies = of("COPY")
    assert copies
    for rest in copies:
        *sources, _ = rest.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not ignored(source), f"COPY {source}: left out by .dockerignore"
    assert ignored("tests/docs/test_doc_blocks.py") and ignored(".git/config")
    assert ignored("asyncrl/__pycache__/cli.cpython-311.pyc")


def test_entrypoint_is_the_cli_and_the_user_is_not_root() -> None:
    assert of("ENTRYPOINT") == ['["asyncrl"]']
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["asyncrl"] == "asyncrl.cli:main"
    (user,) = of("USER")
    uid, gid = user.split(":")
    assert int(uid) != 0 and int(gid) != 0
    assert f"--uid {uid}" in " ".join(of("RUN"))


def test_torch_is_the_cpu_build_setup_sh_pins() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pinned = re.search(r'"torch==([\d.]+)"', setup)
    assert pinned is not None
    assert f"TORCH_VERSION={pinned.group(1)}" in of("ARG")
    runs = of("RUN")
    torch_step = next(i for i, r in enumerate(runs) if "torch==${TORCH_VERSION}" in r)
    package_step = next(i for i, r in enumerate(runs) if 'pip install ".[${EXTRAS}]"' in r)
    assert torch_step < package_step  # torch first: the package's range then pulls nothing
    assert "deploy/check_cpu_only.py" in runs[package_step]  # a CUDA build fails the build
    extras = pyproject_extras()
    (default,) = [a.split("=", 1)[1].strip('"') for a in of("ARG") if a.startswith("EXTRAS=")]
    assert set(default.split(",")) <= extras and "ray" in extras


def pyproject_extras() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(pyproject["project"]["optional-dependencies"])


def test_the_cpu_only_check_passes_here() -> None:
    from deploy.check_cpu_only import cuda_problems

    assert cuda_problems() == []  # this machine's torch is the 2.13.0 CPU wheel


def test_image_variables_are_options_of_the_cli() -> None:
    names = set()
    for rest in of("ENV"):
        names |= {m.group(1) for m in re.finditer(r"(ASYNCRL_\w+)=", rest)}
    assert names == {"ASYNCRL_PROBE_PORT", "ASYNCRL_PROBE_HOST"}
    commands = subparsers(cli.build_parser())
    for command in ("worker", "env-worker"):
        assert names <= set(option_variables(commands[command]))
    exposed = {int(p) for rest in of("EXPOSE") for p in rest.split()}
    assert 8080 in exposed and 5555 in exposed


def healthcheck_argv() -> list[str]:
    (rest,) = of("HEALTHCHECK")
    argv: list[str] = json.loads(rest.split("CMD", 1)[1])
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


@pytest.mark.anyio
async def test_the_healthcheck_asks_the_probe_server(anyio_backend: str) -> None:
    server = ProbeServer(lambda: {"ready": False}, host="127.0.0.1", port=0)

    def check(port: int) -> int:
        env = {**os.environ, "ASYNCRL_PROBE_PORT": str(port)}
        return subprocess.run(healthcheck_argv(), env=env, capture_output=True,
                              timeout=60).returncode

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            port = await tg.start(server.serve)
            assert await anyio.to_thread.run_sync(check, port) == 0  # live, though not ready
            tg.cancel_scope.cancel()
        assert await anyio.to_thread.run_sync(check, port) != 0  # nothing answers
