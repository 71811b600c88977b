"""A served module's address: plain data an env factory carries into every worker process.

:class:`ServedModuleHandle` names the shared-memory blocks, bells and claim file of one
:class:`~asyncrl.served.ServedModule` (strings and numbers only): it pickles into a
forkserver or spawned child with the env factory, and a client
(:class:`~asyncrl.served.ServedModuleClient`) attaches by those names. It holds no
descriptor and no code, and it only makes sense on the trainer's host (the client
checks: a process on another host gets an error saying so).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServedModuleHandle"]

#: (name, numpy dtype name, per-call shape) of one input or of the output.
Field = tuple[str, str, tuple[int, ...]]


@dataclass(frozen=True)
class ServedModuleHandle:
    """Where a served module is, and what a call gives and gets (from ``served.handle``).

    >>> handle = ServedModuleHandle(
    ...     name="env.transform[0]", host="h", pid=1, directory="/tmp/x", status="s",
    ...     blocks=(("o", "a"),), inputs=(("observation", "float32", (3,)),),
    ...     output=("reward", "float32", (1,)), call_timeout=10.0, spin=0.0)
    >>> handle.input_names, handle.clients
    (('observation',), 1)
    """

    name: str  # the model id its weights are updated by, e.g. "env.transform[0]"
    host: str  # the trainer's host name (blocks and bells are this host's)
    pid: int  # the serving process (the trainer's, or the host process's)
    directory: str  # the bells' and the claim file's directory
    status: str  # the status block's name (serving, closed, failed, and why)
    blocks: tuple[tuple[str, str], ...]  # per client slot: (request block, answer block)
    inputs: tuple[Field, ...]
    output: Field
    call_timeout: float  # seconds a call may wait for its answer
    spin: float  # seconds a caller spins before it sleeps on its bell
    #: "thread" (``pid`` is the trainer's), "process" or "ray" (its host process's, or
    #: its Ray actor's)
    server_backend: str = "thread"

    @property
    def clients(self) -> int:
        """How many callers (envs) may be connected at once."""
        return len(self.blocks)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.inputs)

    @property
    def info_key(self) -> tuple[str, str]:
        """The ``info_keys=`` entry that records this module's version per frame: a batch
        then holds it as ``("next", "served_versions", name)``."""
        return ("served_versions", self.name)
