"""Write docs/api.md, the API reference, from the public faces' docstrings.

    python scripts/gen_api_docs.py            # rewrite docs/api.md and migration.md's table
    python scripts/gen_api_docs.py --check    # exit 1 if either is out of date

It also writes the table of TorchRL's collector arguments in docs/migration.md
(between its ``generated`` marks) from TorchRL's signatures and asyncrl's
collectors: what asyncrl takes with TorchRL's meaning, and what it refuses
with the message it gives.

The public faces are the packages' ``__all__`` (``asyncrl``, ``asyncrl.weights``,
``asyncrl.collectors``, ``asyncrl.metrics``, ``asyncrl.testing``,
``transports``): each name with its signature and docstring, and for classes
each public method and property. A test runs ``--check``, so a docstring
changed without regenerating the page fails CI.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"
MIGRATION = ROOT / "docs" / "migration.md"
TABLE_START = "<!-- generated: torchrl-arguments (python scripts/gen_api_docs.py) -->"
TABLE_END = "<!-- end generated: torchrl-arguments -->"
#: The faces, in the order of the page; a face that does not import (an optional
#: extra missing) is listed with the reason.
FACES = ("asyncrl", "asyncrl.collectors", "asyncrl.weights", "asyncrl.served",
         "asyncrl.metrics", "asyncrl.testing", "transports")


def render() -> str:
    out = ["# API reference", "",
           "Generated from the docstrings by `python scripts/gen_api_docs.py`; do not edit by "
           "hand (a test checks that this page is current).", ""]
    seen: set[int] = set()
    for face in FACES:
        try:
            module = importlib.import_module(face)
        except ImportError:
            continue
        names = list(getattr(module, "__all__", []))
        out += [f"## `{face}`", "", _doc(module), ""]
        for name in names:
            obj = getattr(module, name)
            if name.startswith("__"):
                continue
            if id(obj) in seen and inspect.isclass(obj):
                out += [f"### `{face}.{name}`", "", f"The same class as "
                        f"`{obj.__module__.split('._')[0]}.{obj.__qualname__}` above.", ""]
                continue
            seen.add(id(obj))
            out += _entry(f"{face}.{name}", obj)
    return "\n".join(line.rstrip() for line in out).rstrip() + "\n"


def _entry(qualname: str, obj: Any) -> list[str]:
    if inspect.isclass(obj):
        lines = [f"### class `{qualname}{_signature(obj)}`", ""]
        bases = [b.__name__ for b in obj.__bases__ if b is not object]
        if bases:
            lines += [f"Bases: {', '.join(f'`{b}`' for b in bases)}", ""]
        lines += [_doc(obj), ""]
        for name, member in _members(obj):
            kind = "property" if isinstance(member, property) else "method"
            sig = "" if kind == "property" else _signature(member)
            prefix = "async " if inspect.iscoroutinefunction(member) else ""
            lines += [f"#### {kind} `{prefix}{name}{sig}`", "", _doc(member), ""]
        return lines
    if callable(obj):
        prefix = "async " if inspect.iscoroutinefunction(obj) else ""
        return [f"### `{prefix}{qualname}{_signature(obj)}`", "", _doc(obj), ""]
    if inspect.ismodule(obj):  # its docstring, never its repr: that names this checkout's path
        return [f"### module `{qualname}` (`{obj.__name__}`)", "", _doc(obj), ""]
    return [f"### `{qualname}` = `{obj!r}`", ""]


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties the class defines or inherits from asyncrl/transports."""
    found = []
    for name in sorted(dir(cls)):
        if name.startswith("_") and name not in ("__aenter__", "__aiter__"):
            continue
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not owner.__module__.startswith(("asyncrl", "transports")):
            continue
        member = vars(owner)[name]
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        if isinstance(member, property) or inspect.isfunction(member):
            if _doc(member) or not name.startswith("_"):
                found.append((name, member))
    return found


def _signature(obj: Any) -> str:
    """``(a: int, *, b: str = 'x') -> None`` with annotations as written in the source."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = []
    star_done = False
    for param in sig.parameters.values():
        if param.kind is param.KEYWORD_ONLY and not star_done:
            params.append("*")
            star_done = True
        if param.kind is param.VAR_POSITIONAL:
            star_done = True
        prefix = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind, "")
        text = prefix + param.name
        if param.annotation is not param.empty:
            text += f": {_annotation(param.annotation)}"
        if param.default is not param.empty:
            text += f" = {_default(param.default)}"
        params.append(text)
    if params and params[0] in ("self", "cls"):
        params = params[1:]
    result = f"({', '.join(params)})"
    if sig.return_annotation is not sig.empty:
        result += f" -> {_annotation(sig.return_annotation)}"
    return result


def _default(value: Any) -> str:
    # A function's repr holds its address, which changes each run: its name does not.
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return value.__qualname__
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


def _annotation(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    return inspect.formatannotation(annotation)


def _doc(obj: Any) -> str:
    doc = inspect.getdoc(obj)
    if not doc:
        return ""
    return "```text\n" + doc + "\n```"


# -- the TorchRL argument table of docs/migration.md ------------------------------------------
#: Where asyncrl's version of an argument TorchRL also has needs a word more.
NOTES = {
    "create_env_fn": "also a gymnasium id, an import path or a TorchRL env; a list gives "
                     "one factory per worker",
    "create_env_kwargs": "a dict, or a list of one dict per worker",
    "num_workers": "local worker processes; `remote_workers=` adds workers on other hosts",
    "cat_results": "default `\"stack\"`, as TorchRL: `[W, T]` / `[W, E, T]`; see "
                   "[batch shapes](batch_shapes.md)",
    "replay_buffer": "iteration yields None and the collector extends the buffer with "
                     "frames; see [batch shapes](batch_shapes.md)",
    "weight_sync_schemes": "asyncrl's schemes; TorchRL's scheme objects are translated or "
                           "refused by name ([weights](weights.md))",
    "device": "see [devices](devices.md)", "policy_device": "see [devices](devices.md)",
    "env_device": "see [devices](devices.md)", "storing_device": "see [devices](devices.md)",
    "num_threads": "the trainer's threads while the collector is open (restored at close)",
    "num_sub_threads": "each worker's torch threads (default 1)",
    "extend_buffer": "`True`, TorchRL's default; `False` (step-by-step `rb.add`, deprecated "
                     "in TorchRL) is refused: asyncrl writes whole batches",
    "trajs_per_batch": "with `traj_format`; see [batch shapes](batch_shapes.md)",
    "traj_format": "`\"padded\"` (with `(\"collector\", \"mask\")`) or `\"cat\"`; see "
                   "[batch shapes](batch_shapes.md)",
    "preemptive_threshold": "sync mode: the stragglers' shares are cut short",
}


def torchrl_argument_table() -> str:
    """Markdown rows: each TorchRL MultiSync/MultiAsync argument and what asyncrl does with it."""
    from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

    from asyncrl import MultiCollector
    from asyncrl.collectors._torchrl_args import MULTI_COLLECTOR

    ours = inspect.signature(MultiCollector.__init__).parameters
    rows = ["| TorchRL argument | TorchRL default | asyncrl |", "|---|---|---|"]
    seen: dict[str, Any] = {}
    for cls in (MultiSyncCollector, MultiAsyncCollector):
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name != "self" and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                seen.setdefault(name, param.default)
    for name, default in seen.items():
        shown = "required" if default is inspect.Parameter.empty else f"`{_default(default)}`"
        if name in ours:
            text = "same meaning" + (f": {NOTES[name]}" if name in NOTES else "")
        elif name in MULTI_COLLECTOR:
            argument = MULTI_COLLECTOR[name]
            only = "only TorchRL's default is accepted" if argument.only_default else \
                "the values with TorchRL's meaning are accepted"
            text = f"{only}; otherwise refused: {argument.instead}"
        else:
            text = "**not handled** (a test fails until it is)"
        rows.append(f"| `{name}` | {shown} | {text.replace('|', '/')} |")
    return "\n".join(rows)


def with_table(text: str) -> str:
    """``text`` (docs/migration.md) with its generated table replaced by today's."""
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"docs/migration.md lacks the marks {TABLE_START!r} ... {TABLE_END!r}")
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    return f"{head}{TABLE_START}\n{torchrl_argument_table()}\n{TABLE_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = p.parse_args(argv)
    outputs = {OUTPUT: render(), MIGRATION: with_table(MIGRATION.read_text())}
    stale = [path for path, text in outputs.items()
             if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: run python scripts/gen_api_docs.py",
                  file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
