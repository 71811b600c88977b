"""What the command-line tests share: a worker host that records its arguments."""

from __future__ import annotations

import os
from typing import Any

import pytest


@pytest.fixture
def host_kwargs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``asyncrl worker`` gives its HostWorkers (which is not started)."""
    seen: dict[str, Any] = {}

    class FakeHost:
        def __init__(self, connect: str, spec: Any, **kwargs: Any) -> None:
            seen.update(kwargs, connect=connect, spec=spec)

        def run(self) -> int:
            return 0

    monkeypatch.setattr("asyncrl._worker.host.HostWorkers", FakeHost)
    for name in list(os.environ):
        if name.startswith("ASYNCRL_"):
            monkeypatch.delenv(name)
    return seen


@pytest.fixture(autouse=True)
def _restore_logger_levels() -> Any:
    """``asyncrl worker`` run in this process sets asyncrl's loggers' levels (its
    --log-level): put them back, or a later test in this process loses its INFO records."""
    import logging

    loggers = [logging.getLogger(name) for name in ("asyncrl", "transports")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)
