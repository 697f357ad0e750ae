"""The replication and Sentinel steps of a plan: point a replica at its shard's master, point and set up the
sentinels, fail a master over and finish a failover that was interrupted. Each decides the master from a live look
when it runs: a failover earlier in the same plan (or by anyone else) moves the master the plan named."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from opsctl.base.errors import NodeRefused, RefusedError
from opsctl.base.events import Log, as_log, ignore
from opsctl.base.poll import Pending, wait_for
from opsctl.cluster.ops import myid, replicate
from opsctl.net.connection import Connection
from opsctl.observe.replies import CLUSTER_NODES, ROLE
from opsctl.plan.masters import follow_target, writes_moved_from
from opsctl.plan.replication import sentinel_settings
from opsctl.plan.steps import Failover, FinishFailover, Replicate, SentinelMonitor, SentinelSet, Step
from opsctl.render import render_node
from opsctl.runtime.execution import Execution
from opsctl.runtime.gather import master_endpoint, shard_facts
from opsctl.runtime.opening import Runtime
from opsctl.spec.layout import Layout, Node, endpoint, sentinel_master_name, sentinel_quorum
from opsctl.spec.placement import with_member


def sentinels_master(rt: Runtime) -> tuple[str, int] | None:
    """Where sentinels are pointed, from a look at the shard now (runtime.master_endpoint); None outside a Sentinel
    topology."""
    return master_endpoint(rt, shard_facts(rt, rt.loaded.layout.shards[0]))



def sentinel_set(run: Execution, step: SentinelSet) -> None:
    """SENTINEL SET each changed setting; then remember them as applied in the sentinel's record."""
    node = run.node(step)
    name = sentinel_master_name(run.rt.loaded.spec)
    password = run.rt.loaded.credentials.password.reveal()
    handle = run.rt.connections[node.name]
    for key, value in step.settings:
        handle.call("SENTINEL", "SET", name, *key.split(), password if key == "auth-pass" else value)
    master = sentinels_master(run.rt)
    masked = render_node(run.rt.loaded, node, run.rt.provider.paths(node), reveal=False,
                         daemonize=run.rt.provider.daemonize, master=master)
    record = run.rt.provider.load_record(node)
    run.rt.provider.save_record(node, replace(record, directives=tuple(d for s in masked.sections
                                                                        for d in s.directives)))


def fail_over(run: Execution, step: Failover) -> None:
    """The failover runbook (graceful): retried as a dry run until its pre-checks pass, so a replica that was
    restarted a moment ago has time to catch up; a refusal after that stops the rollout. Each try looks at the
    shard first: once another node took the master's writes (masters.writes_moved_from: failed over since the plan
    was made), there is nothing to fail over, and the step says so and goes on."""
    from opsctl.failover.runbook import Options, run_failover

    rt = run.rt
    layout = rt.loaded.layout
    shard = layout.shard_of(step.node)
    if shard is None:
        return _fail_over_drained(run, step)

    def writer_when_checks_pass() -> str | Pending:
        try:
            moved = writes_moved_from(layout, shard, step.node, shard_facts(rt, shard))
            if moved is not None:
                return moved
            run_failover(rt.connector, rt.state_dir, Options(master=step.node, to=step.to or None, dry_run=True),
                         ignore)
        except RefusedError as exc:
            return Pending(f"{exc.summary} {exc.detail}".strip())
        return step.node

    writer = wait_for(writer_when_checks_pass, run.wait_timeout, f"the failover pre-checks of shard {step.shard} to "
                      "pass", interval=0.05)
    if writer != step.node:
        run.emit(Log(step.title(), f"{step.node} is no longer shard {shard.index}'s master: {writer} took its writes, "
                                   "nothing to fail over"))
        if rt.loaded.spec.topology == "replication":
            _repoint_behind(run, step, writer)
        return
    run_failover(rt.connector, rt.state_dir, Options(master=step.node, to=step.to or None),
                 as_log(run.emit, step.title()))


def _fail_over_drained(run: Execution, step: Failover) -> None:
    """A failover away from a node on a host the spec removed (spec.placement.drained): the runbook and the
    step's checks look at its shard with it back as a member (spec.placement.with_member), for this step only,
    without the members not started yet (its replacements: the post-checks would wait for them to follow)."""
    rt = run.rt
    layout = rt.loaded.layout
    members = [rt.node(m) for s in layout.shards if s.index == step.shard for m in s.members]
    absent = [n.name for n in members if not rt.provider.process_state(n).running]
    view = replace(rt.loaded, layout=_without_idle_sentinels(rt, with_member(layout, step.node, absent)))
    drained = replace(rt, loaded=view, connector=rt.connector.over(view))  # handles of its own, closed here
    try:
        fail_over(replace(run, rt=drained), step)
    finally:
        drained.connections.close()


def _without_idle_sentinels(rt: Runtime, layout: Layout) -> Layout:
    """layout without the sentinels not started yet (placed by this spec): the runbook asks every sentinel of its
    layout for CKQUORUM, and a new one starts after the failover, pointed at the master it made."""
    idle = {n.name for n in layout.sentinels if not rt.provider.process_state(n).running}
    return replace(layout, nodes=tuple(n for n in layout.nodes if n.name not in idle)) if idle else layout


def _repoint_behind(run: Execution, step: Failover, writer: str) -> None:
    """A failover another run finished (one killed right after its FAILOVER TO) leaves the shard's other replicas
    following the demoted master: they are pointed at the writer here, as the runbook would have, since the plan
    made before that failover ended has no step for them."""
    from opsctl.failover.fence import repoint_followers

    with _admins(run) as admin_of:
        for name in repoint_followers(run.rt.loaded, run.rt.node(step.node), run.rt.node(writer), admin_of):
            run.emit(Log(step.title(), f"{name} followed {step.node}: pointed at {writer}"))


@contextmanager
def _admins(run: Execution) -> Iterator[Callable[[Node], Connection]]:
    """The node handle of each node asked for: the run's own (the runtime closes them)."""
    yield lambda node: run.rt.connections[node.name]


def finish_failover(run: Execution, step: FinishFailover) -> None:
    finish_fenced(run, step.title(), "interrupted failover finished")


def finish_fenced(run: Execution, title: str, what: str) -> None:
    """What opsctl.failover.fence.finish decides from the live state (the same as a re-run of failover), logged
    under the title of the step that asked."""
    from opsctl.failover.fence import finish

    with _admins(run) as admin_of:
        finish(run.rt.loaded, admin_of, as_log(run.emit, title), what)




def do_replicate(run: Execution, step: Replicate) -> None:
    name = _master_now(run, step, step.master)
    if name is None:
        run.emit(Log(step.title(), f"{step.node} is the shard's master now: nothing to point"))
        return
    node, master = run.node(step), run.rt.node(name)
    handle, master_handle = run.rt.connections[node.name], run.rt.connections[master.name]
    if run.rt.loaded.spec.topology == "cluster":
        master_id = myid(master_handle)
        wait_for(lambda: True if _knows(handle, master_id) else None, 30.0,
                 f"{node.name} to learn about {master.name} through gossip")
        replicate(handle, master_id)
    else:
        _refuse_if_master_with_data(handle, node)
        _refuse_unless_master(master_handle, master, node)
        handle.call("REPLICAOF", master.address, str(master.port))
        handle.call("CONFIG", "REWRITE")


def _master_now(run: Execution, step: Step, planned: str) -> str | None:
    """The master a step points its node at, from a live look when it runs (masters.follow_target, as _follow_line
    decides a stopped node's): a failover earlier in the same plan moves the master the plan named."""
    layout = run.rt.loaded.layout
    shard = layout.shard_of(step.node)
    assert shard is not None, step.node
    master = follow_target(layout, shard, step.node, shard_facts(run.rt, shard))
    if master is not None and master != planned:
        run.emit(Log(step.title(), f"{planned} is no longer the shard's master: {step.node} follows {master}, "
                                   "its master now"))
    return master


def _refuse_if_master_with_data(handle: Connection, node: Node) -> None:
    """The step's precondition, checked again right before REPLICAOF: it would drop a master's data."""
    role = handle.read(ROLE)
    keys = int(str(handle.call("DBSIZE")))
    if role.kind == "master" and keys > 0:
        raise RefusedError(f"{node.name} became a master holding {keys} keys since the plan was made",
                           "REPLICAOF would replace its data with the master's",
                           "check which node has the data you want, then plan again")


def _refuse_unless_master(handle: Connection, master: Node, node: Node) -> None:
    """Checked again right before REPLICAOF, on the connection that follows: the master the step's look decided on
    still answers as one. Pointed at a replica, the node would chain behind it, or loop with it if that replica
    follows the node."""
    role = handle.read(ROLE)
    if role.kind != "master":
        follows = f" of {role.master[0]}:{role.master[1]}" if role.master else ""
        raise RefusedError(f"{master.name} is a {role.kind}{follows} now, not a master: {node.name} is left as it is",
                           "the shard's roles changed while the step ran (a failover in flight)",
                           "apply again once the roles settle (opsctl status shows them)")


def _knows(handle: Connection, node_id: str) -> bool:
    return any(line.id == node_id for line in handle.read(CLUSTER_NODES))


def sentinel_monitor(run: Execution, step: SentinelMonitor) -> None:
    spec = run.rt.loaded.spec
    node = run.node(step)
    address, port = _sentinels_master_now(run, step, step.master)
    name = sentinel_master_name(spec)
    topo = spec.sentinel_or_default()
    masked = render_node(run.rt.loaded, node, run.rt.provider.paths(node), reveal=False,
                         daemonize=run.rt.provider.daemonize, master=(address, port))
    renames = {k: v for k, v in sentinel_settings([d for s in masked.sections for d in s.directives]).items()
               if k.startswith("rename-command ")}
    handle = run.rt.connections[node.name]
    if _monitors(handle, name):
        handle.call("SENTINEL", "REMOVE", name)  # a stale view (plan.replication.stale_view)
    handle.call("SENTINEL", "MONITOR", name, address, str(port), str(sentinel_quorum(spec)))
    settings = {"auth-pass": run.rt.loaded.credentials.password.reveal(),
                "down-after-milliseconds": str(topo.down_after_ms),
                "failover-timeout": str(topo.failover_timeout_ms), "parallel-syncs": str(topo.parallel_syncs)}
    if spec.auth.mode == "acl":
        settings["auth-user"] = spec.auth.admin_user
    for key, value in [*settings.items(), *renames.items()]:
        handle.call("SENTINEL", "SET", name, *key.split(), value)


def _monitors(handle: Connection, name: str) -> bool:
    try:
        handle.call("SENTINEL", "MASTER", name)
    except NodeRefused:  # ERR No such master with that name
        return False
    return True


def _sentinels_master_now(run: Execution, step: Step, planned: str) -> tuple[str, int]:
    """Where a sentinel is pointed, from a live look when the step runs (runtime.master_endpoint, as a new
    sentinel's file): a failover earlier in the same plan moves the master the plan named."""
    where = sentinels_master(run.rt)
    assert where is not None
    now = run.rt.loaded.layout.find(endpoint(*where))
    if now is None or now.name != planned:
        run.emit(Log(step.title(), f"{planned} is no longer the shard's master: {step.node} monitors "
                                   f"{now.name if now else endpoint(*where)}, its master now"))
    return where


