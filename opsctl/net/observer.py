"""Observe live nodes: one pipelined round trip per node, all nodes in parallel; the thin I/O shell.

The parsing lives in opsctl.observe.replies and the judging in opsctl.observe.cluster_state (both pure).
Observations go over raw connections (opsctl.net.rawpipe, replies read by hiredis), not redis-py: commands that
only look (plan, status) start without importing it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opsctl.base.poll import Pending, wait_for
from opsctl.net.connection import Connections
from opsctl.net.connector import Connector
from opsctl.net.fanout import Borrowed
from opsctl.net.rawpipe import PIPE_ERRORS, link_error
from opsctl.observe.cluster_state import Disagreement, observed_problems
from opsctl.observe.replies import (
    CLUSTER_INFO,
    CLUSTER_NODES,
    ROLE,
    Command,
    NodeObservation,
    RespError,
    master_side_problems,
    parse_cluster_nodes,
    parse_info,
    parse_pairs,
    parse_role,
)
from opsctl.observe.replies import config as config_read
from opsctl.observe.replies import info as info_read
from opsctl.plan.facts import TO_WRITE
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec

if TYPE_CHECKING:
    from opsctl.plan.facts import NodeFacts

def to_facts(observations: Mapping[str, NodeObservation]) -> dict[str, NodeFacts]:
    """Observations as the pure deciders take them (plan.masters), for a run that looks without a provider."""
    from opsctl.plan.facts import NodeFacts  # the planner's types: the slot commands' start does without them

    return {name: NodeFacts.from_observation(name, o) for name, o in observations.items()}


FENCE_READ: Command = config_read(TO_WRITE).command  # the write fence alone (opsctl.plan.facts)


def _commands(loaded: LoadedSpec, node: Node, with_config: bool, info_section: str | None) -> list[Command]:
    cmds: list[Command] = [info_read(info_section or "").command, ROLE.command]
    if node.is_sentinel:
        return cmds
    if loaded.spec.topology == "cluster":
        cmds += [CLUSTER_INFO.command, CLUSTER_NODES.command]
    if with_config:
        cmds.append(config_read().command)
    elif loaded.spec.topology in ("replication", "sentinel"):
        cmds.append(FENCE_READ)  # who the shard's master is depends on it (plan.masters)
    return cmds


def _fill(obs: NodeObservation, commands: list[Command], replies: Sequence[Any]) -> None:
    """Parse replies into obs. A failing command (e.g. cluster support disabled) leaves its field empty."""
    errors: list[str] = []
    for cmd, reply in zip(commands, replies, strict=True):
        if isinstance(reply, RespError):
            errors.append(f"{' '.join(str(c) for c in cmd[:2])}: {reply.message}")
            continue
        key = " ".join(str(c) for c in cmd[:2]).upper()
        if key.startswith("INFO") or key == "CLUSTER INFO":
            obs.info.update(parse_info(str(reply)))
        elif key == "ROLE":
            obs.role = parse_role(reply)
        elif key == "CLUSTER NODES":
            obs.cluster_nodes = parse_cluster_nodes(str(reply))
        elif cmd == FENCE_READ:
            obs.fence = parse_pairs(reply)
        elif key == "CONFIG GET":
            obs.config = parse_pairs(reply)
    obs.error = "; ".join(errors)


class Observer:
    """Keeps one connection per node and a share of the process's threads (opsctl.net.fanout), so repeated
    observations (polling) are cheap. Looks go over the handles' raw pipes; a handle's admin client (for the
    commands callers send themselves) is made when first asked for."""

    def __init__(self, connector: Connector, nodes: Iterable[Node], timeout: float = 2.0) -> None:
        self.connector = connector
        self.loaded = connector.loaded
        self.nodes = list(nodes)
        self.connections = Connections(connector, self.nodes, timeout)
        self.pool = Borrowed()

    def observe_one(self, node: Node, with_config: bool, info_section: str | None) -> NodeObservation:
        commands = _commands(self.loaded, node, with_config, info_section)
        try:
            replies = self.connections[node.name].texts(commands)
        except PIPE_ERRORS as exc:
            return NodeObservation(node, False, link_error(exc))
        obs = NodeObservation(node, True)
        try:
            _fill(obs, commands, replies)
        except (ValueError, IndexError, TypeError) as exc:
            obs.error = f"unexpected reply: {exc}"
        return obs

    def observe(self, with_config: bool = False, info_section: str | None = None) -> dict[str, NodeObservation]:
        futures = {n.name: self.pool.submit(self.observe_one, n, with_config, info_section) for n in self.nodes}
        return {name: future.result() for name, future in futures.items()}

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.connections.close()

    def __enter__(self) -> Observer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def observe(connector: Connector, nodes: Iterable[Node], with_config: bool = False,
            timeout: float = 2.0) -> dict[str, NodeObservation]:
    """Every node in parallel, one round trip each. Never raises for a node that does not answer."""
    with Observer(connector, nodes, timeout) as observer:
        return observer.observe(with_config)


def describe(problems: Sequence[Disagreement], limit: int = 12) -> str:
    return describe_lines([p.render() for p in problems], limit)


def describe_lines(lines: Sequence[str], limit: int = 12) -> str:
    """At most limit lines, then how many more."""
    return "\n".join([*lines[:limit], *([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])])


def settled_pending(observer: Observer, settled: set[str] | None = None) -> Pending | None:
    """The cheap look polls take first: every node's cluster_state (in a cluster) and every replica's link, from
    CLUSTER INFO and INFO replication (a few hundred bytes each). Pending naming who is not there yet, else None.
    settled: nodes seen there already, not asked again; the ones there now are added (the full look that
    follows checks every node again)."""
    commands: list[Command] = [info_read("replication").command]
    if observer.loaded.spec.topology == "cluster":
        commands.append(CLUSTER_INFO.command)

    def one(node: Node) -> str:
        try:
            replies = observer.connections[node.name].texts(commands)
        except PIPE_ERRORS as exc:
            return f"unreachable: {link_error(exc)}"
        failed = [f"{' '.join(c)}: {r.message}" for c, r in zip(commands, replies, strict=True)
                  if isinstance(r, RespError)]
        if failed:
            return "; ".join(failed)
        info = {k: v for reply in replies for k, v in parse_info(str(reply)).items()}
        if len(commands) > 1 and info.get("cluster_state") != "ok":
            return f"cluster_state:{info.get('cluster_state', '?')} (waiting for ok)"
        if info.get("role") == "slave" and info.get("master_link_status") != "up":
            return f"replica link to {info.get('master_host')}:{info.get('master_port')} is " \
                   f"{info.get('master_link_status', '?')}"
        if master_side := master_side_problems(info):
            return "; ".join(master_side)
        return ""

    asked = [n for n in observer.nodes if settled is None or n.name not in settled]
    why = dict(zip([n.name for n in asked], observer.pool.map(one, asked), strict=True))
    if settled is not None:
        settled.update(name for name, reason in why.items() if not reason)
    waiting = [f"{name}: {reason}" for name, reason in why.items() if reason]
    return Pending(describe_lines(waiting), len(waiting)) if waiting else None


def wait_converged(observer: Observer, timeout: float, stall: float | None = None) -> None:
    """Poll through an open Observer until its nodes agree; ConvergenceError names who disagrees and how.
    A poll asks the nodes not yet seen settled for cluster_state and replica link only (settled_pending); the full
    look (every view, parsed and compared) runs once all are settled, so a long wait costs the servers little.
    stall: go on while nodes still settle, fail once that long passes with none newly settled (wait_for)."""
    settled: set[str] = set()

    def check() -> bool | Pending:
        not_yet = settled_pending(observer, settled)
        if not_yet is not None:
            return not_yet
        problems = observed_problems(observer.observe(info_section="replication"))
        return Pending(describe(problems), 0) if problems else True

    # 20 ms: a poll reads every node's INFO and CLUSTER NODES; polling faster only takes CPU from the servers
    wait_for(check, timeout, f"the cluster of {len(observer.nodes)} nodes to converge", interval=0.02, stall=stall)


def wait_cluster_converged(connector: Connector, nodes: Iterable[Node], timeout: float = 30.0,
                           stall: float | None = None) -> None:
    """Poll until every node agrees (state ok, one slot map, no open slots, all known, replicas linked); with
    stall, as long as nodes still settle (wait_converged), up to timeout."""
    with Observer(connector, nodes, timeout=min(2.0, timeout)) as observer:
        wait_converged(observer, timeout, stall)


