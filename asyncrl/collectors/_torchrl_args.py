"""TorchRL collector arguments asyncrl takes as they are, or refuses naming the asyncrl way.

A script ported from TorchRL passes TorchRL 0.14's constructor arguments. The
collectors take the ones they implement as ordinary parameters; every other
TorchRL argument lands here (``**torchrl_options``) and is checked against one
table per collector: a value with TorchRL's meaning in asyncrl is accepted
(mostly TorchRL's default: asyncrl always does what it says), anything else is
refused with a message that says what asyncrl does instead. Nothing is ignored
silently, and a misspelt argument still fails as Python would, with the
nearest known names.

>>> check_torchrl_options("MultiSyncCollector", {"use_buffers": True}, MULTI_COLLECTOR)
>>> try:
...     check_torchrl_options("MultiSyncCollector", {"compile_policy": True}, MULTI_COLLECTOR)
... except TypeError as exc:
...     print(str(exc).split(": ")[0], "policy_factory=" in str(exc))
MultiSyncCollector(compile_policy=True) True
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["IN_PROCESS_COLLECTOR", "MULTI_COLLECTOR", "TorchRLArgument",
           "check_torchrl_options"]


@dataclass(frozen=True)
class TorchRLArgument:
    """One TorchRL argument: the values asyncrl takes with its meaning, and what to do instead.

    ``accepts(value)`` is True for the values asyncrl honours; ``instead`` is
    the message for the others. When only TorchRL's default is accepted the
    argument is unsupported as such (``TypeError``); when other values are
    accepted too, a refused value is a ``ValueError``.
    """

    accepts: Callable[[Any], bool]
    instead: str
    only_default: bool = True


def _is_none(value: Any) -> bool:
    return value is None


def _falsy(value: Any) -> bool:
    return value is None or value is False or value == {}


def _none_or_true(value: Any) -> bool:
    return value is None or value is True


def _boolean(value: Any) -> bool:
    return value is None or isinstance(value, bool)


def _plain_collector_class(value: Any) -> bool:
    # The default, spelt out: each worker runs one single-process collector, which is
    # what an asyncrl worker is. Nested multi-process collectors are refused.
    if value is None:
        return True
    module = getattr(value, "__module__", "") or ""
    name = getattr(value, "__name__", "")
    return name in ("Collector", "SyncDataCollector") and module.startswith(("torchrl.",
                                                                           "asyncrl."))


def _direct_backend(value: Any) -> bool:
    return value is None or value == "direct"


_POLICY_FACTORY = ("pass policy_factory= (a module-level function, or 'package.module:name', "
                   "run in each worker) that returns the policy you want")
_SHARED = {
    "collector_class": TorchRLArgument(
        _plain_collector_class,
        "asyncrl workers run asyncrl's own rollout loop (the equivalent of TorchRL's "
        "Collector); for asynchronous collection use MultiAsyncCollector (or "
        "MultiCollector(sync=False)); for more machines, remote workers (listen=, "
        "remote_workers=, `asyncrl worker`)", only_default=False),
    "use_buffers": TorchRLArgument(
        _none_or_true,
        "asyncrl always writes into preallocated buffers (use_buffers=True); envs whose "
        "specs change shape between steps are not supported", only_default=False),
    "trust_policy": TorchRLArgument(
        _is_none,
        "asyncrl adapts every policy the same way (a TensorDictModule, an nn.Module or a "
        "callable on the observation) and checks its output once, at the first step; "
        "there is nothing to turn off: remove the argument"),
    "compile_policy": TorchRLArgument(
        _falsy, f"asyncrl does not compile policies itself: {_POLICY_FACTORY}, e.g. "
        "torch.compile(make_policy())"),
    "cudagraph_policy": TorchRLArgument(
        _falsy, f"asyncrl does not wrap policies in CUDA graphs: {_POLICY_FACTORY}, e.g. "
        "tensordict.nn.CudaGraphModule(make_policy())"),
    "no_cuda_sync": TorchRLArgument(
        lambda v: v is None or v is False,
        "asyncrl hands each batch to the trainer as a finished (copied) tensordict and makes "
        "no extra CUDA synchronisation to skip; remove the argument"),
    "weight_updater": TorchRLArgument(
        _is_none,
        "weight updaters are replaced by weight-sync schemes: pass weight_sync_schemes="
        "{'policy': ZmqWeightSyncScheme()} (or SharedMemWeightSyncScheme() on one host; "
        "from asyncrl.weights) and call update_policy_weights()"),
    "weight_recv_schemes": TorchRLArgument(
        _falsy,
        "an asyncrl collector only sends weights (weight_sync_schemes=); its workers "
        "receive them through the same schemes, there is no receiving side to configure"),
    "track_policy_version": TorchRLArgument(
        _boolean,
        "asyncrl always stamps each frame with ('collector', 'policy_version'), the version "
        "of the last update_policy_weights(); pass True, False or nothing (a PolicyVersion "
        "object is not supported)", only_default=False),
    "worker_idx": TorchRLArgument(
        _is_none,
        "asyncrl numbers its workers itself (each frame's ('collector', 'worker_id')); "
        "for several workers use MultiSyncCollector / MultiAsyncCollector(num_workers=N)"),
    "trajs_per_write": TorchRLArgument(
        _is_none,
        "with replay_buffer=, asyncrl writes each batch to the buffer as it arrives; for "
        "whole trajectories per batch use trajs_per_batch="),
    "auto_register_policy_transforms": TorchRLArgument(
        lambda v: v is None or v is False,
        "asyncrl does not add transforms to your env: append InitTracker() / "
        "policy.make_tensordict_primer() to the env in create_env_fn", only_default=False),
    "pre_collect_hook": TorchRLArgument(
        _is_none,
        "asyncrl has no per-batch hooks: use postproc= (runs on every batch, in the "
        "trainer), or put per-worker work in create_env_fn / policy_factory"),
    "post_collect_hook": TorchRLArgument(
        _is_none,
        "asyncrl has no per-batch hooks: use postproc= (runs on every batch, in the "
        "trainer), or iterate and act on each batch"),
}

#: MultiSyncCollector / MultiAsyncCollector (TorchRL's MultiCollector base).
#: Leaves out what other parts of asyncrl implement: devices (device, env_device,
#: policy_device, storing_device) and trajectory batches (trajs_per_batch,
#: traj_format, extend_buffer).
MULTI_COLLECTOR: Mapping[str, TorchRLArgument] = {
    **_SHARED,
    "init_fn": TorchRLArgument(
        _is_none,
        "asyncrl runs no extra function in its workers: do the setup in create_env_fn or "
        "policy_factory (module-level functions, run in each worker process)"),
}

#: The in-process Collector against TorchRL's Collector (``backend="direct"``).
IN_PROCESS_COLLECTOR: Mapping[str, TorchRLArgument] = {
    **_SHARED,
    "collector_class": TorchRLArgument(
        _is_none, "the in-process Collector runs its own rollout loop; for worker processes "
                  "use MultiSyncCollector / MultiAsyncCollector(num_workers=N)"),
    "backend": TorchRLArgument(
        _direct_backend,
        "asyncrl.Collector is TorchRL's backend='direct' (in this process); for worker "
        "processes use MultiSyncCollector / MultiAsyncCollector(num_workers=N), for other "
        "hosts their listen= and remote_workers=", only_default=False),
    "backend_options": TorchRLArgument(
        _falsy, "the in-process Collector has no backend to configure; for worker processes "
                "use MultiSyncCollector / MultiAsyncCollector(num_workers=N, ...)"),
    # Collector(num_collectors=N) / backend="process" build a MultiCollector before this
    # check (_torchrl_dispatch.py); what reaches the in-process collector is "direct".
    "num_collectors": TorchRLArgument(
        lambda v: v is None or v == 1,
        "for several collecting processes use MultiSyncCollector / "
        "MultiAsyncCollector(num_workers=N)", only_default=False),
    "sync": TorchRLArgument(
        _is_none, "sync= chooses between worker-process collectors: use "
                  "MultiCollector(num_workers=N, sync=True / False)"),
    "track_traj_ids": TorchRLArgument(
        _none_or_true,
        "asyncrl always writes ('collector', 'traj_ids') (the rollout keeps them without a "
        "per-step cost); remove the argument", only_default=False),
    "interruptor": TorchRLArgument(
        _is_none, "to end a sync round early use MultiSyncCollector(preemptive_threshold=...)"),
    "weight_sync_schemes": TorchRLArgument(
        _falsy,
        "the in-process Collector steps with the trainer's own policy object "
        "(InProcessWeightSyncScheme, built in): call update_policy_weights(), or use "
        "weight_sender() for send_async / wait_ack; a served module (a "
        "RayModuleTransformScheme's) needs no scheme here: "
        "update_policy_weights(w, model_id=name) updates the ServedModule open in this "
        "process under that name"),
}


def check_torchrl_options(collector: str, options: Mapping[str, Any],
                          table: Mapping[str, TorchRLArgument],
                          known: Iterable[str] = ()) -> None:
    """Accept the TorchRL ``options`` that keep their meaning; refuse the others, saying why.

    An argument TorchRL does not have either is a ``TypeError`` as Python
    would raise, with the nearest names among the table and ``known`` (the
    collector's own parameters).
    """
    for name, value in options.items():
        argument = table.get(name)
        if argument is None:
            close = difflib.get_close_matches(name, [*table, *known], n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise TypeError(f"{collector}() got an unexpected keyword argument {name!r}{hint}")
        if argument.accepts(value):
            continue
        error = TypeError if argument.only_default else ValueError
        raise error(f"{collector}({name}={_short(value)}): TorchRL's {name} is not "
                    f"supported as given: {argument.instead}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
