"""Native cluster primitives and cluster creation, without redis-cli: every call goes through opsctl.admin.Admin,
or, for form_cluster, through an Observer's raw links.

form_cluster pipelines each node's setup into one round trip, MEETs, then polls every few ms (never 1 s sleeps).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from opsctl.admin import Admin
from opsctl.connector import Connector
from opsctl.errors import OpsctlError, RefusedError
from opsctl.observe.cluster_state import even_slot_ranges
from opsctl.observe.collect import (
    Command,
    Observer,
    Pending,
    cluster_info_pending,
    describe_lines,
    link_error,
    wait_converged,
    wait_for,
)
from opsctl.observe.parse import parse_cluster_nodes, parse_info
from opsctl.rawpipe import PIPE_ERRORS
from opsctl.resp import RespError, TextReply
from opsctl.spec.layout import Layout, Node
from opsctl.spec.load import LoadedSpec
from opsctl.versions import parse_version

SlotRange = tuple[int, int]


def myid(admin: Admin) -> str:
    return str(admin.call("CLUSTER", "MYID"))


def meet(admin: Admin, address: str, port: int) -> None:
    admin.call("CLUSTER", "MEET", address, port)


def slot_args(ranges: Iterable[SlotRange], has_range: bool = True) -> Command:
    """ADDSLOTSRANGE s e ... (>= 7.0) or ADDSLOTS s s+1 ... : one command either way."""
    if has_range:
        return ("CLUSTER", "ADDSLOTSRANGE", *(x for r in ranges for x in r))
    return ("CLUSTER", "ADDSLOTS", *(s for start, end in ranges for s in range(start, end + 1)))


def has_addslotsrange(loaded: LoadedSpec) -> bool:
    spec = loaded.spec.server
    return spec.flavor == "valkey" or parse_version(spec.version) >= (7, 0)


def assign_slots(admin: Admin, ranges: Sequence[SlotRange]) -> None:
    command = slot_args(ranges, has_addslotsrange(admin.loaded))
    admin.call(*command)


def set_config_epoch(admin: Admin, epoch: int) -> None:
    admin.call("CLUSTER", "SET-CONFIG-EPOCH", epoch)


def replicate(admin: Admin, master_id: str) -> None:
    admin.call("CLUSTER", "REPLICATE", master_id)


def forget(admin: Admin, node_id: str) -> None:
    admin.call("CLUSTER", "FORGET", node_id)


def reset_stale_identity(admin: Admin, node: Node, live_ids: Collection[str]) -> str | None:
    """Make a node that comes back with a forgotten cluster identity a new node before it meets the cluster.

    A node a scale-in removed keeps its nodes.conf: added again under the same name it starts with its old id and
    its old view of the cluster, and every node that FORGOT it ignores that id (banned for 60 s) and the gossip
    never converges. Such a node knows other nodes while the live cluster (live_ids) does not know it. Only an
    empty node is reset (CLUSTER RESET HARD: new id, epoch 0, forgets every node); keys or slots are refused, so
    no data is ever dropped. Returns the old id when it reset the node."""
    lines = parse_cluster_nodes(str(admin.raw("CLUSTER", "NODES")))
    me = next((line for line in lines if line.is_myself), None)
    if me is None or me.id in live_ids or len(lines) <= 1:
        return None
    keys = int(admin.client.dbsize())
    if keys or me.slots:
        raise RefusedError(f"{node.name} ({node.endpoint}) holds the identity of a node the cluster forgot "
                           f"({me.id[:8]}), with {keys} keys and {me.slot_count} slots",
                           "it was removed from the cluster and kept its data; joining it would need a reset "
                           "that drops that data",
                           f"keep what you need from {node.name}'s data folder, move the folder aside (or "
                           "destroy the node with --purge), then apply again")
    admin.call("CLUSTER", "RESET", "HARD")
    return me.id


HINT = "the node's log says more; `opsctl cluster check -f SPEC` shows the state"


def _checked(observer: Observer, node: Node, commands: Sequence[Command], doing: str) -> list[TextReply]:
    """One round trip over the observer's raw link to node (no redis-py: a new cluster's creation does not load
    it); a node that does not answer, or the first error reply, is an OpsctlError naming node and command."""
    try:
        replies = observer.links[node.name].pipeline(commands)
    except PIPE_ERRORS as exc:
        raise OpsctlError(f"{doing} failed on {node.name} ({node.endpoint})", link_error(exc), HINT) from None
    for cmd, reply in zip(commands, replies, strict=True):
        if isinstance(reply, RespError):
            words = " ".join(str(c) for c in cmd[:4])
            raise OpsctlError(f"{doing} failed on {node.name} ({node.endpoint})", f"{words}: {reply.message}", HINT)
    return replies


def _fresh_id(observer: Observer, node: Node) -> str:
    """The node's id, after checking it is a fresh, empty cluster node (knows only itself, no slots, no keys)."""
    cid, info, keys = _checked(observer, node, [("CLUSTER", "MYID"), ("CLUSTER", "INFO"), ("DBSIZE",)],
                               "inspection")
    state = parse_info(str(info))
    if state.get("cluster_known_nodes") != "1" or state.get("cluster_slots_assigned") != "0" or int(str(keys)):
        raise RefusedError(f"{node.name} ({node.endpoint}) is not a fresh empty cluster node",
                           f"knows {state.get('cluster_known_nodes')} nodes, "
                           f"{state.get('cluster_slots_assigned')} slots assigned, {keys} keys",
                           "form_cluster only creates new clusters; use the planner to change an existing one")
    return str(cid)


def setup_commands(epoch: int, ranges: Sequence[SlotRange], has_range: bool) -> list[Command]:
    """One node's setup in one round trip: its config epoch, and its slots if it is a master. Pure."""
    cmds: list[Command] = [("CLUSTER", "SET-CONFIG-EPOCH", epoch)]
    return cmds + ([slot_args(ranges, has_range)] if ranges else [])


def meet_commands(targets: Sequence[Node]) -> list[Command]:
    return [("CLUSTER", "MEET", n.address, n.port) for n in targets]


def first_meets(layout: Layout) -> dict[str, list[Node]]:
    """Whom each node MEETs in its setup round trip: each master every later master, each replica its own master
    only (it replicates before anyone else meets it, so every other node learns it as a replica). Pure."""
    masters = [layout.node(shard.master) for shard in layout.shards]
    targets = {m.name: masters[i + 1:] for i, m in enumerate(masters)}
    return targets | {r: [layout.node(shard.master)] for shard in layout.shards for r in shard.replicas}


def replica_meets(layout: Layout) -> dict[str, list[Node]]:
    """Whom each replica MEETs once every replica replicates: every other shard's master and every later replica
    (each pair of nodes meets once over both passes). Pure."""
    replicas = [(layout.node(r), shard.master) for shard in layout.shards for r in shard.replicas]
    return {node.name: [layout.node(s.master) for s in layout.shards if s.master != master]
            + [other for other, _ in replicas[i + 1:]] for i, (node, master) in enumerate(replicas)}


def slot_plan(layout: Layout) -> dict[str, list[SlotRange]]:
    """Each shard's master gets one even, contiguous range, in shard order. Pure."""
    ranges = even_slot_ranges(len(layout.shards))
    return {shard.master: [ranges[i]] for i, shard in enumerate(layout.shards)}


def _parallel(pool: Any, fn: Callable[[Node], Any], nodes: Sequence[Node]) -> dict[str, Any]:
    futures = {n.name: pool.submit(fn, n) for n in nodes}
    return {name: f.result() for name, f in futures.items()}


def _replicate_once_known(observer: Observer, layout: Layout, ids: Mapping[str, str], timeout: float) -> None:
    """CLUSTER REPLICATE on every replica, retried while one does not know its master yet (its MEET's handshake
    completes on the servers' 100 ms cluster cron): each replica starts its first sync as early as it can."""
    waiting = {r: ids[shard.master] for shard in layout.shards for r in shard.replicas}

    def attempt(node: Node) -> str | None:
        """None once node replicates; else why not yet."""
        try:
            reply = observer.links[node.name].pipeline([("CLUSTER", "REPLICATE", waiting[node.name])])[0]
        except PIPE_ERRORS as exc:
            raise OpsctlError(f"CLUSTER REPLICATE failed on {node.name} ({node.endpoint})", link_error(exc),
                              HINT) from None
        if not isinstance(reply, RespError):
            return None
        if "unknown node" not in reply.message.lower():
            raise OpsctlError(f"CLUSTER REPLICATE failed on {node.name} ({node.endpoint})", reply.message, HINT)
        return f"{node.name} does not know its master yet"

    def check() -> bool | Pending:
        nodes = [layout.node(name) for name in waiting]
        for node, why in zip(nodes, observer.pool.map(attempt, nodes), strict=True):
            if why is None:
                del waiting[node.name]
        return Pending(describe_lines(sorted(waiting))) if waiting else True

    wait_for(check, timeout, "every replica to know its master", interval=0.02)


def _all_known(observer: Observer, ids: Mapping[str, str], counted: set[str]) -> bool | Pending:
    """Every node knows every other one (no handshake left). Counts from CLUSTER INFO first (cheap; a node seen
    with the full count is not asked again), every CLUSTER NODES view once the counts are right."""
    counting = cluster_info_pending(observer, "cluster_known_nodes", str(len(ids)), counted)
    if counting is not None:
        return counting
    wanted = set(ids.values())
    for name, obs in observer.observe(info_section="server").items():
        if obs.cluster_nodes is None:
            return Pending(f"{name}: no cluster view ({obs.error})")
        known = {line.id for line in obs.cluster_nodes if not line.flags & {"handshake", "noaddr"}}
        if known != wanted:
            return Pending(f"{name} knows {len(known & wanted)} of {len(wanted)} nodes")
    return True


DISKLESS_LOAD = "repl-diskless-load"


def _load_from_socket(observer: Observer, node: Node) -> str | None:
    """While the cluster forms, an empty replica loads its first sync straight from the socket (on-empty-db: only
    into an empty data set, so nothing can be lost). Valkey 9.1 otherwise saves it to disk in a thread and loads
    it only at its once-a-second replication cron, up to 1 s later. Returns the value to put back (None: the
    node's own value loads from the socket already). The rendered config says repl-diskless-load, so a run killed
    before _put_back leaves drift the next plan sets back."""
    (value,) = _checked(observer, node, [("CONFIG", "GET", DISKLESS_LOAD)], "CONFIG GET")
    old = value[1] if isinstance(value, list) and len(value) == 2 else None
    if old != "disabled":
        return None
    _checked(observer, node, [("CONFIG", "SET", DISKLESS_LOAD, "on-empty-db")], "CONFIG SET")
    return str(old)


def _put_back(observer: Observer, node: Node, old: str) -> None:
    _checked(observer, node, [("CONFIG", "SET", DISKLESS_LOAD, old)], "CONFIG SET")


def form_cluster(connector: Connector, layout: Layout, timeout: float = 30.0) -> None:
    """Create a cluster from fresh empty nodes, each pass one round trip per node, all nodes at once: distinct
    epochs and even slots per shard master; masters MEET each other and each replica its master; each replica
    REPLICATEs as soon as it knows its master (its first sync then overlaps the rest, loaded from the socket);
    replicas MEET everyone else. Replicas are met only once they replicate, so every node learns them as
    replicas. Once all know each other every MEET is sent again: a node that was met reads its meeter's slots and
    role only from the meeter's next packet, at the ping cadence (cluster-node-timeout/2 later); the second MEET
    delivers them at once. Then wait until converged."""
    deadline = time.monotonic() + timeout
    servers = list(layout.servers)
    slots = slot_plan(layout)
    has_range = has_addslotsrange(connector.loaded)
    first, then = first_meets(layout), replica_meets(layout)
    again = {name: [*first.get(name, ()), *then.get(name, ())] for name in first}
    replicas = [layout.node(r) for shard in layout.shards for r in shard.replicas]
    with Observer(connector, servers, timeout=min(5.0, timeout)) as observer:
        ids = _parallel(observer.pool, lambda n: _fresh_id(observer, n), servers)

        def setup(node: Node) -> None:
            cmds = setup_commands(servers.index(node) + 1, slots.get(node.name, []), has_range)
            _checked(observer, node, cmds, "cluster setup")

        def introduce(targets: Mapping[str, Sequence[Node]]) -> Callable[[Node], None]:
            def send(node: Node) -> None:
                if targets.get(node.name):
                    _checked(observer, node, meet_commands(targets[node.name]), "CLUSTER MEET")
            return send

        _parallel(observer.pool, setup, servers)  # every epoch is set before any node meets another
        loading = _parallel(observer.pool, lambda n: _load_from_socket(observer, n), replicas)
        _parallel(observer.pool, introduce(first), servers)
        _replicate_once_known(observer, layout, ids, deadline - time.monotonic())
        _parallel(observer.pool, introduce(then), servers)
        counted: set[str] = set()
        wait_for(lambda: _all_known(observer, ids, counted), deadline - time.monotonic(),
                 f"all {len(servers)} nodes to know each other", interval=0.02)
        _parallel(observer.pool, introduce(again), servers)
        wait_converged(observer, max(0.1, deadline - time.monotonic()))
        for node in replicas:  # every replica's link is up: its first sync is done
            if (old := loading[node.name]) is not None:
                _put_back(observer, node, old)
