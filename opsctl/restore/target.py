"""A restore's target: its masters, how keys route to them, its server and the room each master has; a cluster
that is not converged, or a replication topology without exactly one master, is refused before anything is read."""

from __future__ import annotations

from dataclasses import dataclass

from opsctl.backup.savers import Server, parse_keyspace
from opsctl.base.errors import RefusedError
from opsctl.net.connection import connection_to
from opsctl.net.connector import Connector
from opsctl.net.observer import describe as describe_problems
from opsctl.net.observer import observe
from opsctl.observe.cluster_state import observed_problems
from opsctl.observe.replies import SLOTS, server_of
from opsctl.restore.engine import Targets
from opsctl.restore.route import Router, cluster_router
from opsctl.server.versions import server_text
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec

PIPE_TIMEOUT = 120.0  # a copy's pipe waits this long for a reply (a RESTORE of a big key, a loaded target)


@dataclass
class Target:
    connector: Connector
    masters: list[Node]
    router: Router
    cluster: bool
    server: Server
    keys: int
    room: list[tuple[str, int, int, float]]

    @property
    def loaded(self) -> LoadedSpec:
        return self.connector.loaded

    def targets(self) -> Targets:
        """The masters' handles; each pipe opened on them is its opener's (nothing to close here)."""
        return Targets([connection_to(self.connector, m, PIPE_TIMEOUT) for m in self.masters], self.router,
                       self.cluster)


def inspect_target(connector: Connector) -> Target:
    """The target's masters, slot routing, server and room; refuses a cluster that is not converged."""
    loaded = connector.loaded
    seen = observe(connector, loaded.layout.servers)
    if loaded.spec.topology == "cluster":
        problems = observed_problems(seen)
        if problems:
            raise RefusedError("the target cluster is not ready for a restore (nothing was written)",
                               describe_problems(problems), "`opsctl cluster check -f SPEC` and `opsctl cluster fix` "
                               "show and close open slots; start down nodes with `opsctl apply`")
        view = next(o.cluster_nodes for o in seen.values() if o.cluster_nodes is not None)
        lines = [line for line in view if line.is_master and line.slots]
        endpoints = [f"{line.address}:{line.port}" for line in lines]
        masters = [_known(loaded, e) for e in endpoints]
        router = cluster_router(lines, endpoints)
        shares = [sum(e - s + 1 for s, e in line.slots) / SLOTS for line in lines]
    else:
        masters = [o.node for o in seen.values() if o.reachable and o.role and o.role.kind == "master"]
        if len(masters) != 1:
            raise RefusedError(f"the target has {len(masters)} reachable masters, a restore needs exactly one",
                               ", ".join(m.name for m in masters) or "none answers", "`opsctl status -f SPEC`")
        router, shares = Router(), [1.0]
    infos = [seen[m.name].info for m in masters]
    return Target(connector, masters, router, loaded.spec.topology == "cluster", one_server(infos, "target"),
                  sum(k for info in infos for k, _ in parse_keyspace(info).values()),
                  [(m.name, int(i.get("used_memory", "0")), int(i.get("maxmemory", "0")), share)
                   for m, i, share in zip(masters, infos, shares, strict=True)])


def _known(loaded: LoadedSpec, endpoint: str) -> Node:
    node = loaded.layout.find(endpoint)
    if node is None:
        raise RefusedError(f"the target cluster has a master {endpoint} that the spec does not list",
                           hint="apply the spec first (`opsctl plan -f SPEC`)")
    return node


def one_server(infos: list[dict[str, str]], what: str) -> Server:
    servers = {s for info in infos if (s := server_of(info))}
    if len(servers) != 1:
        raise RefusedError(f"the {what} masters run {len(servers)} different server versions",
                           ", ".join(server_text(*s) for s in servers) or "unknown",
                           "finish the rolling change first (`opsctl apply`)")
    return servers.pop()
