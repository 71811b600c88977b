"""docs/api.md is the reference generated from today's docstrings."""

from __future__ import annotations

import importlib.util

from .markdown_blocks import ROOT


def _generator():  # scripts/ is not a package: load the script as a module
    spec = importlib.util.spec_from_file_location("gen_api_docs", ROOT / "scripts/gen_api_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_current() -> None:
    generated = _generator().render()
    current = (ROOT / "docs/api.md").read_text()
    assert current == generated, (
        "docs/api.md is out of date with the docstrings: run "
        "'python scripts/gen_api_docs.py' and commit docs/api.md")


def test_every_public_class_has_a_docstring_with_an_example() -> None:
    import asyncrl
    import asyncrl.weights
    import transports

    missing = []
    for face in (asyncrl, asyncrl.weights, transports):
        for name in face.__all__:
            obj = getattr(face, name)
            if isinstance(obj, type) and not issubclass(obj, BaseException):
                doc = obj.__doc__ or ""
                if ">>>" not in doc:
                    missing.append(f"{face.__name__}.{name}")
    assert not missing, f"public classes without a '>>>' example in their docstring: {missing}"
