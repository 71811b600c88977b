"""Central inference (AsyncBatchedCollector): everything but the public class.

The collector holds one :class:`~.policy_server.PolicyServer` (a thread,
:mod:`.thread_server`, or a dedicated process, :mod:`.process_server` and
:mod:`.inference_process`) that runs the batching :mod:`.inference_loop`; the
env workers (:mod:`.env_stepper`, remote ones :mod:`.remote_env_stepper`) reach it
through :mod:`.local_channels` (shared memory, doorbells, chunk rings) or the hub
(:mod:`.remote_env_hosts`). docs/inference.md, "Where the code is", lists every module.
"""
