"""The failover commands per topology, polled until the replica is a master.

cluster: CLUSTER FAILOVER [FORCE|TAKEOVER] on the replica.
sentinel: pause and fence the master, wait for the replicas, SENTINEL FAILOVER, demote the old master, re-point the
others, tell sentinels.
replication: FAILOVER TO if the server has it, else pause, fence, wait, REPLICAOF NO ONE; with the master gone
(--mode force), REPLICAOF NO ONE on the replica holding the most and the others re-pointed.
See docs/runbooks/failover.md.

One failover run's open connections: every node of the shard's topology, retired cluster members included."""

from __future__ import annotations

import contextlib
import os
import signal

from opsctl.base import stop
from opsctl.base.errors import NodeError, NodeRefused, OpsctlError
from opsctl.base.poll import Pending, wait_for
from opsctl.failover import fence
from opsctl.failover.announce import EpochWatch, announce
from opsctl.failover.verdicts import Target
from opsctl.net.connection import Connection, Connections, said
from opsctl.net.connector import Connector
from opsctl.net.observer import Observer, to_facts
from opsctl.observe.replies import ROLE, RoleInfo, as_text, info
from opsctl.plan.facts import NodeFacts, spec_values
from opsctl.providers.base import Provider
from opsctl.server.versions import has_capability, parse_version
from opsctl.slots.members import cluster_members
from opsctl.spec.layout import sentinel_master_name
from opsctl.spec.load import LoadedSpec

POLL = 0.002
KILL_AT = "OPSCTL_FAILOVER_KILL_AT"
STOP_SILENT_S = 2.0  # SIGTERM's grace for a master that stopped answering (a stalled one gets SIGKILL after it)
GRACEFUL_LIMIT = 6.0  # the server gives up a manual failover after 5 s (CLUSTER_MF_TIMEOUT)

__all__ = ["describe", "has_failover_command", "perform"]


def has_failover_command(loaded: LoadedSpec) -> bool:
    server = loaded.spec.server
    return has_capability(server.flavor, parse_version(server.version), "failover_command")


def describe(loaded: LoadedSpec, target: Target, modes: tuple[str, ...]) -> list[str]:
    """What a real run would do, for --dry-run."""
    layout = loaded.layout
    replica = target.replica or "the replica Sentinel picks"
    if modes[0] == "sentinel":
        return [f"CLIENT PAUSE WRITE and the write fence on {target.master}; wait until every replica has its offset",
                f"SENTINEL FAILOVER {sentinel_master_name(loaded.spec)}; poll ROLE until {replica} is master",
                f"REPLICAOF <new master>, lift the fence, CONFIG REWRITE on {target.master}; CLIENT UNPAUSE",
                "REPLICAOF <new master> + CONFIG REWRITE on the other replicas; every sentinel gets the leader's "
                "hello for the new master (its failover epoch)",
                "post-checks: writes, roles, links, every sentinel reports the new master"]
    endpoint = layout.node(target.replica).endpoint if target.replica else "?"
    if modes[0] == "promote":
        return [f"stop {target.master}'s process if its host answers (silent is not dead: one that resumes would "
                "be a second master)",
                f"REPLICAOF NO ONE + CONFIG REWRITE on {replica}; poll ROLE until it is master",
                f"REPLICAOF {endpoint} + CONFIG REWRITE on the other replicas that answer",
                f"post-checks: writes, roles, links; {target.master} stays down: `opsctl apply` starts it as a "
                f"replica of {replica}, dropping what it took past the promotion"]
    if modes[0] == "failover-command":
        return [f"FAILOVER TO {endpoint} on {target.master} (pauses writes, waits for the replica)",
                f"REPLICAOF {endpoint} + CONFIG REWRITE on the other replicas; CONFIG REWRITE on both",
                "post-checks: writes, roles, links"]
    if modes[0] == "manual":
        return [f"CLIENT PAUSE WRITE and the write fence on {target.master}; wait until {replica} has its offset",
                f"REPLICAOF NO ONE on {replica}; REPLICAOF {endpoint} and lift the fence on {target.master}; "
                "REPLICAOF on the others; CONFIG REWRITE each; UNPAUSE",
                "post-checks: writes, roles, links"]
    return [*(f"CLUSTER FAILOVER{'' if m == 'graceful' else ' ' + m.upper()} on {replica}; poll ROLE"
              for m in modes), "post-checks: writes, roles, links, cluster_state ok on every node, all agree"]


def perform(session: Session, target: Target, mode: str, timeout: float, notes: list[str]) -> str:
    """Run one mode; return the new master's name (what it did beside, in notes). ConvergenceError when it did
    not complete in time."""
    if mode == "sentinel":
        return _sentinel(session, target, timeout, notes)
    assert target.replica is not None
    if mode == "failover-command":
        return _failover_command(session, target, timeout)
    if mode == "manual":
        return _manual(session, target, timeout)
    if mode == "promote":
        return _promote(session, target, timeout, notes)
    node = session.connections[target.replica]
    node.call("CLUSTER", "FAILOVER", *(() if mode == "graceful" else (mode.upper(),)))
    checkpoint("asked")
    limit = min(timeout, GRACEFUL_LIMIT) if mode == "graceful" else timeout
    wait_for(lambda: _is_master(node), limit, f"{target.replica} to become master", POLL)
    return target.replica


def _role(node: Connection) -> RoleInfo | None:
    try:
        return node.read(ROLE)
    except NodeError:
        return None


def _is_master(node: Connection) -> bool | Pending:
    role = _role(node)
    # the server's own word in the progress line, as ROLE says it ("slave")
    said = ("slave" if role.kind == "replica" else role.kind) if role else "silent"
    return True if role and role.kind == "master" else Pending(f"{node.name} is {said}")


def _caught_up(session: Session, master: str, replicas: list[str]) -> bool | Pending:
    """Every replica has processed the master's whole stream (its own ROLE, not the master's view of its last ACK).
    A safe point: a stop request before the promotion lifts the fence (the callers' finally) and stops."""
    stop.check("nothing was promoted: the fence on the master is lifted", "run the same failover again")
    role = _role(session.connections[master])
    if not role:
        return Pending(f"{master} does not answer ROLE")
    behind = []
    for name in replicas:
        r = _role(session.connections[name])
        # a replica's own offset (a master's ROLE would say its own stream's end: not one to wait on)
        if not r or r.kind != "replica" or r.offset < role.offset:
            behind.append(f"{name} at {r.offset if r else '?'} of {role.offset}")
    return Pending("; ".join(behind)) if behind else True


def _pause(node: Connection, timeout: float) -> None:
    node.call("CLIENT", "PAUSE", int(timeout * 1000), "WRITE")


def _unpause(node: Connection) -> None:
    with contextlib.suppress(NodeError):  # else the pause expires by itself
        node.call("CLIENT", "UNPAUSE")


def told_note(told: list[str], sentinels: list[str], new: str) -> str:
    """The report's line on opsctl's announcement of the promotion. Pure."""
    rest = [s for s in sentinels if s not in told]
    head = f"sentinels naming {new} right after opsctl's announcement: {len(told)}/{len(sentinels)}"
    return head + (f" ({', '.join(rest)}: from the others' hellos, at Sentinel's pace)" if rest else "")


def _replicate(node: Connection, master: Connection | None) -> None:
    if master is None:
        node.call("REPLICAOF", "NO", "ONE")
    else:
        node.call("REPLICAOF", master.node.address, str(master.node.port))
    node.call("CONFIG", "REWRITE")


def _sentinel(session: Session, target: Target, timeout: float, notes: list[str]) -> str:
    """SENTINEL FAILOVER with opsctl's pause and fence (_sentinel_promote); then re-point the other replicas and
    tell every sentinel (opsctl.failover.announce) instead of waiting for Sentinel's once-a-second INFO."""
    loaded = session.loaded
    name = sentinel_master_name(loaded.spec)
    watches: list[EpochWatch] = []
    try:
        new, leader = _sentinel_promote(session, target, timeout, watches)
        shard = loaded.layout.shards[target.shard - 1]
        for other in [n for n in shard.members if n not in (target.master, new)]:
            with contextlib.suppress(NodeError):  # else Sentinel re-points it, as it would anyway
                _replicate(session.connections[other], session.connections[new])
        checkpoint("repointed")
        if watches:
            node = loaded.layout.node(new)
            sentinels = [session.connections[s.name] for s in loaded.layout.sentinels]
            told: list[str] = []
            with contextlib.suppress(NodeError):  # else the sentinels learn it at their own pace
                told = announce(session.connections[leader], sentinels, watches[0], name, (node.address, node.port),
                                session.observer.pool)
            notes.append(told_note(told, [s.name for s in loaded.layout.sentinels], new))
        return new
    finally:
        for watch in watches:
            watch.close()


def _sentinel_promote(session: Session, target: Target, timeout: float,
                      watches: list[EpochWatch]) -> tuple[str, str]:
    """Pause, fence, wait for the replicas, SENTINEL FAILOVER, demote the old master, lift its fence, unpause. Returns
    the promoted replica and the sentinel leading the failover (its epoch watch added to `watches`).
    Once SENTINEL FAILOVER is sent the fence stays until the old master is a replica, whatever happens to opsctl: a
    re-run (opsctl.failover.fence.finish) or Sentinel completes it."""
    loaded = session.loaded
    shard = loaded.layout.shards[target.shard - 1]
    replicas = [n for n in shard.members if n != target.master]
    old = session.connections[target.master]
    values = spec_values(loaded, loaded.layout.node(target.master))
    asked = False  # once SENTINEL FAILOVER may have started, the fence stays until the old master is a replica
    _pause(old, timeout + 2)
    try:
        fence.fence(old)
        checkpoint("fenced")
        wait_for(lambda: _caught_up(session, target.master, replicas), timeout, "replicas to catch up", POLL)
        try:
            leader = _ask_sentinels(session, sentinel_master_name(loaded.spec), watches)
            asked = True
        except SentinelRefused as exc:
            asked = exc.maybe_started
            raise
        checkpoint("asked")
        new = wait_for(lambda: _promoted(session, replicas), timeout, "Sentinel to promote a replica", POLL)
        checkpoint("promoted")
        _demote(old, session.connections[new], values)
        asked = False
    finally:
        if not asked:
            _lift(old, values)
        _unpause(old)
    return new, leader


def _ask_sentinels(session: Session, name: str, watches: list[EpochWatch]) -> str:
    """SENTINEL FAILOVER on the first sentinel that accepts it; its +new-epoch events are added to `watches`
    when they could be watched. When none accepts, raise; the exception's `maybe_started` says whether a lost
    reply (not a refusal) leaves a failover possibly in flight."""
    errors = []
    lost = False
    for node in session.loaded.layout.sentinels:
        sentinel = session.connections[node.name]
        with contextlib.suppress(NodeError):
            watches[:] = [EpochWatch(sentinel)]
        try:
            sentinel.call("SENTINEL", "FAILOVER", name)
            return node.name
        except NodeError as exc:
            for watch in watches:
                watch.close()
            watches.clear()
            lost = lost or not isinstance(exc, NodeRefused)
            errors.append(f"{node.name}: {said(exc)}")
    raise SentinelRefused("no sentinel accepted SENTINEL FAILOVER", "\n".join(errors),
                          "INPROG: a failover is running, wait for it; NOGOODSLAVE: no replica is eligible",
                          maybe_started=lost)


class SentinelRefused(OpsctlError):
    def __init__(self, summary: str, detail: str, hint: str, maybe_started: bool) -> None:
        super().__init__(summary, detail, hint)
        self.maybe_started = maybe_started


def _promoted(session: Session, replicas: list[str]) -> str | Pending:
    for name in replicas:
        role = _role(session.connections[name])
        if role and role.kind == "master":
            return name
    return Pending("no replica reports ROLE master yet")


def _failover_command(session: Session, target: Target, timeout: float) -> str:
    assert target.replica is not None
    new = session.connections[target.replica]
    old = session.connections[target.master]
    wait_for(lambda: _no_failover(old), timeout + 2, f"the FAILOVER already running on {target.master} to end", POLL)
    if _is_master(new) is not True:  # a run killed after it asked may have left that one to finish it
        old.call("FAILOVER", "TO", new.node.address, str(new.node.port), "TIMEOUT", str(int(timeout * 1000)))
        checkpoint("asked")

    def done() -> bool | Pending:
        state = _failover_state(old)
        promoted = _is_master(new)
        if state == "no-failover" and promoted is not True:
            raise OpsctlError(f"FAILOVER on {target.master} ended without promoting {target.replica}",
                              "the master resumed writes; the replica did not catch up within the timeout",
                              "look at the master's log; raise --timeout if the replica lags")
        return True if state == "no-failover" else Pending(f"{target.master} failover state {state}")

    wait_for(done, timeout + 2, f"{target.replica} to take over", POLL)
    for each in (new, old):
        each.call("CONFIG", "REWRITE")
    _repoint_others(session, target, new)
    return target.replica


def _failover_state(node: Connection) -> str:
    """master_failover_state of INFO replication: no-failover, waiting-for-sync or failover-in-progress."""
    return node.read(info("replication")).get("master_failover_state", "")


def _no_failover(node: Connection) -> bool | Pending:
    """No FAILOVER runs on node's server (one a killed run asked for finishes by itself, within its timeout)."""
    state = _failover_state(node)
    return True if state == "no-failover" else Pending(f"{node.endpoint} failover state {state}")


def _manual(session: Session, target: Target, timeout: float) -> str:
    """Pause, fence, wait for the replica, REPLICAOF NO ONE on it, demote the old master, lift, unpause."""
    assert target.replica is not None
    loaded = session.loaded
    new = session.connections[target.replica]
    old = session.connections[target.master]
    values = spec_values(loaded, loaded.layout.node(target.master))
    promoted = False
    _pause(old, timeout + 2)
    try:
        fence.fence(old)
        checkpoint("fenced")
        wait_for(lambda: _caught_up(session, target.master, [target.replica or ""]), timeout,
                 f"{target.replica} to catch up", POLL)
        promoted = True
        _replicate(new, None)
        checkpoint("promoted")
        _demote(old, new, values)
    finally:
        if not promoted:
            _lift(old, values)
        _unpause(old)
    _repoint_others(session, target, new)
    return target.replica


def _promote(session: Session, target: Target, timeout: float, notes: list[str]) -> str:
    """The master is gone (the pre-checks saw it silent): promote the replica holding the most, then re-point the
    others that answer (a silent one, and the old master, follow at the next apply)."""
    assert target.replica is not None
    new = session.connections[target.replica]
    notes.append(_stop_silent_master(session, target))
    checkpoint("old-master-stopped")
    offset = _offset(new)  # read once the old master can send nothing more
    if _is_master(new) is not True:  # a run killed after its REPLICAOF NO ONE left it promoted already
        _refuse_if_overtaken(session, target, offset)
        _replicate(new, None)
        checkpoint("promoted")
    wait_for(lambda: _is_master(new), timeout, f"{target.replica} to answer as master", POLL)
    notes.append(f"{target.replica} promoted at offset {offset} of {target.master}'s stream: writes {target.master} "
                 "acknowledged past it reached no replica and are lost")
    shard = session.loaded.layout.shards[target.shard - 1]
    for name in shard.members:
        if name in (target.master, target.replica):
            continue
        try:
            _replicate(session.connections[name], new)
        except NodeError as exc:
            notes.append(f"{name} not re-pointed ({type(exc).__name__}): `opsctl apply` points it at {target.replica}")
    return target.replica


def _refuse_if_overtaken(session: Session, target: Target, offset: str) -> None:
    """The pre-checks chose the replica holding the most while the old master might still stream; read again once
    it is stopped, another replica that holds more is the one to promote (promoting this one would drop what that
    one has past it, at its full sync)."""
    shard = session.loaded.layout.shards[target.shard - 1]
    for name in shard.members:
        if name in (target.master, target.replica):
            continue
        try:
            theirs = _offset(session.connections[name])
        except NodeError:
            continue
        if theirs.isdigit() and offset.isdigit() and int(theirs) > int(offset):
            raise OpsctlError(f"{name} now holds more of {target.master}'s stream than {target.replica} "
                              f"(offset {theirs} against {offset}): nothing was promoted",
                              f"{target.master} sent it more before it stopped",
                              "run the same command again: the pre-checks choose by the data held now")


def _stop_silent_master(session: Session, target: Target) -> str:
    """Stop the old master's process where its host can be reached: silent is not dead (a stalled process, a cut
    link), and one that resumes is a second master taking writes its conversion drops. What happened, for the
    report; a host that cannot be reached is said, not an error (the operator forced a master that is gone)."""
    if session.provider is None:
        return f"{target.master} not stopped: no provider to reach its host"
    node = session.loaded.layout.node(target.master)
    try:
        state = session.provider.process_state(node)
        if not state.running:
            return f"{target.master} does not run ({state.detail})"
        session.provider.stop(node, timeout=STOP_SILENT_S)
    except (OpsctlError, OSError) as exc:  # OSError: a signal the provider may not send (another user's process)
        why = exc.summary if isinstance(exc, OpsctlError) else type(exc).__name__
        return (f"{target.master}'s process could not be looked at or stopped ({why}): if it runs on, it is a "
                f"second master until `opsctl apply` makes it a replica of {target.replica}")
    return f"{target.master} ran without answering ({state.detail}): stopped, so it cannot take writes again"


def _offset(node: Connection) -> str:
    """master_repl_offset of INFO replication: how far into its master's stream a replica got (kept with the link
    down)."""
    return node.read(info("replication")).get("master_repl_offset", "unknown")


def _demote(old: Connection, new: Connection, values: dict[str, str]) -> None:
    """The fenced old master follows the new one; only then its fence goes (one CONFIG REWRITE saves both)."""
    old.call("REPLICAOF", new.node.address, str(new.node.port))
    fence.unfence(old, values)


def _lift(old: Connection, values: dict[str, str]) -> None:
    """Nothing was promoted: the old master takes writes again (when unreachable, a re-run lifts it)."""
    with contextlib.suppress(NodeError):
        fence.unfence(old, values, rewrite=False)


def checkpoint(name: str) -> None:
    """Test hook: OPSCTL_FAILOVER_KILL_AT=name kills opsctl here (SIGKILL), as a crash at that moment would;
    name:SIGTERM (or :SIGINT) sends that signal instead, as an operator's kill at that moment would."""
    point, _, sig = os.environ.get(KILL_AT, "").partition(":")
    if point == name:
        os.kill(os.getpid(), signal.Signals[sig] if sig else signal.SIGKILL)


def _repoint_others(session: Session, target: Target, new: Connection) -> None:
    shard = session.loaded.layout.shards[target.shard - 1]
    for name in shard.members:
        if name not in (target.master, target.replica):
            _replicate(session.connections[name], new)


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

    @property
    def connections(self) -> Connections:
        """The run's node handles (the observer's: closed with it)."""
        return self.observer.connections

    def quorum(self) -> dict[str, str]:
        name = sentinel_master_name(self.loaded.spec)
        futures = {n.name: self.observer.pool.submit(_ckquorum, self.connections[n.name], name)
                   for n in self.loaded.layout.sentinels}
        return {n: f.result() for n, f in futures.items()}

    def close(self) -> None:
        self.observer.close()


def _ckquorum(sentinel: Connection, name: str) -> str:
    try:
        return as_text(sentinel.call("SENTINEL", "CKQUORUM", name))
    except NodeError as exc:
        return f"error: {said(exc)}"
