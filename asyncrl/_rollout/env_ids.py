"""Where a gymnasium id comes from, as plain data: the trainer's registry in every worker.

A gymnasium id is registered at run time: by a package when it is imported
(``import ale_py`` registers ``ALE/Breakout-v5``), or by the user's own
``gymnasium.register(...)``, often inside ``main()``. Workers are forked from a
fork server that never ran ``main()``, and a remote host runs no code of the
trainer's: there the id is unknown ("Namespace ALE not found"). So when a
collector is given an id, :meth:`EnvIdSource.of` records, in the trainer, the
module that holds its entry point (importing it imports its package, which
registers the package's ids) and the registration itself (entry point as an
import path, kwargs, ``max_episode_steps``...). A worker calls :meth:`ensure`
before ``gymnasium.make``: it imports that module, and registers the spec from
the data if the id is still unknown (an id registered inside ``main()``). It is
plain data, never code: local workers get it with their spec, a remote host in
the refusal of a hello that could not make the id (it then imports the module
and says hello again, or exits naming the package to install).

>>> source = EnvIdSource.of("CartPole-v1")
>>> source.module, source.spec["max_episode_steps"]
('gymnasium.envs.classic_control.cartpole', 500)
>>> EnvIdSource.from_body(source.to_body()) == source
True
"""

from __future__ import annotations

import importlib
import re
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from typing import Any, Self

from .._protocol.env_source import MAIN_MODULES, is_plain, read_env_source

__all__ = ["EnvIdSource", "is_unknown_env_id"]

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class EnvIdSource:
    """A registered gymnasium id, where it comes from and how to register it again.

    ``module``: what to import so that the id is registered (its entry point's
    module); ``package``: the distribution that provides it (``"ale-py"``; "" when
    unknown or not looked up: :meth:`with_package`), named in errors; ``spec``: the
    fields of ``gymnasium.register`` ({} when they are not plain data: then only the
    import is tried).
    """

    env_id: str
    module: str
    package: str = ""
    spec: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, env_id: Any) -> EnvIdSource | None:
        """The source of ``env_id`` as the trainer's registry has it (None: not one).

        None for anything but a registered id: an import path, gymnasium's own
        ``"module:Id-v0"`` form (gymnasium imports the module itself), an unknown id
        (``gymnasium.make`` names it in the worker as it would here).
        """
        if not isinstance(env_id, str) or ":" in env_id:
            return None
        import gymnasium

        spec = gymnasium.envs.registry.get(env_id)
        if spec is None or spec.entry_point is None:
            return None
        entry_point = _import_path(spec.entry_point)
        if entry_point is None:
            return None  # a lambda, a local class: nothing a worker could import
        module = entry_point.partition(":")[0]
        fields = {"entry_point": entry_point, "reward_threshold": spec.reward_threshold,
                  "nondeterministic": spec.nondeterministic,
                  "max_episode_steps": spec.max_episode_steps,
                  "order_enforce": spec.order_enforce,
                  "disable_env_checker": spec.disable_env_checker,
                  "kwargs": dict(spec.kwargs),
                  "vector_entry_point": _import_path(spec.vector_entry_point)}
        plain = is_plain(fields["kwargs"]) and not spec.additional_wrappers
        return cls(env_id, module, "", fields if plain else {})

    def with_package(self) -> EnvIdSource:
        """This source naming the installed distribution that provides its module (found
        once per process, ~0.2 s: only when a host must be told what to install)."""
        return replace(self, package=self.package or _distribution(self.module.partition(".")[0]))

    def ensure(self) -> None:
        """Make :attr:`env_id` known to this process's gymnasium (a worker, before make).

        Imports :attr:`module` (its package registers its ids), then registers the
        spec if the id is still unknown. Raises ValueError naming the package to
        install when the module cannot be imported.
        """
        import gymnasium

        if self.env_id in gymnasium.envs.registry:
            return
        if self.in_main:
            if not self.spec:
                raise ValueError(self.main_advice())
            # A local worker ran the trainer's script as its __main__ (functions only:
            # main() did not run): the entry point resolves there, registered below.
        else:
            try:
                importlib.import_module(self.module)
            except ImportError as exc:
                raise ValueError(self.missing_module(exc)) from exc
        if self.env_id not in gymnasium.envs.registry and self.spec:
            gymnasium.register(self.env_id, **self.spec)

    @property
    def in_main(self) -> bool:
        """The entry point is in the trainer's script: a local worker only can find it."""
        return self.module in MAIN_MODULES

    def missing_module(self, exc: BaseException) -> str:
        """What a process that cannot import :attr:`module` is told to do."""
        install = (f"install {self.package!r} here (pip install {self.package})"
                   if self.package else f"install the package that provides {self.module!r}")
        return (f"the gymnasium id {self.env_id!r} is registered by module {self.module!r}, "
                f"which this process cannot import ({type(exc).__name__}: {exc}): {install}, "
                f"or pass create_env_fn as an import path 'pkg.mod:factory'")

    def main_advice(self) -> str:
        """Why a remote host cannot get an id registered from the trainer's script."""
        return (f"the gymnasium id {self.env_id!r} was registered with an entry point defined "
                "in the trainer's script (__main__), which another host cannot import: "
                "define the env class in an importable module (entry_point='pkg.mod:MyEnv') "
                "and install that module on every host")

    # -- the wire (checked in asyncrl._protocol.env_source) -------------------------------------
    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        """Read a source a coordinator sent; anything but the expected plain data: ProtocolError."""
        return cls(**read_env_source(body))


def is_unknown_env_id(create_env_fn: Any) -> bool:
    """``create_env_fn`` is a gymnasium id this process's registry lacks (a host's ``--env``)."""
    if not isinstance(create_env_fn, str) or ":" in create_env_fn:
        return False
    import gymnasium

    return create_env_fn not in gymnasium.envs.registry


def _import_path(entry_point: Any) -> str | None:
    """``"mod:attr"`` of an entry point (a text already, or a module-level callable)."""
    if entry_point is None or isinstance(entry_point, str):
        return entry_point if entry_point is None or _IMPORT_PATH.match(entry_point) else None
    module = getattr(entry_point, "__module__", None)
    qualname = getattr(entry_point, "__qualname__", "")
    if not isinstance(module, str) or "<" in qualname or not qualname:
        return None
    return f"{module}:{qualname}"


@cache
def _distribution(top_module: str) -> str:
    """The installed distribution that provides ``top_module`` ("" if none is known)."""
    if top_module in MAIN_MODULES or top_module == "gymnasium":
        return "gymnasium" if top_module == "gymnasium" else ""
    from importlib.metadata import packages_distributions

    names = packages_distributions().get(top_module, [])
    return names[0] if names else ""
