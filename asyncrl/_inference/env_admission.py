"""The one admission, as central inference uses it: env workers, their layout, their token.

AsyncBatchedCollector admits its env workers, local and remote, with the admission
every worker passes (:class:`asyncrl._coordinator.admission.Admission`): the one
hello, its role ``"env"``, refusals naming why, ``remote_workers`` as a limit (with
the places held for a host group), a spawn token for the local ones, and, for a
remote host that lacks the run's gymnasium id, where the trainer's id is registered
(its import path, :class:`~asyncrl._rollout.env_ids.EnvIdSource`). What it judges of
an env worker is its envs' layout (:class:`~asyncrl._protocol.EnvLayout`, its hello's
``specs``) against the collector's, and, when the collector has ``info_keys``, whether
its hello says it writes their columns (a host of an earlier release does not: refused
here, not at its first chunk); a local worker's is checked against its blocks where it
runs.

>>> from asyncrl._protocol import PROTOCOL, EnvLayout, Hello
>>> ours = EnvLayout(envs=1, obs=[("float32", [3])], action=("int64", []))
>>> admission = env_admission(Roster(), ours, max_envs=4, first_remote_index=1,
...                           remote_workers=1, token="t")
>>> hello = Hello(protocol=PROTOCOL, name="h", host="h", pid=1, role="env",
...               specs=EnvLayout(envs=8, obs=ours.obs, action=ours.action).to_specs())
>>> print(admission.refusal(b"peer", hello)[0].message.reason)  # doctest: +ELLIPSIS
specs: hello specs field 'envs' must be an int in 1..4 (this collector's max_batch_size), got 8
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transports import ProtocolError

from .._coordinator.admission import Admission, AdmissionTerms
from .._coordinator.config import CoordinatorConfig
from .._coordinator.records import Roster
from .._protocol import EnvLayout, Hello
from .._rollout.env_ids import EnvIdSource

__all__ = ["env_admission", "infos_problem", "layout_check"]


def infos_problem(infos: Sequence[Sequence[str]], hello: Hello) -> list[str]:
    """Why a remote env host cannot write this collector's info columns (``infos``: their
    key paths under ``"next"``): its hello does not say it reads them from its welcome
    (:data:`~asyncrl._protocol.central_inference.WRITES_INFOS`). The refusal its first
    chunk would get, at once.

    >>> from asyncrl._protocol import PROTOCOL, Hello
    >>> from asyncrl._protocol.central_inference import WRITES_INFOS
    >>> old = Hello(protocol=PROTOCOL, name="h", host="h", pid=1, role="env", specs={})
    >>> print(infos_problem([("steps",)], old)[0])  # doctest: +ELLIPSIS
    infos: its chunks would lack [('next', 'steps')], the info entries this ... there
    >>> old.rollout = dict(WRITES_INFOS)
    >>> infos_problem([("steps",)], old)
    []
    """
    if not infos or "info_keys" in hello.rollout:
        return []
    missing = [("next", *path) for path in infos]
    return [f"infos: its chunks would lack {missing[:8]}, the info entries this collector's "
            "info_keys asks for in its welcome: a host of an earlier asyncrl release ignores "
            "them (its hello does not say it writes them), run the trainer's release there"]


def layout_check(ours: EnvLayout, *, max_envs: int, infos: Sequence[Sequence[str]] = ()
                 ) -> Callable[[dict[str, Any], Hello], list[str]]:
    """The admission's ``check_specs`` for env workers: a remote hello's layout against
    ``ours`` (its ``envs`` at most ``max_envs``: the collector's ``max_batch_size``), and
    whether it writes the info columns ``infos`` (:func:`infos_problem`)."""

    def problems(reference: dict[str, Any], hello: Hello) -> list[str]:
        if hello.slot >= 0:  # a local worker: its blocks are checked where it runs
            return []
        try:
            theirs = EnvLayout.from_specs(hello.specs, max_envs=max_envs)
        except ProtocolError as exc:
            return [f"specs: {exc}"]
        return theirs.problems(ours) + infos_problem(infos, hello)

    return problems


def env_admission(roster: Roster, ours: EnvLayout, *, max_envs: int, first_remote_index: int,
                  remote_workers: int, token: str, env_id: Any = None,
                  infos: Sequence[Sequence[str]] = ()) -> Admission:
    """The admission of one AsyncBatchedCollector's env workers into ``roster``.

    Local workers hold slots ``0 .. first_remote_index - 1`` (spawned with ``token``);
    up to ``remote_workers`` remote ones at a time take indices after them. ``env_id``:
    the collector's env, whose registration a remote host that lacks it is offered;
    ``infos``: the key paths of its info columns (``info_keys``), which a remote host
    must say it writes.
    """
    # No share: an env worker's welcome is EnvWelcome, which carries no frames per batch.
    config = CoordinatorConfig(sync=False, share_frames=(0,), role="env",
                               first_remote_index=first_remote_index,
                               accept_remote=remote_workers > 0,
                               max_remote_workers=remote_workers)
    terms = AdmissionTerms(token=token, specs=ours.to_specs(),
                           check_specs=layout_check(ours, max_envs=max_envs, infos=infos),
                           env_source=EnvIdSource.of(env_id) if isinstance(env_id, str) else None)
    return Admission(roster, config, terms)
