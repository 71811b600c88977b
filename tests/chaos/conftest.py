"""The ``sandbox`` fixture: a private temp directory and leftover checks per scenario."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest

from .helpers import Sandbox


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    box = Sandbox()
    # Socket directories of this test land here, apart from those of parallel tests;
    # spawned workers and subprocesses inherit TMPDIR.
    monkeypatch.setattr(tempfile, "tempdir", str(box.root))
    monkeypatch.setenv("TMPDIR", str(box.root))
    try:
        yield box
    finally:
        box.clean_up()
