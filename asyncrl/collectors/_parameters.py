'''The collectors' ``Parameters`` sections, from one table of argument descriptions.

:class:`~asyncrl.Collector` and :class:`~asyncrl.MultiCollector` take many of
TorchRL's arguments with the same meaning: each description is written once,
in :data:`SHARED`. Each collector's section lists its arguments in the order
``help()`` shows them, numpy-style (a heading line, its text indented); a
heading without text takes the shared description, so a change to one reaches
both collectors' ``help()`` and ``docs/api.md``.

>>> print(parameters_section("total_frames\\nprefetch\\n    Batches ahead.\\n"))
Parameters
----------
total_frames
    Frames to collect before the iteration ends; -1 or None: no end.
prefetch
    Batches ahead.
'''

from __future__ import annotations

import textwrap


def _entries(text: str) -> dict[str, str]:
    """``{heading: description}`` of numpy-style entries (the description may be empty)."""
    entries: dict[str, str] = {}
    heading = None
    for line in textwrap.dedent(text).strip("\n").splitlines():
        if line and not line[0].isspace():
            heading = line
            entries[heading] = ""
        elif heading is None:
            raise ValueError(f"a description before any heading: {line!r}")
        else:
            entries[heading] += line + "\n"
    return {heading: textwrap.dedent(body).rstrip() for heading, body in entries.items()}


#: The arguments both collectors take with the same meaning, described once.
SHARED = _entries("""
    total_frames
        Frames to collect before the iteration ends; -1 or None: no end.
    max_frames_per_traj
        Truncate a trajectory after this many steps (``("next", "truncated")`` set).
    reset_at_each_iter
        Reset every env at the start of each batch.
    reset_when_done
        Reset an env when its episode ends (TorchRL's default True).
    split_trajs
        Split each batch into padded trajectories (TorchRL's ``split_trajectories``).
    postproc
        A callable applied to each batch before it is yielded.
    set_truncated
        Mark the last step of each batch's trajectories as truncated.
    exploration_type
        TorchRL's exploration type the policy runs under (``"random"``, ``"mode"``,
        ``"mean"``, ``"deterministic"``, or None: leave it as it is).
    policy_in_keys
        A plain module's inputs: the observation keys given to it, positionally (default:
        every observation key, in the env's order). See ``docs/gymnasium.md``.
    policy_out_keys
        A plain module's outputs: the keys a tensor, a tuple (in order) or a dict (by its
        keys) is written to; one must be ``"action"`` (default ``("action",)``).
    policy_method
        The method of a plain module called instead of ``forward`` (CleanRL's
        ``"get_action_and_value"``).
    info_keys
        Gymnasium ``info`` entries put into the batch under ``"next"`` (TorchRL's
        ``default_info_dict_reader`` layout): a list of keys (a dict entry such as
        RecordEpisodeStatistics' ``"episode"`` becomes a nested TensorDict; a tuple key
        takes one leaf), or ``{key: dtype or (shape, dtype)}``. Specs come from a first
        random step and are checked at every step; see ``docs/gymnasium.md``.
    update_at_each_batch
        Call ``update_policy_weights()`` before each batch.
    compact_obs
        True: batches without the ``("next", K)`` twin of each observation / state key
        ``K`` (TorchRL's meaning: within a trajectory, a step's next observation is the
        following step's ``K``). Default False: TorchRL's full layout.
    trajs_per_batch, traj_format, extend_buffer
        Batches of whole trajectories (``"padded"`` with ``("collector", "mask")``, or
        ``"cat"``) and how a replay buffer is written, with TorchRL 0.14's meaning
        (``docs/batch_shapes.md``).
    """)

#: :class:`~asyncrl.MultiCollector` (and its two subclasses).
MULTI_PARAMETERS = """
    create_env_fn
        What each worker steps: a gymnasium id (``"CartPole-v1"``), an import path
        (``"pkg.mod:make_env"``), a callable returning a gymnasium or TorchRL env, or a
        list with one of those per local worker.
    policy
        An ``nn.Module``, a ``TensorDictModule``, a callable from observations to
        actions, or None (random actions). Each worker gets a copy; a module's weights
        are then kept in sync (``update_policy_weights``, ``weight_sync_schemes``).
    num_workers
        Local worker processes (default: one per entry of a ``create_env_fn`` list,
        else required unless ``remote_workers`` join instead).
    sync
        Only on ``MultiCollector``: True (default) builds a ``MultiSyncCollector``,
        False a ``MultiAsyncCollector``.
    policy_factory
        A callable (or ``"pkg.mod:factory"`` import path) each worker calls to build its
        own policy, instead of pickling ``policy``.
    policy_in_keys
    policy_out_keys
    policy_method
    info_keys
    frames_per_batch
        ``MultiSyncCollector``: frames per yielded batch, split over the workers (one
        share each), or one int per worker. ``MultiAsyncCollector``: frames per yielded
        batch, which one worker collects whole: *each* worker collects
        ``frames_per_batch`` frames per batch (TorchRL's meaning), so N workers hold up to
        N x ``prefetch`` x ``frames_per_batch`` frames ahead of the trainer.
    total_frames
    create_env_kwargs
        Keyword arguments for ``create_env_fn``: one dict, or a list of one dict per
        local worker.
    envs_per_worker
        Envs each worker steps together, as one vector env (TorchRL's batched envs).
    max_frames_per_traj
    init_random_frames
        Frames collected with random actions before the policy is used (split over the
        workers).
    reset_at_each_iter
    reset_when_done
    split_trajs
    postproc
    set_truncated
    exploration_type
    cat_results
        Sync mode: how shares are joined: ``"stack"`` or None (default, as TorchRL: a
        new leading workers dimension), 0 (along envs), 1 or -1 (along time); see
        ``docs/batch_shapes.md``.
    preemptive_threshold
        Sync mode: once this fraction of the workers delivered, the others are cut short
        (TorchRL's meaning; None: never).
    update_at_each_batch
    replay_buffer
        Anything with ``.extend(td)``: iteration yields None and the collector extends
        it with each batch's frames (TorchRL's meaning); ``start()`` does the same in
        the background.
    weight_sync_schemes
        ``{model_id: scheme}`` (:mod:`asyncrl.weights`); by default ``"policy"`` syncs
        over ZeroMQ when ``policy`` is a module.
    prefetch
        Async mode: batches each worker may run ahead of the trainer (back-pressure).
    device, policy_device, env_device, storing_device
        TorchRL's device arguments with TorchRL's meaning (see Devices above and
        ``docs/devices.md``).
    on_worker_loss
        ``"raise"`` (default), ``"continue"``, ``"wait"`` or ``"restart"``: see above.
    backend
        The anyio backend of the workers' event loops (default: the trainer's).
    heartbeat_interval
        Seconds between heartbeats on every trainer-worker connection.
    peer_timeout
        Seconds of silence after which a peer counts as lost (a worker exits, the
        coordinator applies ``on_worker_loss``).
    sample_timeout
        Seconds a worker that owes a batch (a credit, or its share of a sync round) may
        go without an env step before it counts as lost, by ``on_worker_loss`` (default
        60, as RLlib's ``sample_timeout_s``; None: never). Heartbeats show that a
        process is alive, not that its env's ``step()`` or its policy returns; a worker
        reports its step count about once a second while it collects. A batch may take
        longer as long as its steps return: such a worker is never lost for it (one
        WARNING a run gives the measured time per batch). Set it above the time one
        step takes, the policy's first call included, and a few seconds at least.
    replacement_timeout
        ``on_worker_loss="wait"`` or ``"restart"``: seconds the trainer may be blocked
        waiting for a lost worker's replacement (a sync round that lacks its share, an
        async run with no worker left) before the run fails with ``WorkerLostError``
        naming the slot (default 300; None: no bound). While it waits it says so: a
        ``"waiting"`` event, a ``"waiting"`` line in ``statistics().workers`` and a
        WARNING every 30 s.
    startup_timeout
        Seconds the trainer's first call (``async for``, ``next_batch``...) waits for
        every worker to join (the ``num_workers`` local processes and the
        ``remote_workers`` hosts) before the run fails with ``CollectorError`` naming
        the empty places, ``listen`` and the hellos refused meanwhile (default 300: time
        to start hosts by hand after the trainer, and for a cold host to import torch
        and build its envs; None: no bound). While it waits it says so: a ``"waiting"``
        event, ``statistics().state == "waiting"`` and a WARNING every 30 s.
    listen
        Bind the coordinator here (``"tcp://0.0.0.0:5555"``; port 0 picks one, see
        ``endpoint``) so that ``asyncrl worker`` hosts can join; default: a private
        ``ipc://`` socket for the local workers only.
    remote_workers
        Remote workers to wait for (``asyncrl worker --connect ...``) besides the local
        ones.
    curve_keys
        A directory made by ``asyncrl keys generate``: CURVE encryption and
        authentication on ``listen``.
    max_message_bytes
        Largest message a listening coordinator accepts (default: derived from the batch
        and the policy's size).
    shared_memory_batches
        Local workers write their batches into shared memory the trainer made (``/dev/shm``),
        and only a small notice crosses the socket (default True); remote workers always
        use the socket. False: every batch crosses the socket. A ``/dev/shm`` too small
        falls back to the socket with one WARNING.
    compact_obs
    num_threads
        Torch threads of the trainer's process while the collector is open (default:
        the machine's threads minus the local workers, at least 1).
    num_sub_threads
        Torch threads of each worker (TorchRL's name, default 1).
    start_method
        ``"forkserver"`` (default: a warm fork server) or ``"spawn"``.
    trajs_per_batch, traj_format, extend_buffer
    **torchrl_options
        TorchRL 0.14's other collector arguments: accepted with effect or refused, see
        above.
    """

#: The in-process :class:`~asyncrl.Collector`.
IN_PROCESS_PARAMETERS = """
    create_env_fn
        What to step: a gymnasium id (``"CartPole-v1"``), an import path
        (``"pkg.mod:make_env"``) or a callable returning a gymnasium or TorchRL env.
    policy
        An ``nn.Module``, a ``TensorDictModule``, a callable from observations to
        actions, or None (random actions). Shared with the trainer, not copied.
    policy_factory
        A callable (or ``"pkg.mod:factory"``) that builds the policy instead.
    policy_in_keys
    policy_out_keys
    policy_method
    info_keys
    frames_per_batch
        Frames per yielded batch (a multiple of ``envs_per_worker``).
    total_frames
    create_env_kwargs
        Keyword arguments for ``create_env_fn``.
    envs_per_worker
        Envs stepped together as one vector env.
    max_frames_per_traj
    init_random_frames
        Frames collected with random actions before the policy is used.
    reset_at_each_iter
    reset_when_done
    split_trajs
    postproc
    set_truncated
    exploration_type
    update_at_each_batch
    replay_buffer
        Anything with ``.extend(td)``: ``start()`` collects into it in the background.
    device, policy_device, env_device, storing_device
        TorchRL's device arguments with TorchRL's meaning (``docs/devices.md``):
        ``device`` is the default of the others, the policy runs on
        ``policy_device``, batches are stored on ``storing_device``; a device this
        machine lacks is an error here.
    return_same_td
        True: yield the rollout's own buffers (rewritten by the next batch) instead of a
        copy (TorchRL's meaning).
    compact_obs
    trajs_per_batch, traj_format, extend_buffer
    **torchrl_options
        TorchRL's other ``Collector`` arguments: accepted with effect or refused, see
        above.
    """


def parameters_section(entries: str) -> str:
    """A ``Parameters`` section of ``entries``: a heading without text takes :data:`SHARED`'s."""
    lines = ["Parameters", "----------"]
    for heading, description in _entries(entries).items():
        if not description:
            try:
                description = SHARED[heading]
            except KeyError:
                raise ValueError(f"{heading!r} has no description here nor in SHARED") from None
        lines += [heading, textwrap.indent(description, "    ")]
    return "\n".join(lines)


__all__ = ["IN_PROCESS_PARAMETERS", "MULTI_PARAMETERS", "SHARED", "parameters_section"]
