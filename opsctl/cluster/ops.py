"""Native cluster primitives and cluster creation, without redis-cli: every call goes through a node handle
(opsctl.net.connection.Connection), for form_cluster an Observer's.

form_cluster sets up and MEETs the masters first, then the replicas (started meanwhile), each pass one round trip
per node; then it polls every few ms, never in redis-cli's whole-second sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor
from typing import TypeVar

from opsctl.base.errors import NodeUnreachable, OpsctlError, RefusedError
from opsctl.base.poll import Pending, wait_for
from opsctl.net.connection import Connection
from opsctl.net.connector import Connector
from opsctl.net.observer import Observer, describe, describe_lines, settled_pending
from opsctl.net.rawpipe import link_error
from opsctl.net.resp import text
from opsctl.observe.cluster_state import observed_problems
from opsctl.observe.replies import (
    CLUSTER_NODES,
    ClusterNodeLine,
    Command,
    RespError,
    TextReply,
    parse_cluster_nodes,
    parse_info,
)
from opsctl.server.versions import has_capability, parse_version
from opsctl.slots.ranges import SlotRange, slot_command
from opsctl.slots.slotplan import slot_plan
from opsctl.spec.layout import Layout, Node

T = TypeVar("T")


def myid(handle: Connection) -> str:
    return str(text(handle.call("CLUSTER", "MYID")))


def meet(handle: Connection, node: Node) -> None:
    handle.call(*meet_command(node))


def meet_command(node: Node) -> Command:
    """CLUSTER MEET node; its bus port only when not port + 10000, which MEET assumes (Redis 6.2's takes none)."""
    return ("CLUSTER", "MEET", node.address, node.port, *([node.bus_port] if node.names_bus_port else []))


def replicate(handle: Connection, master_id: str) -> None:
    handle.call("CLUSTER", "REPLICATE", master_id)


def reset_stale_identity(handle: Connection, node: Node, live_ids: Collection[str]) -> str | None:
    """Make a node that comes back with a forgotten cluster identity a new node before it meets the cluster.

    Such a node knows others while the live cluster (live_ids) does not know it. Only an empty one is reset (CLUSTER
    RESET HARD; keys or slots are refused): no data is dropped. Returns the old id when it reset the node.
    Why: nodes that FORGOT its id ignore it, and the gossip never converges."""
    lines = handle.read(CLUSTER_NODES)
    me = next((line for line in lines if line.is_myself), None)
    if me is None or me.id in live_ids or len(lines) <= 1:
        return None
    keys = int(str(handle.call("DBSIZE")))
    if keys or me.slots:
        raise RefusedError(f"{node.name} ({node.endpoint}) holds the identity of a node the cluster forgot "
                           f"({me.id[:8]}), with {keys} keys and {me.slot_count} slots",
                           "it was removed from the cluster and kept its data; joining it would need a reset "
                           "that drops that data",
                           f"keep what you need from {node.name}'s data folder, move the folder aside (or "
                           "destroy the node with --purge), then apply again")
    handle.call("CLUSTER", "RESET", "HARD")
    return me.id


HINT = "the node's log says more; `opsctl cluster check -f SPEC` shows the state"


class NodeSilent(OpsctlError):
    """A node did not answer a round trip of the formation (timed out, connection lost). The waits that follow
    progress count it as not there yet, and their stall names it if it stays silent. Why: at hundreds of nodes on
    a loaded machine one look may miss its timeout while the cluster still forms."""


def _raw(observer: Observer, node: Node, commands: Sequence[Command], doing: str) -> list[TextReply]:
    """One round trip over the observer's raw link to node (no redis-py: a new cluster's creation does not load
    it), error replies as values; a node that does not answer is a NodeSilent naming node and command."""
    try:
        return observer.connections[node.name].texts(commands)
    except NodeUnreachable as exc:
        raise NodeSilent(f"{doing} failed on {node.name} ({node.endpoint})", link_error(exc), HINT) from None


def _unless_silent(fn: Callable[[Node], T], silent: dict[str, str]) -> Callable[[Node], T | None]:
    """fn, where a node that does not answer gives None and its reason goes to silent (a look of a wait)."""
    def guarded(node: Node) -> T | None:
        try:
            return fn(node)
        except NodeSilent as exc:
            silent[node.name] = f"{node.name} does not answer ({exc.detail})"
            return None
    return guarded


def _checked(observer: Observer, node: Node, commands: Sequence[Command], doing: str) -> list[TextReply]:
    """_raw, where the first error reply is an OpsctlError naming node and command."""
    replies = _raw(observer, node, commands, doing)
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
    """A node's setup in one round trip: its config epoch, and its slots if it is a master. Pure."""
    return [("CLUSTER", "SET-CONFIG-EPOCH", epoch)] + ([slot_command("ADDSLOTS", ranges, has_range)] if ranges else [])


def config_epochs(layout: Layout) -> dict[str, int]:
    """Each node's config epoch at creation: distinct, every replica's below every master's. Pure.

    Why: a node that learned a replica through gossip as a master, at an epoch above its master's, ignores it as
    stale for good once it replicates; equal epochs would make one of them take the cluster's next epoch."""
    replicas = [r for shard in layout.shards for r in shard.replicas]
    masters = [shard.master for shard in layout.shards]
    return {name: epoch for epoch, name in enumerate([*replicas, *masters], start=1)}


def meet_commands(targets: Sequence[Node]) -> list[Command]:
    return [meet_command(n) for n in targets]


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


def _parallel(pool: Executor, fn: Callable[[Node], T], nodes: Sequence[Node]) -> dict[str, T]:
    futures = {n.name: pool.submit(fn, n) for n in nodes}
    return {name: f.result() for name, f in futures.items()}


MEETS_AGAIN_AFTER = 1.0  # s: a replica that does not know its master yet this long after its MEET meets it again


def _replicate_once_known(observer: Observer, layout: Layout, ids: Mapping[str, str],
                          then: Mapping[str, Sequence[Node]], timeout: float, stall: float) -> None:
    """Each replica, once it knows its master (CLUSTER COUNT-FAILURE-REPORTS answers for a known id only): CLUSTER
    REPLICATE and its MEETs of `then` in one round trip (its sync starts early, the MEETs go out before a socket
    load blocks it). One still not knowing it MEETS_AGAIN_AFTER its last MEET meets it again.
    Why: an unanswered handshake is dropped; only a MEET adds an unknown sender."""
    waiting = {r: ids[shard.master] for shard in layout.shards for r in shard.replicas}
    masters = {r: layout.node(shard.master) for shard in layout.shards for r in shard.replicas}
    met_at = dict.fromkeys(waiting, time.monotonic())

    def attempt(node: Node) -> bool:
        """True once node replicates."""
        master_id = waiting[node.name]
        (known,) = _raw(observer, node, [("CLUSTER", "COUNT-FAILURE-REPORTS", master_id)], "CLUSTER REPLICATE")
        if isinstance(known, RespError):
            if "unknown node" not in known.message.lower():
                raise OpsctlError(f"CLUSTER REPLICATE failed on {node.name} ({node.endpoint})", known.message, HINT)
            if time.monotonic() - met_at[node.name] >= MEETS_AGAIN_AFTER:
                met_at[node.name] = time.monotonic()
                _checked(observer, node, meet_commands([masters[node.name]]), "CLUSTER MEET")
            return False
        commands = [("CLUSTER", "REPLICATE", master_id), *meet_commands(then.get(node.name, ()))]
        _checked(observer, node, commands, "CLUSTER REPLICATE")
        return True

    def check() -> bool | Pending:
        nodes = [layout.node(name) for name in waiting]
        silent: dict[str, str] = {}
        for node, done in zip(nodes, observer.pool.map(_unless_silent(attempt, silent), nodes), strict=True):
            if done:
                del waiting[node.name]
        return Pending(describe_lines([silent.get(name, f"{name} does not know its master yet")
                                       for name in sorted(waiting)]), len(waiting)) if waiting else True

    wait_for(check, timeout, "every replica to know its master", interval=0.02, stall=stall)


Expected = dict[str, tuple[str | None, tuple[SlotRange, ...]]]  # node id -> (its master's id, its slots)


def expected_lines(layout: Layout, ids: Mapping[str, str]) -> Expected:
    """How every node must see each node once formed: a master with its slots, a replica of its master. Pure."""
    slots = slot_plan(layout)
    lines: Expected = {}
    for shard in layout.shards:
        lines[ids[shard.master]] = (None, tuple(slots[shard.master]))
        lines |= {ids[r]: (ids[shard.master], ()) for r in shard.replicas}
    return lines


def stale_senders(view: Sequence[ClusterNodeLine], expected: Expected) -> list[str]:
    """The ids of the nodes a view shows with a role or slots other than expected. Pure.

    Nodes not in the view yet, or in handshake under a random id, are not counted: their handshake is under way.
    Why: a node that was met learns its meeter's header only at the ping cadence; a MEET from the node seen wrong
    delivers it at once."""
    return [line.id for line in view if not line.is_myself and line.id in expected
            and (line.master_id, line.slots) != expected[line.id]]


REMEET_AFTER = 0.5  # s: a pair still seen stale this long after its MEET gets another one
REPAIR_EVERY = 0.2  # s: how often, at most, nodes that are not settled yet have their views read for stale lines
REPAIR_SHARE = 0.25  # of the wait's time at most in repairs. Why: a repair reads n views of n lines; at 240 nodes
# on 2 cores it takes CPU from the very servers whose gossip it waits for


def missing_or_stale(view: Sequence[ClusterNodeLine], expected: Expected) -> int:
    """How many of the expected nodes a view does not show as expected yet: not there, or stale. Pure."""
    shown = {line.id for line in view if line.id in expected}
    return len(expected) - len(shown) + len(stale_senders(view, expected))


def _converge(observer: Observer, layout: Layout, ids: Mapping[str, str], timeout: float, stall: float) -> None:
    """wait_converged that repairs stale views instead of leaving them to the ping cadence: the views of the nodes not
    settled (cluster_state ok, replica link up) are read every REPAIR_EVERY (at most REPAIR_SHARE of the time),
    then the full look's; each node seen stale (stale_senders) MEETs the node that sees it so, at most every
    REMEET_AFTER per pair. Progress is the lines still missing or stale in the unsettled nodes' views, so a large
    cluster whose nodes all settle late still shows it converges."""
    expected = expected_lines(layout, ids)
    by_id = {node_id: layout.node(name) for name, node_id in ids.items()}
    settled: set[str] = set()
    sent: dict[tuple[str, str], float] = {}
    repaired = [time.monotonic(), 0.0]  # when the last repair began, and how long it took
    left: list[int | None] = [None]  # the lines missing or stale at the last repair (None before the first)

    def repair(views: Mapping[str, Sequence[ClusterNodeLine]]) -> None:
        now = repaired[0] = time.monotonic()
        due: dict[str, list[Node]] = {}
        for receiver, view in views.items():
            for sender in (by_id[i].name for i in stale_senders(view, expected)):
                if now - sent.get((sender, receiver), -REMEET_AFTER) >= REMEET_AFTER:
                    sent[(sender, receiver)] = now
                    due.setdefault(sender, []).append(layout.node(receiver))
        # a MEET a silent node missed goes out again at the next repair that still sees the pair stale
        _parallel(observer.pool, _unless_silent(_introducer(observer, due), {}), [layout.node(name) for name in due])
        repaired[1] = time.monotonic() - now

    def views_of(nodes: Sequence[Node]) -> dict[str, list[ClusterNodeLine]]:
        """The views of the nodes that answer (a silent one is not settled: the next look asks it again)."""
        def one(node: Node) -> list[ClusterNodeLine]:
            return parse_cluster_nodes(str(_checked(observer, node, [("CLUSTER", "NODES")], "CLUSTER NODES")[0]))
        views = _parallel(observer.pool, _unless_silent(one, {}), nodes)
        return {name: view for name, view in views.items() if view is not None}

    looked = [0.0]  # how long the last look took: the next waits 3 times that (the looks take a quarter at most)

    def check() -> bool | Pending:
        began_look = time.monotonic()
        try:
            return look()
        finally:
            looked[0] = time.monotonic() - began_look

    def look() -> bool | Pending:
        not_yet = settled_pending(observer, settled)
        if not_yet is not None:
            began, took = repaired
            if time.monotonic() - began >= max(REPAIR_EVERY, took / REPAIR_SHARE):
                unsettled = [n for n in observer.nodes if n.name not in settled]
                views = views_of(unsettled)
                left[0] = len(unsettled) + sum(missing_or_stale(v, expected) for v in views.values())
                repair(views)
            return Pending(not_yet.reason, left[0])
        seen = observer.observe(info_section="replication")
        problems = observed_problems(seen)
        if not problems:
            return True
        repair({name: list(o.cluster_nodes) for name, o in seen.items() if o.cluster_nodes is not None})
        return Pending(describe(problems), 0)  # all settled: the views' last disagreements, given `stall` to go

    wait_for(check, timeout, f"the cluster of {len(observer.nodes)} nodes to converge",
             interval=lambda: max(0.02, 3 * looked[0]), stall=stall)


def _introducer(observer: Observer, targets: Mapping[str, Sequence[Node]],
                before: Collection[str] = ()) -> Callable[[Node], None]:
    """A node's MEETs of its targets in one round trip (after TO_SOCKET when it is named in before)."""
    def send(node: Node) -> None:
        cmds = [TO_SOCKET] * (node.name in before) + meet_commands(targets.get(node.name, ()))
        if cmds:
            _checked(observer, node, cmds, "CLUSTER MEET")
    return send


DISKLESS_LOAD = "repl-diskless-load"
TO_SOCKET: Command = ("CONFIG", "SET", DISKLESS_LOAD, "on-empty-db")


def loads_from_disk(reply: TextReply) -> bool:
    """A CONFIG GET repl-diskless-load reply that says disabled. Pure.

    While the cluster forms such an empty replica loads its first sync from the socket (on-empty-db: only into an
    empty data set, nothing can be lost), set back once synced; a run killed before that leaves drift the next plan
    sets back. Why: a sync saved to disk is loaded only at the replica's replication cron."""
    return isinstance(reply, list) and len(reply) == 2 and reply[1] == "disabled"


FORMING_CAP = 20  # the whole formation's cap, in `stall`s: a wait that keeps progressing ends by then anyway


def form_cluster(connector: Connector, layout: Layout, stall: float = 30.0,
                 replicas_started: Callable[[], None] | None = None) -> None:
    """Create a cluster from fresh empty nodes, one round trip per node and pass, all at once: distinct epochs, even
    slots per master; a replica MEETs its master, REPLICATEs once it knows it, then MEETs the rest; then _converge.
    Masters go first while the caller starts the replicas; replicas_started waits for those (raising the caller's
    error). Why: a master's writable delay counts from its own start.
    The waits follow progress: they go on while replicas still come to know their masters and nodes still settle,
    and fail once `stall` s pass with none, naming who is stuck (the whole is capped at FORMING_CAP stalls)."""
    servers = list(layout.servers)
    slots = slot_plan(layout)
    server = connector.loaded.spec.server
    has_range = has_capability(server.flavor, parse_version(server.version), "slot_range_commands")
    first, then = first_meets(layout), replica_meets(layout)
    replicas = [layout.node(r) for shard in layout.shards for r in shard.replicas]
    masters = [n for n in servers if n not in replicas]
    epochs = config_epochs(layout)
    with Observer(connector, servers, timeout=min(5.0, stall)) as observer:
        def setup(node: Node) -> bool:
            """True for a replica that loads its syncs from disk (loads_from_disk)."""
            asks = node in replicas
            cmds = setup_commands(epochs[node.name], slots.get(node.name, []), has_range)
            replies = _checked(observer, node, cmds + [("CONFIG", "GET", DISKLESS_LOAD)] * asks, "cluster setup")
            return asks and loads_from_disk(replies[-1])

        def introduce(nodes: Sequence[Node]) -> tuple[dict[str, str], set[str]]:
            """The nodes' ids, and their first MEETs once every one of them is set up (a master that knows
            another refuses SET-CONFIG-EPOCH; nobody MEETs a replica before it has met its master)."""
            ids = _parallel(observer.pool, lambda n: _fresh_id(observer, n), nodes)
            from_disk = {name for name, yes in _parallel(observer.pool, setup, nodes).items() if yes}
            _parallel(observer.pool, _introducer(observer, first, from_disk), nodes)
            return ids, from_disk

        ids, _ = introduce(masters)
        if replicas_started is not None:
            replicas_started()
        deadline = time.monotonic() + stall * FORMING_CAP
        replica_ids, from_disk = introduce(replicas)
        ids |= replica_ids
        _replicate_once_known(observer, layout, ids, then, deadline - time.monotonic(), stall)
        _converge(observer, layout, ids, max(0.1, deadline - time.monotonic()), stall)
        # every replica's link is up: its first sync is done
        _parallel(observer.pool, lambda n: _checked(observer, n, [(*TO_SOCKET[:3], "disabled")], "CONFIG SET"),
                  [n for n in replicas if n.name in from_disk])
