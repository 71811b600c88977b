"""The public API is typed and documented: ``mypy --strict`` and ``help()`` (issue #13, 6)."""

from __future__ import annotations

import inspect
import os
import pydoc
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import asyncrl

ROOT = Path(__file__).resolve().parent.parent
CLASSES = [asyncrl.MultiCollector, asyncrl.MultiSyncCollector, asyncrl.MultiAsyncCollector,
           asyncrl.Collector, asyncrl.BlockingCollector]


def _mypy() -> list[str]:
    if shutil.which("mypy", path=os.path.dirname(sys.executable)) is None:
        try:
            import mypy  # noqa: F401
        except ImportError:
            pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    return [sys.executable, "-m", "mypy"]


def test_mypy_strict_on_the_packages() -> None:
    # The public faces import every module behind them: checking the packages is
    # checking what a user's `mypy --strict` sees through them. A warm cache (.mypy_cache)
    # makes this a few seconds; a cold one ~1 min.
    result = subprocess.run(
        [*_mypy(), "--strict", "--no-error-summary", "asyncrl", "transports"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr


def test_user_code_is_typed_through_the_public_names(tmp_path: Path) -> None:
    script = tmp_path / "user.py"
    script.write_text(
        "import asyncrl\n"
        "c = asyncrl.MultiAsyncCollector('CartPole-v1', num_workers=1, frames_per_batch=8)\n"
        "reveal_type(c)\n"
        "asyncrl.MultiSyncCollector('CartPole-v1', num_workers=1, frames_per_batch='8')\n")
    result = subprocess.run([*_mypy(), "--strict", str(script)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    # Generic in its replay buffer's type: None (none given), so batches are not Optional.
    revealed = 'Revealed type is "asyncrl.collectors.multi.collector.MultiAsyncCollector[None]"'
    assert revealed in result.stdout
    # Constructor arguments are checked against the real signature.
    assert 'Argument "frames_per_batch" to "MultiSyncCollector" has incompatible type "str"' \
        in result.stdout


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_help_shows_the_constructor_and_documents_every_parameter(cls: type) -> None:
    signature = inspect.signature(cls)
    names = [p for p in signature.parameters if p not in ("self", "args", "kwargs")]
    assert names, f"{cls.__name__}'s signature is {signature}"
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    assert f"{cls.__name__}({names[0]}" in text  # the real parameters, not (*args, **kwargs)
    doc = inspect.getdoc(cls) or ""
    assert "Parameters\n----------\n" in doc
    section = doc.split("Parameters\n----------\n", 1)[1]
    documented = set()
    for line in section.splitlines():
        if line and not line.startswith(" "):
            documented.update(n.lstrip("*") for n in re.split(r",\s*", line.strip()))
    missing = [name for name in names if name not in documented]
    assert not missing, f"{cls.__name__}: parameters not documented: {missing}"


def test_multicollector_sync_picks_the_class_and_refuses_a_contradiction() -> None:
    collector = asyncrl.MultiCollector("CartPole-v1", num_workers=1, frames_per_batch=8,
                                       sync=False)
    assert type(collector) is asyncrl.MultiAsyncCollector
    with pytest.raises(ValueError, match=r"MultiAsyncCollector\(sync=True\) contradicts"):
        asyncrl.MultiAsyncCollector("CartPole-v1", num_workers=1, frames_per_batch=8,
                                    sync=True)


# -- a user's script under mypy --strict, asyncrl installed editable (issue #26) ----------
USER_SCRIPT = '''
import asyncio
from typing import Any

import asyncrl


class Buffer:
    def __init__(self) -> None:
        self.frames = 0

    def extend(self, data: Any) -> None:
        self.frames += 1


async def main() -> None:
    async with asyncrl.MultiAsyncCollector("CartPole-v1", num_workers=1, frames_per_batch=8,
                                           total_frames=16) as collector:
        async for batch in collector:
            reveal_type(batch)
            print(batch["next", "reward"].sum().item())
    async with asyncrl.Collector("CartPole-v1", frames_per_batch=8, total_frames=16) as one:
        async for batch in one:
            print(batch.numel())
    async with asyncrl.MultiSyncCollector("CartPole-v1", num_workers=1, frames_per_batch=8,
                                          total_frames=16, replay_buffer=Buffer()) as filling:
        async for nothing in filling:
            reveal_type(nothing)


if __name__ == "__main__":
    asyncio.run(main())
'''


def test_a_users_script_passes_mypy_strict_against_an_editable_install(tmp_path: Path) -> None:
    """As ``pip install -e . --config-settings editable_mode=compat`` installs it
    (``scripts/setup.sh``): a ``.pth`` path entry to the checkout in site-packages.

    A bare venv stands for the user's (its site-packages holds only that ``.pth``), so
    asyncrl is an *installed* package to mypy, as in the user's project: its own
    imports (torch, tensordict) are not the user's errors. The batch is not Optional
    (``batch["next", "reward"]`` type-checks); with a replay buffer it is None.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(site) / "__editable__.asyncrl-0.1.0.pth").write_text(f"{ROOT}\n")
    project = tmp_path / "project"  # no mypy config of ours: the user's defaults
    project.mkdir()
    (project / "user.py").write_text(USER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    result = subprocess.run(
        [*_mypy(), "--strict", "--python-executable", str(python), "--cache-dir",
         str(tmp_path / "cache"), "user.py"],
        cwd=project, capture_output=True, text=True, timeout=600, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    revealed = re.findall(r'Revealed type is "([^"]+)"', out)
    # tensordict ships no type information, so TensorDictBase reads as Any to a user's
    # mypy; what matters is that it is not "Any | None" (which fails on indexing).
    assert revealed == ["Any", "None"], out


def test_the_setup_script_installs_editable_in_compat_mode() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert ('-e ".[dev,torchrl,examples,ray,envpool,atari]" --config-settings editable_mode=compat'
            in setup)
