"""One failover run's open connections: every node of the shard's topology, retired cluster members included."""

from __future__ import annotations

import redis

from opsctl.net.admin import Admin
from opsctl.net.connector import Connector
from opsctl.net.observer import Observer, to_facts
from opsctl.plan.facts import NodeFacts
from opsctl.providers.base import Provider
from opsctl.slots.members import cluster_members
from opsctl.spec.layout import sentinel_master_name


class Session:
    """Open connections to every node for the whole run: each observation is one parallel round trip. In a cluster
    also to the nodes a larger spec had that the cluster still knows (a scale-in's, drained after the restarts):
    they vote and must agree like the others (looked for once; a second Observer only when there are some)."""

    def __init__(self, connector: Connector, provider: Provider | None = None) -> None:
        """provider: where the servers run, to stop a master that is gone from the network but may still run
        (a forced promotion's fence); None: not asked for (every other failover)."""
        self.connector = connector
        self.provider = provider
        self.loaded = connector.loaded
        self.observer = Observer(connector, self.loaded.layout.nodes, timeout=1.0)
        if self.loaded.spec.topology == "cluster":
            views = [o.cluster_nodes for o in self.observer.observe().values() if o.cluster_nodes]
            members = cluster_members(self.loaded, views)
            if len(members) > len(self.loaded.layout.nodes):
                self.observer.close()
                self.observer = Observer(connector, members, timeout=1.0)

    def facts(self) -> dict[str, NodeFacts]:
        return to_facts(self.observer.observe())

    def admin(self, name: str) -> Admin:
        return self.observer.admins[name]

    def quorum(self) -> dict[str, str]:
        name = sentinel_master_name(self.loaded.spec)
        futures = {n.name: self.observer.pool.submit(_ckquorum, self.admin(n.name), name)
                   for n in self.loaded.layout.sentinels}
        return {n: f.result() for n, f in futures.items()}

    def close(self) -> None:
        self.observer.close()


def _ckquorum(admin: Admin, name: str) -> str:
    try:
        return str(admin.call("SENTINEL", "CKQUORUM", name))
    except (redis.RedisError, OSError) as exc:
        return f"error: {exc}"
