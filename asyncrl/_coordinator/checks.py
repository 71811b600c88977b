"""What the coordinator checks of what a worker sends: handshake, batches, error reports.

Nothing a worker sends is taken on trust: a remote host may run other code, an
older asyncrl, or be hostile. These checks are pure functions of the data, so
the coordinator's state stays about state and the checks are tested on their own.

Anyone can connect to a listening port and send an ``error`` message: a report
stops the run only from a live, admitted worker, or from a local worker that
failed before it could join (its env did not build), which proves it was spawned
here with the spawn token only the trainer and its children know (:func:`reporter`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

import torch
from tensordict import TensorDictBase, is_leaf_nontensor

from .._protocol import PROTOCOL, ErrorReport, Hello, RelayHello
from .._protocol.compact_frames import twin_keys
from .._rollout.options import RolloutOptions
from .info_entries import InfoEntries
from .records import WorkerInfo

#: Keys of TorchRL's batch layout every share must hold (observations come from the specs).
REQUIRED_KEYS: tuple[tuple[str, ...], ...] = (
    ("action",), ("next", "reward"), ("next", "done"), ("next", "terminated"),
    ("next", "truncated"), ("collector", "traj_ids"), ("collector", "worker_id"),
    ("collector", "policy_version"),
)
_FLAGS = (("next", "done"), ("next", "terminated"), ("next", "truncated"))


class BatchChecker:
    """Checks a worker's batch against what it was asked for, before it is counted.

    A batch from the network decides how many frames the trainer thinks it
    has, so nothing in it is taken on trust: its batch size must be
    ``[num_envs, frames // num_envs]`` (fewer steps only for a share the
    coordinator cut short), every leaf must share those leading dimensions,
    TorchRL's keys must be there, observations and actions must have the
    shapes and dtypes of the handshake's specs, and ``("collector",
    "worker_id")`` must be the sender's index. With ``dropped`` (TorchRL's
    ``compact_obs=True``) the ``("next", K)`` twins must be absent, the specs' and
    any other (a recurrent state's): the trainer asked for none. Under ``"next"``
    only the flags, root keys' twins and the ``info_keys`` asked for may come, each
    info leaf with one dtype and shape (:class:`~asyncrl._coordinator.info_entries.InfoEntries`).
    """

    def __init__(self, info_keys: Any = None, *, first_remote_index: int = 0) -> None:
        self._specs_source: dict[str, Any] | None = None
        self._specs: Any = None  # EnvSpecs parsed from _specs_source (None: unusable)
        # what "next" may hold beyond observations and flags (see info_entries)
        self._infos = InfoEntries(info_keys, first_remote_index=first_remote_index)

    def problems(self, td: TensorDictBase, *, specs: dict[str, Any] | None, frames: int,
                 worker_index: int, shorter_ok: bool, dropped: bool = False) -> list[str]:
        parsed = self._parse(specs)
        envs = parsed.num_envs if parsed is not None else None
        shape = tuple(td.batch_size)
        if len(shape) != 2:
            return [f"batch size {list(shape)}: expected [num_envs, steps]"]
        if envs is not None:
            steps = frames // envs
            if shape[0] != envs or not (shape[1] == steps or (shorter_ok and shape[1] < steps)):
                return [f"batch size {list(shape)}: expected [{envs}, {steps}] "
                        f"({frames} frames over {envs} envs)"]
        elif shape[0] * shape[1] != frames and not (shorter_ok and shape[0] * shape[1] < frames):
            # Specs unusable (no check_specs): at least the frame count must hold.
            return [f"batch size {list(shape)}: expected {frames} frames"]
        problems = self._leaf_problems(td, shape)
        if problems:
            return problems
        if parsed is not None:
            problems += self._spec_problems(td, parsed, shape, dropped=dropped)
        if dropped:
            problems += self._twin_problems(td, parsed)
        problems += self._infos.problems(td, worker_index=worker_index)
        ids = td.get(("collector", "worker_id"))
        if not bool((ids == worker_index).all()):
            problems.append(f"('collector', 'worker_id'): expected {worker_index} everywhere")
        return problems

    def _parse(self, specs: dict[str, Any] | None) -> Any:
        if specs is not self._specs_source:
            from .._rollout.envs import EnvSpecs

            self._specs_source = specs
            try:
                self._specs = EnvSpecs.from_dict(specs) if specs is not None else None
            except ValueError:
                self._specs = None  # checked at the handshake when check_specs is on
        return self._specs

    @staticmethod
    def _leaf_problems(td: TensorDictBase, shape: tuple[int, ...]) -> list[str]:
        problems = []
        # is_leaf_nontensor: a string or msgpack value the codec decoded (NonTensorData) is
        # a leaf too, which keys() would otherwise skip: a batch holds tensors only.
        keys = {k if isinstance(k, tuple) else (k,)
                for k in td.keys(include_nested=True, leaves_only=True,
                                 is_leaf=is_leaf_nontensor)}
        for key in REQUIRED_KEYS:
            if key not in keys:
                problems.append(f"{key}: missing")
        for key in keys:
            value = td.get(key)
            if not isinstance(value, torch.Tensor):
                problems.append(f"{key}: {type(value).__name__}, expected a tensor")
            elif tuple(value.shape[:2]) != shape:
                got = list(getattr(value, "shape", ()))
                problems.append(f"{key}: shape {got}, expected leading dims {list(shape)}")
        for key in _FLAGS:
            if key in keys and td.get(key).dtype != torch.bool:
                problems.append(f"{key}: dtype {td.get(key).dtype}, expected torch.bool")
        ids = td.get(("collector", "worker_id"), None)
        if isinstance(ids, torch.Tensor) and ids.dtype != torch.int64:
            problems.append(f"('collector', 'worker_id'): dtype {ids.dtype}, expected torch.int64")
        return problems[:20]

    @staticmethod
    def _twin_problems(td: TensorDictBase, specs: Any) -> list[str]:
        """compact_obs: every ``("next", K)`` twin the batch carries, whatever its shape."""
        twins = dict.fromkeys(twin_keys(td))
        if specs is not None:
            twins.update(dict.fromkeys(
                key for key in (("next", *path) for path in specs.flat_observation())
                if td.get(key, None) is not None))
        return [f"{key}: sent, but compact_obs=True drops it (the welcome asked for batches "
                "without it)" for key in twins][:20]

    @staticmethod
    def _spec_problems(td: TensorDictBase, specs: Any, shape: tuple[int, ...], *,
                       dropped: bool) -> list[str]:
        from .._rollout.policies import torch_dtype

        problems = []
        expected = [(("action",), specs.action)]
        for path, spec in specs.flat_observation().items():
            expected += [(path, spec)] if dropped else [(path, spec), (("next", *path), spec)]
        for key, spec in expected:
            value = td.get(key, None)
            want_shape, want_dtype = [*shape, *spec.shape], torch_dtype(spec.dtype)
            if value is None:
                problems.append(f"{key}: missing")
            elif list(value.shape) != want_shape or value.dtype != want_dtype:
                problems.append(f"{key}: {value.dtype} {list(value.shape)}, expected "
                                f"{want_dtype} {want_shape} (from the env specs)")
        return problems[:20]


def hello_problems(hello: Hello, *, token: str, accept_remote: bool,
                   slot_taken: bool) -> list[str]:
    """What forbids admitting the worker of ``hello`` ([] if nothing), specs and room aside.

    ``slot_taken``: a live worker holds the index this (local) worker was spawned for.
    """
    problems = []
    if hello.protocol != PROTOCOL:
        problems.append(f"protocol: coordinator speaks {PROTOCOL}, worker {hello.protocol}")
    local = hello.slot >= 0
    if local and hello.token != token:
        problems.append("token: this worker was not spawned by this coordinator")
    if not local and not accept_remote:
        problems.append("remote workers are not accepted by this collector")
    if local and slot_taken:
        problems.append(f"slot: worker index {hello.slot} is taken")
    return problems


def relay_hello_problems(hello: RelayHello, *, accept_remote: bool, max_remote: int | None,
                         others: int) -> list[str]:
    """What forbids registering the relay of ``hello`` ([] if nothing).

    ``others``: relays registered already, this one aside (a relay may say hello again).
    """
    problems = []
    if hello.protocol != PROTOCOL:
        problems.append(f"protocol: coordinator speaks {PROTOCOL}, relay {hello.protocol}")
    if not accept_remote:
        problems.append("remote workers (and their relays) are not accepted by this "
                        "collector; pass listen= and remote_workers=")
    elif max_remote is not None and others >= max_remote:
        problems.append(f"remote_workers: this collector takes at most {max_remote} "
                        "remote worker(s), and as many relays are registered")
    return problems


def rollout_problems(ours: dict[str, Any], hello: Hello) -> list[str]:
    """What forbids ``hello``'s host to run with the run's rollout options ``ours``.

    ``ours`` is ``RolloutOptions.to_wire()``. The welcome carries the options the
    hello names; a hello that does not name an option the run sets away from its
    default (a release before that option travelled: the host would run with its own
    value, silently) is refused naming it. A value the host's own command line set
    (one other than the default: ``asyncrl worker --info-key``,
    ``launch_hosts(info_keys=...)``) that differs from the run's is refused naming
    both: which one was meant is not ours to guess.
    """
    defaults = RolloutOptions().to_wire()
    theirs = hello.rollout
    lacking = [f"{name}={value!r}" for name, value in ours.items()
               if name not in theirs and value != defaults.get(name)]
    problems = []
    if lacking:
        problems.append(
            f"rollout options: this host cannot apply the trainer's {', '.join(lacking)} "
            "(its asyncrl release predates these options travelling in the welcome: it "
            "would run with its own values); upgrade asyncrl on the host")
    for name, value in ours.items():
        mine = theirs.get(name, value)
        if mine != value and mine != defaults.get(name):
            problems.append(
                f"rollout option {name}: this host was started with {mine!r:.200} and the "
                f"trainer's is {value!r:.200}; start the host without it (the trainer's "
                "rollout options reach every host in its welcome) or with the same value")
    return problems


def check_specs(reference: dict[str, Any], hello: Hello) -> list[str]:
    """Handshake check: the worker's env specs must equal the first worker's."""
    from .._rollout.envs import EnvSpecs

    try:
        theirs = EnvSpecs.from_dict(hello.specs)
    except ValueError as exc:
        return [f"specs: {exc}"]
    ours = EnvSpecs.from_dict(reference)
    return [f"specs: {line}" for line in ours.describe_mismatch(theirs)]


# -- error reports ----------------------------------------------------------------------------
def reporter(report: ErrorReport, sender: WorkerInfo | None, workers: Iterable[WorkerInfo],
             token: str) -> tuple[WorkerInfo | None, str] | None:
    """The worker a report speaks for and its name in messages; None: a stranger's report.

    ``sender``: the worker admitted as the report's peer, if any; ``token``: this
    run's spawn token ("" without local workers).
    """
    if sender is not None and sender.alive:
        return sender, f"{sender.index} ({sender.name})"
    if spawned_here(report, workers, token):
        return None, f"{report.slot} (failed before joining)"
    return None


def spawned_here(report: ErrorReport, workers: Iterable[WorkerInfo], token: str) -> bool:
    """A local worker's report sent before it was admitted (its env failed to build)."""
    if report.slot < 0 or not token or not report.token:
        return False
    if any(w.index == report.slot and w.alive for w in workers):
        return False  # that slot's worker is live and speaks for itself
    return secrets.compare_digest(report.token.encode(), token.encode())


__all__ = ["REQUIRED_KEYS", "BatchChecker", "check_specs", "hello_problems", "relay_hello_problems",
           "reporter", "rollout_problems", "spawned_here"]
