"""The write fence, I/O part: the old master refuses writes until it is a replica, even if opsctl dies.

`min-replicas-to-write` above any replica count makes the old master answer NOREPLICAS to every write (Sentinel,
plain replication); unlike the write pause it outlives opsctl. Lifted once the old master is a replica or nothing was
promoted; a re-run finishes it (docs/runbooks/killed-failover.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from opsctl.base.errors import NodeError, OpsctlError, RefusedError
from opsctl.base.events import Emit, Note
from opsctl.base.poll import Pending, wait_for
from opsctl.failover.announce import entries
from opsctl.net.connection import Connection
from opsctl.net.resp import text
from opsctl.observe.replies import ROLE
from opsctl.plan.facts import FENCE, MAX_LAG, TO_WRITE, fenced, spec_values
from opsctl.spec.layout import Node, canonical_address, endpoint, sentinel_master_name
from opsctl.spec.load import LoadedSpec

__all__ = ["Finished", "fence", "fenced_nodes", "finish", "repoint_followers", "unfence"]


def fence(node: Connection) -> None:
    """Refuse writes from now on. max-lag 0 would switch the check off, so it is kept at least 1."""
    lag = node.config_get(MAX_LAG).get(MAX_LAG, "10")
    node.call("CONFIG", "SET", TO_WRITE, FENCE, MAX_LAG, lag if lag != "0" else "10")


def unfence(node: Connection, values: Mapping[str, str], rewrite: bool = True) -> None:
    """The spec's values back; CONFIG REWRITE, since Sentinel's own rewrite may have saved the fence."""
    node.call("CONFIG", "SET", *(v for pair in values.items() for v in pair))
    if rewrite:
        node.call("CONFIG", "REWRITE")


@dataclass(frozen=True)
class Finished:
    node: str
    action: str  # demoted | lifted
    master: str | None = None

    def line(self) -> str:
        if self.action == "demoted":
            return f"{self.node}: fenced old master made a replica of {self.master}, fence lifted"
        now = f"replica of {self.master}" if self.master else "no replica was promoted"
        return f"{self.node}: write fence lifted ({now})"


def finish(loaded: LoadedSpec, handle_of: Callable[[Node], Connection], emit: Emit,
           what: str = "interrupted failover finished") -> list[Finished]:
    """Finish every interrupted failover of a replication or Sentinel topology, deciding from live state."""
    if loaded.spec.topology not in ("replication", "sentinel"):
        return []
    servers = loaded.layout.servers
    walls = fenced_nodes(loaded, handle_of)
    if not walls:
        return []
    if loaded.spec.topology == "sentinel":
        topo = loaded.spec.sentinel_or_default()
        _wait_sentinel_failovers(loaded, handle_of, walls, (topo.down_after_ms + topo.failover_timeout_ms) / 1000)
    done = [_finish_one(loaded, node, handle_of, servers) for node in walls]
    for item in done:
        emit(Note(f"{what}: {item.line()}"))
    return done


def fenced_nodes(loaded: LoadedSpec, handle_of: Callable[[Node], Connection]) -> list[Node]:
    if loaded.spec.topology not in ("replication", "sentinel"):
        return []
    return [n for n in loaded.layout.servers if fenced(_config(handle_of(n)))]


def _config(node: Connection) -> dict[str, str] | None:
    try:
        return node.config_get(TO_WRITE)
    except NodeError:
        return None


def _role_of(node: Connection) -> tuple[str, tuple[str, int] | None] | None:
    try:
        role = node.read(ROLE)
    except NodeError:
        return None
    return role.kind, role.master


def _finish_one(loaded: LoadedSpec, node: Node, handle_of: Callable[[Node], Connection],
                servers: Sequence[Node]) -> Finished:
    handle = handle_of(node)
    values = spec_values(loaded, node)
    role = _role_of(handle)
    if role is None:
        raise OpsctlError(f"{node.name} is fenced by an interrupted failover but does not answer ROLE",
                          hint="apply again when it answers")
    if role[0] != "master":
        unfence(handle, values)
        upstream = _node_at(loaded, role[1])
        return Finished(node.name, "lifted", upstream.name if upstream else str(role[1]))
    others = [n for n in servers if n.name != node.name and (r := _role_of(handle_of(n))) and r[0] == "master"
              and not fenced(_config(handle_of(n)))]
    if len(others) > 1:
        raise RefusedError(f"{node.name} is fenced and {len(others)} other nodes are masters: "
                           f"{', '.join(n.name for n in others)}",
                           "opsctl cannot tell which one the interrupted failover promoted",
                           "keep the master that holds the newest data, make the others its replicas by hand")
    if not others:
        _refuse_with_silent_peers(loaded, node, handle_of, servers)
        unfence(handle, values)
        return Finished(node.name, "lifted")
    master = others[0]
    handle.call("REPLICAOF", master.address, str(master.port))
    unfence(handle, values)
    if loaded.spec.topology == "replication":  # Sentinel re-points the others itself
        repoint_followers(loaded, node, master, handle_of)
    return Finished(node.name, "demoted", master.name)


def _refuse_with_silent_peers(loaded: LoadedSpec, node: Node, handle_of: Callable[[Node], Connection],
                              servers: Sequence[Node]) -> None:
    """A fenced master with no other master in sight may still have one: a replica the interrupted failover
    promoted that does not answer now (stalled, cut off). Lifting the fence then makes two masters take writes.
    Lifted only when every other server answers, or when the sentinels name this node as their master."""
    silent = [n.name for n in servers if n.name != node.name and _role_of(handle_of(n)) is None]
    if not silent or _sentinels_name(loaded, node, handle_of):
        return
    raise RefusedError(f"{node.name} is fenced by an interrupted failover and {', '.join(silent)} "
                       f"{'does' if len(silent) == 1 else 'do'} not answer",
                       "a node that does not answer may be the replica that failover promoted: lifting the fence "
                       f"now could leave two masters taking writes ({node.name} refuses writes until then)",
                       "bring it back (`opsctl apply` starts a stopped node first), then run again; if it is lost "
                       "for good, remove it from the spec first")


def _sentinels_name(loaded: LoadedSpec, node: Node, handle_of: Callable[[Node], Connection]) -> bool:
    """Do the sentinels that answer (at least one) all name node as their master?"""
    if loaded.spec.topology != "sentinel":
        return False
    name, named = sentinel_master_name(loaded.spec), []
    for sentinel in loaded.layout.sentinels:
        try:
            reply = text(handle_of(sentinel).call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name))
        except NodeError:
            continue
        if isinstance(reply, list) and len(reply) == 2:
            named.append((canonical_address(str(reply[0])), int(str(reply[1]))))
    return bool(named) and set(named) == {(canonical_address(node.address), node.port)}


def _node_at(loaded: LoadedSpec, address: tuple[str, int] | None) -> Node | None:
    return loaded.layout.find(endpoint(*address)) if address else None


def repoint_followers(loaded: LoadedSpec, old: Node, master: Node,
                      handle_of: Callable[[Node], Connection]) -> list[str]:
    """The servers still following old, a demoted master, pointed at master (plain replication: FAILOVER TO and a
    REPLICAOF leave them chained behind old, and no Sentinel re-points them); their names. None while old answers
    as a master: then they are its replicas, not chained (two masters are for the checks to judge)."""
    if (role := _role_of(handle_of(old))) is not None and role[0] == "master":
        return []
    moved = []
    for other in loaded.layout.servers:
        role = _role_of(handle_of(other)) if other not in (old, master) else None
        if role and _node_at(loaded, role[1]) == old:
            handle_of(other).call("REPLICAOF", master.address, str(master.port))
            handle_of(other).call("CONFIG", "REWRITE")
            moved.append(other.name)
    return moved


def _wait_sentinel_failovers(loaded: LoadedSpec, handle_of: Callable[[Node], Connection], walls: Sequence[Node],
                             timeout: float) -> None:
    """Decide only once no Sentinel failover is in flight (a SENTINEL FAILOVER sent just before opsctl died may
    still promote) and no sentinel sees a fenced master as down (one that just started may be about to be
    failed over: that clears within a ping period once it answers)."""
    name = sentinel_master_name(loaded.spec)
    fenced_at = {endpoint(n.address, n.port) for n in walls}

    def quiet() -> bool | Pending:
        busy = []
        for node in loaded.layout.sentinels:
            try:
                masters = entries(handle_of(node), "MASTERS")
            except NodeError:
                continue
            master = next((m for m in masters if m.get("name") == name), {})
            flags = master.get("flags", "").split(",")
            down = endpoint(master.get("ip", ""), int(master.get("port", "0") or 0)) in fenced_at and \
                bool({"s_down", "o_down"} & set(flags))
            if "failover_in_progress" in flags or down:
                busy.append(f"{node.name} ({master.get('flags')})")
        return Pending(f"sentinels busy: {', '.join(busy)}") if busy else True

    wait_for(quiet, timeout, "Sentinel's failover to finish", interval=0.05)
