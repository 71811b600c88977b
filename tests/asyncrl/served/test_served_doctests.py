"""The examples in asyncrl.served's docstrings run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["_bells", "_status", "_handle", "_scheme"])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"asyncrl.served.{module}"),
                             optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed
