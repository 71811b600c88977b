"""What ``help()`` and ``inspect.signature`` show of a collector class.

``MultiCollector.__new__`` takes ``(*args, sync=None, **kwargs)`` (it picks the
subclass), and ``help()`` would show that instead of the constructor's real
parameters: :func:`show_init_signature` sets the class's ``__signature__`` from
``__init__``. A class's ``Parameters`` section is made from the table of
argument descriptions (:mod:`asyncrl.collectors._parameters`) by
:func:`add_parameters`; subclasses share their base class's:
:func:`share_parameters` appends it to theirs.
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

from ._parameters import parameters_section


def init_signature(cls: type) -> inspect.Signature:
    """``cls.__init__``'s signature without ``self``, annotations evaluated when they can be."""
    init: Any = getattr(cls, "__init__")  # noqa: B009 (mypy: no __init__ on a type)
    try:
        signature = inspect.signature(init, eval_str=True)
    except (NameError, TypeError, SyntaxError):  # an annotation that names nothing here
        signature = inspect.signature(init)
    parameters = list(signature.parameters.values())[1:]
    return signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty)


def show_init_signature(cls: type) -> None:
    """Make ``help(cls)`` and ``inspect.signature(cls)`` show ``cls.__init__``'s parameters."""
    cls.__signature__ = init_signature(cls)  # type: ignore[attr-defined]


def add_parameters(cls: type, entries: str) -> None:
    """Append the ``Parameters`` section of ``entries`` (see ``_parameters``) to the docstring."""
    section = textwrap.indent(parameters_section(entries), "    ")
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + section + "\n    "


def share_parameters(cls: type, base: type) -> None:
    """Append ``base``'s docstring ``Parameters`` section (and what follows) to ``cls``'s."""
    doc = base.__doc__ or ""
    start = doc.find("    Parameters\n    ----------\n")
    if start < 0:
        return
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + doc[start:].rstrip() + "\n    "


__all__ = ["add_parameters", "init_signature", "share_parameters", "show_init_signature"]
