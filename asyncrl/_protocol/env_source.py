"""Where a gymnasium id is registered, as a refusal carries it to a host that lacks the id.

A remote host started with ``--env ALE/Breakout-v5`` and no ``import ale_py``
cannot make its env: it says hello naming the id it lacks (``Hello.env_missing``),
and the coordinator's refusal carries the trainer's :class:`EnvIdSource` data
(``asyncrl._rollout.env_ids``): the module to import and the registration's
fields. Only plain data: a module *name* the host imports from what it has
installed (never the trainer's script), an entry point as an import path, and
kwargs of text, numbers, lists and maps, bounded. Declared once
(:class:`EnvSource`, :class:`EnvSourceSpec`) and read by the one mechanism
(``transports.declared``), its cross-field rules in ``__post_init__``: all at decode.

>>> body = {"env_id": "CartPole-v1", "module": "gymnasium.envs.classic_control.cartpole",
...         "package": "gymnasium", "spec": {}}
>>> read_env_source(body)["module"]
'gymnasium.envs.classic_control.cartpole'
>>> try:
...     read_env_source({**body, "module": "__main__"})
... except ProtocolError as exc:
...     print(str(exc)[:60])
env_source module must be a dotted module name (not a script
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from msgspec import Meta

from transports import ProtocolError, declared

__all__ = ["MAIN_MODULES", "EnvSource", "EnvSourceSpec", "is_plain", "read_env_source"]

#: A script's module: another host cannot import it.
MAIN_MODULES = ("__main__", "__mp_main__")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_PACKAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_NAME = 200
_MAX_DEPTH = 8
_MAX_ITEMS = 256
_MAX_TEXT = 4096
Name = Annotated[str, Meta(max_length=_MAX_NAME)]


@dataclass(frozen=True, slots=True)
class EnvSourceSpec:
    """The registration's fields that travel, with ``gymnasium.register``'s plain types;
    the import paths and the kwargs checked in ``__post_init__`` (at decode)."""

    entry_point: Name
    reward_threshold: int | float | None
    nondeterministic: bool
    max_episode_steps: int | None
    order_enforce: bool
    disable_env_checker: bool
    kwargs: dict[str, Any]
    vector_entry_point: Name | None

    def __post_init__(self) -> None:
        for name in ("entry_point", "vector_entry_point"):
            path = getattr(self, name)
            if path is not None and not _IMPORT_PATH.match(path):
                raise ProtocolError(f"env_source spec {name} must be an import path "
                                    f"'pkg.mod:attr', got {path!r:.80}")
        if not is_plain(self.kwargs):
            raise ProtocolError(f"env_source spec kwargs must be plain data (text, numbers, "
                                f"lists, maps with text keys; at most {_MAX_ITEMS} items, "
                                f"depth {_MAX_DEPTH})")


@dataclass(frozen=True, slots=True)
class EnvSource:
    """A refusal's ``env_source``, declared: where the trainer's gymnasium id is registered.

    ``spec`` is empty (only the module is imported) or has every field of
    :class:`EnvSourceSpec`; its entry point must be in ``module``. Every rule runs at
    decode (``__post_init__``), so a hostile source is refused before anything is imported.
    """

    env_id: Annotated[str, Meta(min_length=1, max_length=_MAX_NAME)]
    module: Name
    package: Name
    spec: dict[str, Any] = field(default_factory=dict)  # {}: none; else an EnvSourceSpec

    def __post_init__(self) -> None:
        if not self.env_id.isprintable():
            raise ProtocolError(f"env_source env_id must be a printable text of 1 to "
                                f"{_MAX_NAME} characters, got {self.env_id!r:.80}")
        if not _MODULE.match(self.module) or self.module in MAIN_MODULES:
            raise ProtocolError(f"env_source module must be a dotted module name (not a "
                                f"script's __main__), got {self.module!r:.80}")
        if self.package and not _PACKAGE.match(self.package):
            raise ProtocolError(f"env_source package must be a distribution name, got "
                                f"{self.package!r:.80}")
        if self.spec:  # all of gymnasium's fields, declared, or none
            spec = declared.read(EnvSourceSpec, self.spec, "env_source spec")
            if spec.entry_point.partition(":")[0] != self.module:
                raise ProtocolError(f"env_source spec entry_point {spec.entry_point!r:.80} is "
                                    f"not in its module {self.module!r}")
            object.__setattr__(self, "spec", _fields(spec))


def read_env_source(body: Any) -> dict[str, Any]:
    """``{"env_id", "module", "package", "spec"}`` of ``body`` read as :class:`EnvSource`;
    anything else: ProtocolError (a spec's fields beyond gymnasium's are not kept)."""
    return _fields(declared.read(EnvSource, body, "env_source"))


def _fields(message: Any) -> dict[str, Any]:
    """A declared message's ``{field: value}``, as read (``asdict`` would copy them again)."""
    return {name: getattr(message, name) for name in message.__dataclass_fields__}


def is_plain(value: Any, depth: int = 0) -> bool:
    """Text, numbers, None, and lists / maps of them with text keys, bounded."""
    if depth > _MAX_DEPTH:
        return False
    if value is None or isinstance(value, bool | int | float):
        return True
    if isinstance(value, str):
        return len(value) <= _MAX_TEXT
    if isinstance(value, list | tuple):
        return len(value) <= _MAX_ITEMS and all(is_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return len(value) <= _MAX_ITEMS and all(
            isinstance(k, str) and is_plain(v, depth + 1) for k, v in value.items())
    return False
