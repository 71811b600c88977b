"""A local Ray cluster of two raylets for the Ray tests (one per test module)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray


def two_raylets(env_hosts: int) -> Iterator[Any]:
    """A head and a second raylet with ``env_hosts`` of the custom ``env_host`` resource,
    with this process connected; shut down when the generator is closed."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"env_host": env_hosts})
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
