"""Worker processes answer tensordict's per-step ``find_spec("pandas")`` at once."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

import anyio
import pytest
import torch

from asyncrl import MultiSyncCollector
from asyncrl._spawn.absent_modules import remember_absent_modules


def test_only_missing_modules_are_marked_and_imports_still_fail() -> None:
    name = "asyncrl_surely_absent_module"
    try:
        assert remember_absent_modules((name, "json")) == [name]
        assert sys.modules[name] is None and "json" in sys.modules
        assert importlib.util.find_spec(name) is None
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)
        assert remember_absent_modules((name,)) == []  # idempotent
    finally:
        sys.modules.pop(name, None)


def test_an_installed_module_is_never_marked() -> None:
    # "this" is in the standard library and not imported by the test run.
    code = ("import sys; from asyncrl._spawn.absent_modules import remember_absent_modules as r; "
            "print(r(('this',)), 'this' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[] False"


class ReportsPandasMark:
    """A policy (module level: workers unpickle it) writing whether pandas is marked."""

    def __call__(self, td: Any) -> Any:
        n = td.batch_size[0]
        td.set("action", torch.zeros(n, dtype=torch.int64))
        td.set("pandas_marked", torch.full((n,), sys.modules.get("pandas", 0) is None))
        return td


@pytest.mark.anyio
async def test_local_worker_processes_mark_pandas_when_it_is_absent() -> None:
    if importlib.util.find_spec("pandas") is not None:
        pytest.skip("pandas is installed: nothing is marked")
    assert "pandas" not in sys.modules  # the user's process is left alone
    with anyio.fail_after(120):
        async with MultiSyncCollector("CartPole-v1", ReportsPandasMark(), num_workers=1,
                                      frames_per_batch=8, total_frames=8) as collector:
            batches = [b async for b in collector]
    assert batches[0]["pandas_marked"].all()
    assert "pandas" not in sys.modules
