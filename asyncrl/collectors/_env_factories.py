"""Each local worker's env factory and kwargs, and what must survive the trip to it.

TorchRL's list forms: ``create_env_fn=[make_a, make_b]`` gives each worker its
own factory, ``create_env_kwargs=[{...}, {...}]`` its own keyword arguments.
Every worker still contributes to the same batches, so the coordinator checks
at each hello that the worker's env specs match the first one's
(:func:`local_specs_error` words that refusal for local workers).

Local workers get their factories and policy through pickle (a file written by
the trainer, read by a forked or spawned process): :func:`check_picklable`
tries that at construction, so a lambda or a local closure fails there with
what to do instead, not as a raw ``Can't pickle local object`` in a worker.
"""

from __future__ import annotations

import pickle
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._coordinator.checks import check_specs
from .._errors import SpecMismatchError
from .._protocol import Hello
from .._spawn.main_module import main_unavailable

__all__ = ["LocalSpecsCheck", "check_picklable", "local_specs_error",
           "travelling", "worker_envs"]


def worker_envs(create_env_fn: Any, create_env_kwargs: Any,
                num_workers: int) -> list[tuple[Any, dict[str, Any] | None]]:
    """``(factory, kwargs)`` of each local worker (one entry when there is none).

    ``create_env_fn`` is one factory for all or a list of one per worker (checked
    by ``WorkerLayout``); ``create_env_kwargs`` None, one dict for all, or a list
    of one dict per worker, as in TorchRL.
    """
    count = max(num_workers, 1)
    fns = list(create_env_fn) if isinstance(create_env_fn, list | tuple) \
        else [create_env_fn] * count
    if create_env_kwargs is None or isinstance(create_env_kwargs, Mapping):
        kwargs_list = [create_env_kwargs] * count
    elif isinstance(create_env_kwargs, Sequence) and not isinstance(create_env_kwargs, str):
        kwargs_list = list(create_env_kwargs)
        if len(kwargs_list) != count:
            raise ValueError(f"create_env_kwargs has {len(kwargs_list)} dicts for "
                             f"{count} local workers: give one dict per worker, or one dict "
                             "for all")
    else:
        raise TypeError(f"create_env_kwargs must be a dict, a list of one dict per worker "
                        f"or None, got {type(create_env_kwargs).__name__}")
    for i, kwargs in enumerate(kwargs_list):
        if kwargs is not None and (not isinstance(kwargs, Mapping)
                                   or not all(isinstance(k, str) for k in kwargs)):
            raise TypeError(f"create_env_kwargs[{i}] must be a dict of keyword arguments "
                            f"(str keys) or None, got {kwargs!r}")
    return [(fn, None if kw is None else dict(kw)) for fn, kw in zip(fns, kwargs_list,
                                                                     strict=True)]


# -- what travels to the workers ---------------------------------------------------------------
_ENV_ADVICE = (
    "pass a function defined at module level (at the top of an importable module, or of "
    "your script with the rest under `if __name__ == \"__main__\":`), an import path "
    "'pkg.mod:factory', or functools.partial(module_level_function, ...) to bind "
    "arguments (or create_env_kwargs=)")
_POLICY_ADVICE = (
    "pass policy_factory= (a module-level function, an import path 'pkg.mod:factory' or "
    "a functools.partial of one) that builds the policy in each worker, or make the "
    "policy's classes and the callables it holds module-level")


def check_picklable(items: Sequence[tuple[str, Any]], *, start_method: str) -> None:
    """Pickle each ``(name, obj)`` as local workers will get it; a TypeError says what to do.

    Strings (gym ids, import paths) and None need no check. Objects defined in
    a ``__main__`` that workers cannot run again (an interactive session, a
    script read from stdin) pickle by name but cannot be found by a worker
    process: they are refused too.
    """
    origin = main_unavailable()
    seen: set[int] = set()
    for name, obj in items:
        if obj is None or isinstance(obj, str) or id(obj) in seen:
            continue
        seen.add(id(obj))
        advice = _POLICY_ADVICE if name.startswith("policy") else _ENV_ADVICE
        try:
            _Probe(origin is not None).dump(obj)
        except _InteractiveObject as exc:
            raise TypeError(
                f"{name} uses {exc.args[0]}, defined in {origin}: local worker processes "
                f"(start_method={start_method!r}) cannot import it; {advice}") from None
        except Exception as exc:
            raise TypeError(
                f"{name} ({_short_repr(obj)}) cannot be sent to the local worker "
                f"processes (start_method={start_method!r} pickles it for each one): "
                f"{type(exc).__name__}: {exc}; {advice}") from exc


class _InteractiveObject(Exception):
    pass


class _Discard:
    """A file that keeps nothing: the probe measures picklability, not bytes."""

    @staticmethod
    def write(data: bytes) -> int:
        return len(data)


class _Probe(pickle.Pickler):
    def __init__(self, interactive: bool) -> None:
        super().__init__(_Discard(), protocol=pickle.HIGHEST_PROTOCOL)
        self._interactive = interactive

    def persistent_id(self, obj: Any) -> None:
        # Called for every object pickled: functions and classes go by name.
        if self._interactive and isinstance(obj, types.FunctionType | type) \
                and getattr(obj, "__module__", None) == "__main__":
            raise _InteractiveObject(f"{obj.__qualname__!r}")
        return None


def _short_repr(obj: Any) -> str:
    if isinstance(obj, types.FunctionType | type):
        return f"{obj.__module__}.{obj.__qualname__}"  # no address: the same every run
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


def travelling(spec: Any, create_env_fn: Any, create_env_kwargs: Any,
               envs: Sequence[tuple[Any, Any]]) -> list[tuple[str, Any]]:
    """What local workers get by pickle, named as the user passed it (a list: indexed)."""
    fn_list = isinstance(create_env_fn, list | tuple)
    kwargs_list = isinstance(create_env_kwargs, list | tuple)
    items: list[tuple[str, Any]] = []
    for i, (fn, kwargs) in enumerate(envs):
        items += [(f"create_env_fn[{i}]" if fn_list else "create_env_fn", fn),
                  (f"create_env_kwargs[{i}]" if kwargs_list else "create_env_kwargs", kwargs)]
    return [*items, ("policy_factory", spec.policy_factory), ("policy", spec.policy)]


# -- specs --------------------------------------------------------------------------------------
class LocalSpecsCheck:
    """The coordinator's spec check; a local worker that fails it fails the run.

    Local workers are the trainer's own: different specs are a configuration
    error (e.g. per-worker factories that build different envs), not a stranger
    to refuse quietly. ``coordinator()`` gives the coordinator once it exists;
    ``remote``: the reference specs came from an env built in the trainer.
    """

    def __init__(self, coordinator: Callable[[], Any], remote: bool) -> None:
        self._coordinator = coordinator
        self._remote = remote

    def __call__(self, reference: dict[str, Any], hello: Hello) -> list[str]:
        problems = check_specs(reference, hello)
        coordinator = self._coordinator()
        if problems and hello.slot >= 0 and coordinator is not None:
            first = next(iter(coordinator.roster.workers.values()), None)
            name = ("the env built in the trainer from the first create_env_fn"
                    if self._remote or first is None else f"worker {first.index}")
            coordinator.fail(local_specs_error(hello.slot, name, problems))
        return problems


def local_specs_error(worker: int, reference: str, problems: list[str]) -> SpecMismatchError:
    """The run's error when local worker ``worker``'s env specs differ from the reference's."""
    diffs = "; ".join(p.removeprefix("specs: ") for p in problems)
    return SpecMismatchError(
        f"worker {worker}'s envs cannot be batched with {reference}'s: their specs differ "
        f"({diffs}). Every worker's env must have the same observation and action specs "
        "and the same number of envs: make the per-worker create_env_fn / "
        "create_env_kwargs build matching envs, or use one collector per kind of env")
