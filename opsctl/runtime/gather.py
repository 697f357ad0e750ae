"""What a run knows before it acts: every node's facts (process, record, observation, files on disk, its
exporter), settled; the plan is made from them in opsctl.apply.planning."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from opsctl.base.errors import ConvergenceError, is_auth_failure, is_tls_failure
from opsctl.base.events import Emit, Event, ignore
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.poll import Pending, wait_for
from opsctl.net.fanout import fan_out
from opsctl.net.observer import Observer, observe, to_facts
from opsctl.observe.replies import NodeObservation
from opsctl.plan.facts import NodeFacts
from opsctl.plan.masters import shard_master
from opsctl.runtime.opening import Runtime
from opsctl.spec.deployed import NodeRecord
from opsctl.spec.layout import Node, Shard, split_endpoint
from opsctl.spec.load import Credentials

if TYPE_CHECKING:  # the planner, its steps and the disk facts load for plan and apply, not for status
    from opsctl.plan.desired import DesiredNode


def gather_facts(rt: Runtime, with_config: bool = True) -> dict[str, NodeFacts]:
    """Every node's process state, record and observation; nodes are looked at side by side (over SSH each
    look is a round trip: in a row they add up)."""
    nodes = rt.loaded.layout.nodes
    looks = fan_out(lambda n: (rt.provider.process_state(n), rt.provider.load_record(n)), nodes)
    states = {n.name: state for n, (state, _record) in zip(nodes, looks, strict=True)}
    records = {n.name: record for n, (_state, record) in zip(nodes, looks, strict=True)}
    running = [n for n in nodes if states[n.name].running]
    seen = observe(rt.connector, running, with_config=with_config) if running else {}
    facts = {n.name: _facts(n, states[n.name].running, states[n.name].detail, records[n.name],
                            seen.get(n.name), rt.loaded.credentials) for n in nodes}
    if with_config:
        from opsctl.runtime.drift import with_disk_facts

        facts = with_disk_facts(rt, facts)
        from opsctl.runtime.drift import with_exporter_facts

        facts = with_exporter_facts(rt, facts)
    facts = {**facts, **_retired_facts(rt, facts, with_config)}
    return {**facts, **gone_probes(rt, facts)}


PROBE_TIMEOUT = 1.0  # a master gone with its host: its old endpoint answers at once or not at all


def gone_probes(rt: Runtime, facts: dict[str, NodeFacts]) -> dict[str, NodeFacts]:
    """The old endpoint of each slot-serving master the cluster lost with its host (cluster.deadnodes), tried with the
    spec's credentials, as facts keyed by that endpoint: the promotion's master-down check refuses one that answers
    (or refuses the password: it runs), a host cut off from its replicas but not from its clients. Only what the
    check reads: its view would count as a member of the fleet."""
    suspect = any(line.is_master and line.slots and (line.is_failing or line.link_state != "connected")
                  for f in facts.values() for line in f.cluster_nodes or () if not line.is_myself)
    if rt.loaded.spec.topology != "cluster" or not suspect:  # the planner's judging loads only when it may find one
        return {}
    from opsctl.cluster.deadnodes import lost_masters

    return {line.endpoint: gone_probe(rt, line.endpoint)
            for line in lost_masters(rt.loaded.layout, facts).values()}


def gone_probe(rt: Runtime, was: str) -> NodeFacts:
    """What the old endpoint was of a master gone with its host answers now, as facts named by it."""
    address, port = split_endpoint(was) or (was, 0)
    host = next((n.host for n in rt.loaded.layout.servers if n.address == address), "(gone)")
    seen = observe(rt.connector, [Node(was, host, address, port, "master")], timeout=PROBE_TIMEOUT)[was]
    return NodeFacts(was, seen.reachable, reachable=seen.reachable, error=seen.error, role=seen.role)


class FleetView:
    """What polling waits look at, through connections kept for the whole wait (one Observer, the provider's
    SSH clients): every node's process state and observation, all nodes at once. A look costs a round trip
    per node, in parallel, and starts no process and no connection (gather_facts opens both every time).
    Node records are read once: no health check uses them."""

    def __init__(self, rt: Runtime, timeout: float = 2.0) -> None:
        self.rt = rt
        self.nodes = list(rt.loaded.layout.nodes)
        self.observer = Observer(rt.connector, self.nodes, timeout)
        self.records = dict(zip([n.name for n in self.nodes],
                                self.observer.pool.map(rt.provider.load_record, self.nodes), strict=True))

    def _look(self, node: Node) -> NodeFacts:
        state = self.rt.provider.process_state(node)
        seen = self.observer.observe_one(node, False, None) if state.running else None
        return _facts(node, state.running, state.detail, self.records[node.name], seen, self.rt.loaded.credentials)

    def facts(self) -> dict[str, NodeFacts]:
        facts = {f.name: f for f in self.observer.pool.map(self._look, self.nodes)}
        return {**facts, **_retired_facts(self.rt, facts, with_config=False)}

    def close(self) -> None:
        self.observer.close()

    def __enter__(self) -> FleetView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shard_facts(rt: Runtime, shard: Shard) -> dict[str, NodeFacts]:
    """What a step looks at to decide its shard's master when it runs (plan.masters): the shard's members, and
    the sentinels, which may agree on one; observed side by side, the write fence included. Not the rest of the
    fleet, nor process states and records (a node that does not answer counts as down): over SSH each of those
    is another round trip."""
    layout = rt.loaded.layout
    return to_facts(observe(rt.connector, [*map(layout.node, shard.members), *layout.sentinels]))


def _retired_facts(rt: Runtime, facts: dict[str, NodeFacts], with_config: bool) -> dict[str, NodeFacts]:
    """Nodes a larger spec had that the cluster still knows (scale-in), or that a replication or Sentinel spec's
    placement retired (spec.replplacement): observed so the plan drains them."""
    if rt.loaded.spec.topology == "standalone":
        return {}
    if rt.loaded.spec.topology == "cluster":
        from opsctl.slots.members import retired_nodes

        extra = retired_nodes(rt.loaded, [f.cluster_nodes for f in facts.values() if f.cluster_nodes])
    else:
        extra = [n for n in rt.loaded.layout.retired if n.name not in facts]
    states = dict(zip([n.name for n in extra], fan_out(rt.provider.process_state, extra), strict=True))
    running = [n for n in extra if states[n.name].running]
    seen = observe(rt.connector, running, with_config=with_config) if running else {}
    return {n.name: _facts(n, states[n.name].running, states[n.name].detail, NodeRecord(), seen.get(n.name),
                           rt.loaded.credentials)
            for n in extra}


def _facts(node: Node, running: bool, detail: str, record: NodeRecord,
           seen: NodeObservation | None, credentials: Credentials) -> NodeFacts:
    config = None if seen is None or node.is_sentinel or seen.config is None else without_secrets(seen.config,
                                                                                                    credentials)
    return NodeFacts.from_observation(node.name, seen, running, detail, record, config)


def without_secrets(config: dict[str, str], credentials: Credentials) -> dict[str, str]:
    """Live secret values become a verdict ("***" when they match the spec), so no secret reaches a plan."""
    from opsctl.plan.desired import secret_verdict  # with the renderer: only runs that read config load it
    from opsctl.render.directives import SECRET_DIRECTIVES

    return {k: (v if k not in SECRET_DIRECTIVES else secret_verdict(v, credentials.password, credentials.previous))
            for k, v in config.items()}


def master_endpoint(rt: Runtime, facts: dict[str, NodeFacts]) -> tuple[str, int] | None:
    """Where sentinels should look: the master the sentinels agree on, else the shard's current master."""
    layout = rt.loaded.layout
    if rt.loaded.spec.topology != "sentinel":
        return None
    node = layout.node(shard_master(layout, layout.shards[0], facts))
    return node.address, node.port


def desired_state(rt: Runtime, facts: dict[str, NodeFacts]) -> dict[str, DesiredNode]:
    from opsctl.plan.desired import desired_nodes

    return desired_nodes(rt.loaded, rt.provider.paths, rt.provider.daemonize, master_endpoint(rt, facts))


SETTLE_TIMEOUT = 30.0


def in_between(f: NodeFacts) -> str | None:
    """Why a node is between states (its process runs, yet what it says now will not hold), or None. Such a node
    is waited for before planning: it answers soon, or its process ends (then it is a down node to start).
    A refused password or TLS handshake is no transition: refuse_silent_nodes names those at once."""
    if not f.running:
        return None
    if not f.reachable:
        if is_auth_failure(f.error) or is_tls_failure(f.error):
            return None
        return f"runs but does not answer ({f.error or 'no answer'})"
    if "shutdown_in_milliseconds" in f.info:
        return "shuts down"
    if f.info.get("loading") == "1":
        return "loads its data"
    return None


@frozen
class NodesSettling(Frozen, Event):
    """Nodes between states (waiting: each one's name -> what it does), waited for at most timeout seconds."""

    kind: ClassVar[str] = "nodes-settling"
    timeout: float
    waiting: Mapping[str, str]

    def line(self) -> str:
        return (f"waiting up to {self.timeout:g}s for "
                + "; ".join(f"{name}, which {why}" for name, why in self.waiting.items()))


def settled_facts(rt: Runtime, with_config: bool = True, timeout: float = SETTLE_TIMEOUT,
                  emit: Emit = ignore) -> dict[str, NodeFacts]:
    """gather_facts once no node is between states (in_between), waiting at most timeout: a node stopped by
    SIGSTOP, saving on its way out, shutting down or loading its data (a run killed mid-restart leaves one
    behind) is planned from what it becomes, not from a look that will not hold. Nodes still in between at the
    timeout are left as they are (refuse_silent_nodes names a silent one). The wait is said to emit."""
    facts = gather_facts(rt, with_config)
    waiting = {f.name: why for f in facts.values() if (why := in_between(f))}
    if not waiting:
        return facts
    emit(NodesSettling(timeout, waiting))
    # still in between at the timeout: planned as it is
    with FleetView(rt) as view, contextlib.suppress(ConvergenceError):
        wait_for(lambda: _settled(view), timeout, "nodes between states to settle", 0.05)
    return gather_facts(rt, with_config)


def _settled(view: FleetView) -> bool | Pending:
    waiting = [f"{f.name}, which {why}" for f in view.facts().values() if (why := in_between(f))]
    return Pending("; ".join(waiting)) if waiting else True


