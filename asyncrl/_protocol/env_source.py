"""Where a gymnasium id is registered, as a refusal carries it to a host that lacks the id.

A remote host started with ``--env ALE/Breakout-v5`` and no ``import ale_py``
cannot make its env: it says hello naming the id it lacks (``Hello.env_missing``),
and the coordinator's refusal carries the trainer's :class:`EnvIdSource` data
(``asyncrl._rollout.env_ids``): the module to import and the registration's
fields. Only plain data: a module *name* the host imports from what it has
installed (never the trainer's script), an entry point as an import path, and
kwargs of text, numbers, lists and maps, bounded.

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
from typing import Any

from transports import ProtocolError

__all__ = ["MAIN_MODULES", "is_plain", "read_env_source"]

#: A script's module: another host cannot import it.
MAIN_MODULES = ("__main__", "__mp_main__")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_PACKAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_NAME = 200
#: The registration's fields that travel, with their plain types (``gymnasium.register``'s).
_SPEC_FIELDS: dict[str, tuple[type, ...]] = {
    "entry_point": (str,), "reward_threshold": (int, float, type(None)),
    "nondeterministic": (bool,), "max_episode_steps": (int, type(None)),
    "order_enforce": (bool,), "disable_env_checker": (bool,), "kwargs": (dict,),
    "vector_entry_point": (str, type(None)),
}
_MAX_DEPTH = 8
_MAX_ITEMS = 256
_MAX_TEXT = 4096


def read_env_source(body: Any) -> dict[str, Any]:
    """``{"env_id", "module", "package", "spec"}`` checked; anything else: ProtocolError."""
    if not isinstance(body, dict):
        raise ProtocolError(f"env_source must be a map, got {type(body).__name__}")
    env_id, module, package = (body.get(k) for k in ("env_id", "module", "package"))
    if not isinstance(env_id, str) or not 0 < len(env_id) <= _MAX_NAME \
            or not env_id.isprintable():
        raise ProtocolError(f"env_source env_id must be a printable text of 1 to {_MAX_NAME} "
                            f"characters, got {env_id!r:.80}")
    if not isinstance(module, str) or len(module) > _MAX_NAME or not _MODULE.match(module) \
            or module in MAIN_MODULES:
        raise ProtocolError(f"env_source module must be a dotted module name (not a "
                            f"script's __main__), got {module!r:.80}")
    if not isinstance(package, str) or (package and (
            len(package) > _MAX_NAME or not _PACKAGE.match(package))):
        raise ProtocolError(f"env_source package must be a distribution name, got "
                            f"{package!r:.80}")
    return {"env_id": env_id, "module": module, "package": package,
            "spec": _read_spec(body.get("spec", {}), module)}


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


def _read_spec(spec: Any, module: str) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ProtocolError(f"env_source spec must be a map, got {type(spec).__name__}")
    if not spec:
        return {}  # only the module is imported
    if set(spec) != set(_SPEC_FIELDS):
        raise ProtocolError(f"env_source spec must have the fields {sorted(_SPEC_FIELDS)}, "
                            f"got {sorted(map(str, spec))[:20]}")
    for name, kinds in _SPEC_FIELDS.items():
        value = spec[name]
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise ProtocolError(f"env_source spec {name} must be "
                                f"{' or '.join(k.__name__ for k in kinds)}, got "
                                f"{type(value).__name__}")
    for name in ("entry_point", "vector_entry_point"):
        path = spec[name]
        if path is not None and (len(path) > _MAX_NAME or not _IMPORT_PATH.match(path)):
            raise ProtocolError(f"env_source spec {name} must be an import path "
                                f"'pkg.mod:attr', got {path!r:.80}")
    if spec["entry_point"].partition(":")[0] != module:
        raise ProtocolError(f"env_source spec entry_point {spec['entry_point']!r:.80} is not "
                            f"in its module {module!r}")
    if not is_plain(spec["kwargs"]):
        raise ProtocolError(f"env_source spec kwargs must be plain data (text, numbers, lists, "
                            f"maps with text keys; at most {_MAX_ITEMS} items, depth "
                            f"{_MAX_DEPTH})")
    return dict(spec)
