"""Run a plan's steps through the provider and admin connections; after each mutation, look again."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from opsctl.apply.gather import master_endpoint, shard_facts
from opsctl.apply.runtime import Runtime
from opsctl.apply.waits import wait_back_in_place, wait_replication, wait_sentinels
from opsctl.base.connerr import is_auth_failure
from opsctl.base.endpoints import endpoint
from opsctl.base.errors import ConvergenceError, OpsctlError, RefusedError
from opsctl.base.events import Emit, Log, StepDone, StepFailed, StepStart
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.poll import Pending, wait_for
from opsctl.cluster.ops import form_cluster, meet, myid, replicate, reset_stale_identity
from opsctl.net.admin import Admin
from opsctl.net.connector import AuthRefused
from opsctl.net.observer import Observer, observe, wait_cluster_converged
from opsctl.net.rawpipe import PIPE_ERRORS
from opsctl.net.resp import RespError
from opsctl.net.topolock import check_held
from opsctl.observe.parse import ClusterNodeLine, parse_cluster_nodes, parse_role
from opsctl.plan.desired import single_valued, unquote
from opsctl.plan.fence import FENCE, MAX_LAG, TO_WRITE, spec_values
from opsctl.plan.masters import follow_target, start_master, takes_writes, writes_moved_from
from opsctl.plan.steps import (
    AclLoad,
    AssignSlots,
    CloseSlots,
    ConfigSet,
    Failover,
    FinishFailover,
    FormCluster,
    JoinCluster,
    MoveSlots,
    Plan,
    RemoveNode,
    Replicate,
    RestartNode,
    SentinelMonitor,
    SentinelSet,
    SetPasswords,
    StartNode,
    Step,
    StopNode,
    WaitConverged,
    WriteConfig,
)
from opsctl.render import render_node, render_sections
from opsctl.spec.layout import Node, deployed_as, sentinel_master_name, sentinel_quorum
from opsctl.tls.material import node_files

START_TIMEOUT = 60.0


@dataclass
class Before:
    """What a node had before this run touched it, to roll back a live change the server refused."""

    files: dict[str, str | None]
    record: dict[str, Any]
    config: list[tuple[str, str]] = field(default_factory=list)  # (directive, value before CONFIG SET)


@dataclass
class Execution:
    rt: Runtime
    emit: Emit
    allow_downtime: bool = False
    wait_timeout: float = 60.0
    plan: Plan | None = None
    timings: list[tuple[str, float]] = field(default_factory=list)
    before: dict[str, Before] = field(default_factory=dict)  # per node: its files and record before this run
    replicas_starting: Future[None] | None = None  # a new cluster's replicas, written and started beside it

    def sets_live(self, node: str) -> bool:
        """Does the plan CONFIG SET on this node? Then its files are kept to roll a refused value back."""
        return any(isinstance(s, ConfigSet) and s.node == node for s in (self.plan.steps if self.plan else ()))

    def undo_list(self, node: str) -> list[tuple[str, str]]:
        return self.before.setdefault(node, Before({}, {})).config

    def restarts(self, node: str) -> bool:
        return any(isinstance(s, RestartNode) and s.node == node for s in (self.plan.steps if self.plan else ()))


def execute(rt: Runtime, plan: Plan, emit: Emit, allow_downtime: bool = False,
            parallel_shards: int = 1, wait_timeout: float = 60.0) -> list[tuple[str, float]]:
    """Run every step in order (node-local write/start steps of different nodes in parallel waves);
    stop at the first failure with an error naming the step. parallel_shards > 1 rolls that many shards
    at once through a plan of restarts and failovers."""
    _refuse_downtime(plan, allow_downtime)
    run = Execution(rt, emit, allow_downtime, wait_timeout, plan)
    numbered = list(enumerate(plan.steps, start=1))
    if parallel_shards > 1 and all(isinstance(s, (RestartNode, Failover, WaitConverged)) for s in plan.steps):
        _run_shards_in_parallel(run, numbered, parallel_shards)
        return run.timings
    planned = waves(numbered)
    with ThreadPoolExecutor(max_workers=1) as beside:  # waited for on the way out, also when a step failed
        for wave, following in zip(planned, [*planned[1:], None], strict=True):
            if len(wave) == 1 and not isinstance(wave[0][0][1], NODE_LOCAL):
                _run_chain(run, wave[0], len(plan.steps))
                continue
            now, later = _masters_first(run, wave, following)

            def launched(later: list[list[tuple[int, Step]]] = later) -> None:
                run.replicas_starting = beside.submit(_run_wave, run, later, len(plan.steps))

            _run_wave(run, now, len(plan.steps), launched if later else None)
    return run.timings


Chain = list[tuple[int, Step]]


def _masters_first(run: Execution, wave: list[Chain], following: list[Chain] | None) -> tuple[list[Chain], list[Chain]]:
    """A node-local wave as (what runs now, what runs beside once the masters were launched). Before a
    form-cluster step the replicas' chains run beside: they are written and started as soon as the masters were
    launched, and form-cluster waits for them once the masters are set up and meet (a master's 2 s writable
    delay runs from its own start, so the masters start first and everything else overlaps it). A provider that
    stages files writes the replicas' files now all the same: they ship with the masters' in one playbook run,
    where a second shipment would cost a second run."""
    if following is None or not isinstance(following[0][0][1], FormCluster):
        return wave, []
    layout = run.rt.loaded.layout
    replicas = [chain for chain in wave if layout.node(chain[0][1].node).role != "master"]
    masters = [chain for chain in wave if chain not in replicas]
    if not run.rt.provider.stages_files:
        return masters, replicas
    writes = [[s for s in chain if not isinstance(s[1], StartNode)] for chain in replicas]
    starts = [[s for s in chain if isinstance(s[1], StartNode)] for chain in replicas]
    return masters + [c for c in writes if c], [c for c in starts if c]


NODE_LOCAL = (WriteConfig, StartNode)


def waves(numbered: list[tuple[int, Step]]) -> list[list[list[tuple[int, Step]]]]:
    """Split steps into waves; a wave of node-local steps holds one chain per node, run side by side."""
    result: list[list[list[tuple[int, Step]]]] = []
    chains: dict[str, list[tuple[int, Step]]] = {}
    for index, step in numbered:
        if isinstance(step, NODE_LOCAL):
            chains.setdefault(step.node, []).append((index, step))
            continue
        if chains:
            result.append(list(chains.values()))
            chains = {}
        result.append([[(index, step)]])
    if chains:
        result.append(list(chains.values()))
    return result


def _run_shards_in_parallel(run: Execution, numbered: list[tuple[int, Step]], width: int) -> None:
    """Shard groups side by side (each group in order), then whatever belongs to no shard."""
    groups: dict[int, list[tuple[int, Step]]] = {}
    for index, step in numbered:
        groups.setdefault(getattr(step, "shard", 0), []).append((index, step))
    rest = groups.pop(0, [])
    total = len(numbered)
    with ThreadPoolExecutor(max_workers=width) as pool:
        futures = [pool.submit(_run_chain, run, chain, total) for chain in groups.values()]
    errors = [exc for f in futures if (exc := f.exception()) is not None]
    if errors:
        raise errors[0]
    _run_chain(run, rest, total)


def _run_wave(run: Execution, wave: list[list[tuple[int, Step]]], total: int,
              launched: Callable[[], None] | None = None) -> None:
    """All config writes first (a staging provider ships them in one go), then every start at once; launched is
    called once every node was launched (or at the end, when none was to start)."""
    steps = [s for chain in wave for s in chain]
    _run_chain(run, [s for s in steps if isinstance(s[1], WriteConfig)], total)
    starts = [s for s in steps if isinstance(s[1], StartNode)]
    if starts:
        _start_together(run, starts, total, launched)
    elif launched is not None:
        launched()


def _start_together(run: Execution, starts: list[tuple[int, Step]], total: int,
                    launched: Callable[[], None] | None = None) -> None:
    """The provider launches every node at once and waits for them in one loop, then one loop waits until all
    answer PING; each step is done or failed on its own, and the first failure stops the plan."""
    check_held(run.rt.connector)  # as before each step: a run that lost its topology lock starts nothing
    began = time.monotonic()
    for index, step in starts:
        run.emit(StepStart(index, total, step.title()))
    nodes = [_node(run, step) for _, step in starts]
    # masters first: a new cluster is ok 2 s after its last master started (the server's writable delay), however
    # late its replicas start
    failed = run.rt.provider.start_many(sorted(nodes, key=lambda n: n.role != "master"), launched)
    failed |= wait_answering(run, [n for n in nodes if n.name not in failed])
    errors: list[OpsctlError] = []
    for index, step in starts:
        try:
            if step.node in failed:
                raise failed[step.node]
            _after_start(run, step)
        except OpsctlError as exc:
            run.emit(StepFailed(index, step.title(), exc.summary))
            exc.summary = f"step {index}/{total} ({step.title()}) failed: {exc.summary}"
            errors.append(changed_anyway(exc, len(run.timings)))
            continue
        elapsed = time.monotonic() - began
        run.timings.append((step.title(), elapsed))
        run.emit(StepDone(index, step.title(), round(elapsed, 3)))
    if errors:
        raise errors[0]


def _run_chain(run: Execution, chain: list[tuple[int, Step]], total: int) -> None:
    for index, step in chain:
        _run_step(run, index, total, step)


def changed_anyway(exc: OpsctlError, steps_done: int) -> OpsctlError:
    """A refusal (exit 3: nothing was changed) once steps_done steps ran is an error (exit 1) that says so:
    a pipeline must not take the topology for untouched."""
    if not isinstance(exc, RefusedError) or steps_done == 0:
        return exc
    hint = "; ".join(part for part in (exc.hint, "apply again plans from the state now") if part)
    return OpsctlError(f"{exc.summary} (after {steps_done} step(s) of this run had changed the topology)",
                       exc.detail, hint)


def _run_step(run: Execution, index: int, total: int, step: Step) -> None:
    check_held(run.rt.connector)  # a run that lost its topology lock stops before its next change
    run.emit(StepStart(index, total, step.title()))
    started = time.monotonic()
    try:
        HANDLERS[type(step)](run, step)
    except OpsctlError as exc:
        run.emit(StepFailed(index, step.title(), exc.summary))
        exc.summary = f"step {index}/{total} ({step.title()}) failed: {exc.summary}"
        raise changed_anyway(exc, len(run.timings)) from None
    except _redis_errors() as exc:
        run.emit(StepFailed(index, step.title(), str(exc)))
        raise OpsctlError(f"step {index}/{total} ({step.title()}) failed", str(exc),
                          "look at the node's log; apply again resumes from the live state") from None
    elapsed = time.monotonic() - started
    run.timings.append((step.title(), elapsed))
    run.emit(StepDone(index, step.title(), round(elapsed, 3)))


def _redis_errors() -> tuple[type[Exception], ...]:
    """redis-py's base error once anything loaded redis-py (nothing can raise it before). The executor loads it
    only where it talks through it: a new cluster's creation does not, so that import does not delay the start."""
    module = sys.modules.get("redis")
    return (module.RedisError,) if module is not None else ()


def _refuse_downtime(plan: Plan, allow_downtime: bool) -> None:
    masters = [s.node for s in plan.steps if isinstance(s, RestartNode) and s.needs_downtime]
    if masters and not allow_downtime:
        raise RefusedError(f"the plan restarts master(s) {', '.join(masters)}, which stops their writes",
                           "fail the master over first (opsctl failover), so it restarts as a replica",
                           "or pass --allow-downtime to accept the write outage")


def _node(run: Execution, step: Step) -> Node:
    return run.rt.node(step.node)


def _files(run: Execution, node: Node) -> dict[str, str]:
    rt = run.rt
    master = _sentinels_master(rt) if node.is_sentinel else None
    rendered = render_node(rt.loaded, node, rt.provider.paths(node), reveal=True,
                           daemonize=rt.provider.daemonize, master=master)
    files = {**rendered.files, **node_files(rt.loaded, rt.state_dir, node)}
    role_line = _replicaof_line(run, node)
    if role_line:
        files["redis.conf"] += role_line
    return files


def _sentinels_master(rt: Runtime) -> tuple[str, int] | None:
    """Where sentinels are pointed, from a look at the shard now (runtime.master_endpoint); None outside a Sentinel
    topology."""
    return master_endpoint(rt, shard_facts(rt, rt.loaded.layout.shards[0]))


def _replicaof_line(run: Execution, node: Node) -> str:
    """Keep a running replica a replica across restarts (replication/sentinel; clusters keep roles in nodes.conf).
    When the role cannot be read the file is not written: a replica restarting as a master is worse."""
    if node.is_sentinel or run.rt.loaded.spec.topology not in ("replication", "sentinel"):
        return ""
    if not run.rt.provider.process_state(node).running:
        return _follow_line(run, node)
    import redis

    try:
        with run.rt.admin(node, timeout=5.0) as admin:
            role = parse_role(admin.call("ROLE"))
    except redis.RedisError as exc:
        raise OpsctlError(f"cannot read {node.name}'s role before writing its config", str(exc),
                          "apply again when the node answers; its config file was left as it was") from None
    if role.kind == "replica" and role.master:
        return f"\n# current role, kept by opsctl\nreplicaof {role.master[0]} {role.master[1]}\n"
    return ""


def _follow_line(run: Execution, node: Node) -> str:
    """A stopped node starts as a replica of its shard's master now, if that is another node (masters.start_master,
    from the live state when the file is written). One the sentinels still name as master starts fenced:
    start_node lifts the fence once no Sentinel failover is in flight (or demotes it if one promoted a replica)."""
    layout = run.rt.loaded.layout
    shard = layout.shard_of(node.name)
    if shard is None:
        return ""
    follow = start_master(layout, shard, shard_facts(run.rt, shard))
    if follow is None:
        return ""
    if follow == node.name:
        if run.rt.loaded.spec.topology != "sentinel":
            return ""
        lag = spec_values(run.rt.loaded, node)[MAX_LAG]
        return (f"\n# fenced by opsctl until no Sentinel failover of this node is in flight\n"
                f"{TO_WRITE} {FENCE}\n{MAX_LAG} {lag if lag != '0' else '10'}\n")
    master = layout.node(follow)
    return f"\n# the shard's master when opsctl started this node\nreplicaof {master.address} {master.port}\n"


def write_config(run: Execution, step: Step) -> None:
    assert isinstance(step, WriteConfig)
    node = _node(run, step)
    files = _files(run, node)
    if node.name not in run.before and run.sets_live(node.name):
        provider = run.rt.provider
        run.before[node.name] = Before({name: provider.read_file(node, name) for name in files},
                                       provider.load_record(node))
    run.rt.provider.write_files(node, files)
    sections = render_sections(run.rt.loaded, node, run.rt.provider.paths(node), reveal=False,
                               daemonize=run.rt.provider.daemonize)
    directives = [list(d) for s in sections for d in s.directives]
    record = {"digest": step.digest, "directives": directives, "applied": time.time(), "deployed": deployed_as(node)}
    if run.restarts(node.name) and run.rt.provider.process_state(node).running:
        record["pending_restart"] = True  # cleared by the restart; a later plan restarts it if this run dies
    run.rt.provider.save_record(node, record)


def start_node(run: Execution, step: Step) -> None:
    node = _node(run, step)
    _raise_first(run.rt.provider.start_many([node]))
    _raise_first(wait_answering(run, [node]))
    _after_start(run, step)


def _after_start(run: Execution, step: Step) -> None:
    if run.rt.loaded.spec.topology == "sentinel" and not _node(run, step).is_sentinel:
        finish_failover(run, step, "started fenced")  # _follow_line: lifted, or demoted if a replica was promoted


def _raise_first(failed: dict[str, OpsctlError]) -> None:
    if failed:
        raise next(iter(failed.values()))


def wait_answering(run: Execution, nodes: list[Node], timeout: float = START_TIMEOUT) -> dict[str, OpsctlError]:
    """Poll until every node answers PING with the spec's password: one loop, all nodes at once. Returns the
    nodes that refuse the password or did not answer in time, with why."""
    failed: dict[str, OpsctlError] = {}
    pending = {n.name: n for n in nodes}
    if not nodes:
        return failed
    with Observer(run.rt.connector, nodes, timeout=2.0) as observer:
        def answer(node: Node) -> OpsctlError | bool:
            try:
                reply = observer.links[node.name].pipeline([("PING",)])[0]
            except AuthRefused as exc:
                if not is_auth_failure(exc.detail):
                    return False  # e.g. LOADING: still loading its data
                return OpsctlError(f"{node.name} refuses the spec's password", exc.detail,
                                   "the node runs with another password; check auth.password")
            except PIPE_ERRORS:
                return False
            return not isinstance(reply, RespError)  # LOADING and the like: not yet

        def check() -> bool | Pending:
            asked = list(pending.values())
            for node, reply in zip(asked, observer.pool.map(answer, asked), strict=True):
                if isinstance(reply, OpsctlError):
                    failed[node.name] = reply
                if reply is not False:
                    del pending[node.name]
            return Pending(f"no answer yet from {', '.join(pending)}") if pending else True

        try:
            wait_for(check, timeout, f"{len(nodes)} node(s) to answer PING")
        except ConvergenceError as exc:
            failed |= {name: exc for name in pending}
    return failed


def stop_node(run: Execution, step: Step) -> None:
    run.rt.provider.stop(_node(run, step))


def restart_node(run: Execution, step: Step) -> None:
    """Stop, start, and wait until the node is back in its place (a replica linked and caught up)."""
    assert isinstance(step, RestartNode)
    node = _node(run, step)
    _refuse_unplanned_downtime(run, step)
    run.rt.provider.stop(node)
    run.rt.provider.start(node)
    _raise_first(wait_answering(run, [node]))
    wait_back_in_place(run.rt, node, timeout=run.wait_timeout)
    record = run.rt.provider.load_record(node)
    if record.pop("pending_restart", None):
        run.rt.provider.save_record(node, record)


def _refuse_unplanned_downtime(run: Execution, step: RestartNode) -> None:
    """A restart planned without downtime (of a replica, or of a master failed over first) is refused when its node
    takes the shard's writes now (masters.takes_writes, from a look when the step runs): a failover since the plan
    was made promoted it, and stopping it would stop the shard's writes, which --allow-downtime alone accepts."""
    layout = run.rt.loaded.layout
    shard = layout.shard_of(step.node)
    if step.needs_downtime or run.allow_downtime or shard is None:
        return
    if takes_writes(layout, shard, step.node, shard_facts(run.rt, shard)):
        raise RefusedError(f"{step.node} takes shard {shard.index}'s writes now: restarting it would stop them",
                           f"the plan restarts {step.node} as a replica; a failover since the plan was made "
                           "promoted it (an operator's, or Sentinel's or the cluster's own)",
                           "apply again: a plan from the state now fails it over before its restart (or pass "
                           "--allow-downtime to accept the write outage)")


def sentinel_set(run: Execution, step: Step) -> None:
    """SENTINEL SET each changed setting; then remember them as applied in the sentinel's record."""
    assert isinstance(step, SentinelSet)
    node = _node(run, step)
    name = sentinel_master_name(run.rt.loaded.spec)
    password = run.rt.loaded.credentials.password.reveal()
    with run.rt.admin(node) as admin:
        for key, value in step.settings:
            admin.call("SENTINEL", "SET", name, *key.split(), password if key == "auth-pass" else value)
    master = _sentinels_master(run.rt)
    masked = render_node(run.rt.loaded, node, run.rt.provider.paths(node), reveal=False,
                         daemonize=run.rt.provider.daemonize, master=master)
    record = run.rt.provider.load_record(node)
    record["directives"] = [list(d) for s in masked.sections for d in s.directives]
    run.rt.provider.save_record(node, record)


def fail_over(run: Execution, step: Step) -> None:
    """The failover runbook (graceful): retried as a dry run until its pre-checks pass, so a replica that was
    restarted a moment ago has time to catch up; a refusal after that stops the rollout. Each try looks at the
    shard first: once another node took the master's writes (masters.writes_moved_from: failed over since the plan
    was made), there is nothing to fail over, and the step says so and goes on."""
    from opsctl.failover.runbook import Options, run_failover

    assert isinstance(step, Failover)
    rt = run.rt
    layout = rt.loaded.layout
    shard = layout.shard_of(step.node)
    assert shard is not None, step.node

    def say(text: str) -> None:
        run.emit(Log(step.title(), text))

    def writer_when_checks_pass() -> str | Pending:
        try:
            moved = writes_moved_from(layout, shard, step.node, shard_facts(rt, shard))
            if moved is not None:
                return moved
            run_failover(rt.connector, rt.state_dir, Options(master=step.node, dry_run=True), lambda _: None)
        except RefusedError as exc:
            return Pending(f"{exc.summary} {exc.detail}".strip())
        return step.node

    writer = wait_for(writer_when_checks_pass, run.wait_timeout, f"the failover pre-checks of shard {step.shard} to "
                      "pass", interval=0.05)
    if writer != step.node:
        say(f"{step.node} is no longer shard {shard.index}'s master: {writer} took its writes, nothing to fail over")
        return
    run_failover(rt.connector, rt.state_dir, Options(master=step.node), say)


def finish_failover(run: Execution, step: Step, what: str = "interrupted failover finished") -> None:
    """What opsctl.failover.fence.finish decides from the live state (the same as a re-run of failover)."""
    from opsctl.failover.fence import finish

    admins: dict[str, Admin] = {}

    def admin_of(node: Node) -> Admin:
        if node.name not in admins:
            admins[node.name] = run.rt.admin(node)
        return admins[node.name]

    try:
        finish(run.rt.loaded, admin_of, lambda text: run.emit(Log(step.title(), text)), what)
    finally:
        for admin in admins.values():
            admin.close()


def config_set(run: Execution, step: Step) -> None:
    """CONFIG SET the rendered value (or, for a directive the spec dropped, the step's default). A value the
    server refuses rolls the node back: its earlier CONFIG SETs of this run, its files and its record."""
    assert isinstance(step, ConfigSet)
    node = _node(run, step)
    real = single_valued([d for s in render_node(run.rt.loaded, node, run.rt.provider.paths(node), reveal=True,
                                                 daemonize=run.rt.provider.daemonize).sections
                          for d in s.directives])
    value = unquote(real.get(step.directive, step.value))
    import redis

    with run.rt.admin(node) as admin:
        old = admin.config_get(step.directive).get(step.directive)
        try:
            admin.config_set(step.directive, value)
        except redis.ResponseError as exc:
            undone = roll_back(run, node, admin)
            raise OpsctlError(f"{node.name} refused CONFIG SET {step.directive}: {exc}",
                              f"rolled back on {node.name}: {undone}",
                              f"fix {step.directive} in the spec (a value {node.name}'s server accepts), "
                              "then apply again") from None
        if old is not None:
            run.undo_list(node.name).append((step.directive, old))


def roll_back(run: Execution, node: Node, admin: Admin) -> str:
    """Undo this run's changes to one node: CONFIG SETs in reverse, then its files and record as they were."""
    before = run.before.get(node.name)
    if before is None:
        return "nothing had changed"
    done: list[str] = []
    for directive, old in reversed(before.config):
        admin.config_set(directive, old)
        done.append(directive)
    restore = {name: text for name, text in before.files.items() if text is not None}
    if restore:
        run.rt.provider.write_files(node, restore)
        run.rt.provider.save_record(node, before.record)
        done.append(", ".join(sorted(restore)))
    return ", ".join(done) or "nothing had changed"


def set_passwords(run: Execution, step: Step) -> None:
    """The node accepts the spec's password (and the previous one during the overlap). A server takes
    requirepass and the extra password in one MULTI, so no client is ever refused in between."""
    node = _node(run, step)
    credentials = run.rt.loaded.credentials
    new = credentials.password.reveal()
    previous = credentials.previous.reveal() if credentials.previous else ""
    extra = [f">{previous}"] if previous and previous != new else []
    with run.rt.admin(node) as admin:
        if node.is_sentinel:
            admin.call("ACL", "SETUSER", "default", "resetpass", f">{new}", *extra)
            admin.call("SENTINEL", "CONFIG", "SET", "sentinel-pass", new)
            admin.call("SENTINEL", "FLUSHCONFIG")
            return
        pipe = admin.client.pipeline(transaction=True)
        pipe.execute_command(admin.command("CONFIG"), "SET", "requirepass", new)  # the value CONFIG REWRITE keeps
        pipe.execute_command(admin.command("ACL"), "SETUSER", "default", "resetpass", f">{new}", *extra)
        pipe.execute()


def acl_load(run: Execution, step: Step) -> None:
    with run.rt.admin(_node(run, step)) as admin:
        admin.call("ACL", "LOAD")


def form(run: Execution, step: Step) -> None:
    """Form the cluster. The replicas' writes and starts of the wave before run as their own steps beside it
    (Execution.replicas_starting), while the masters are set up and meet; the first of them that fails fails
    this step too."""
    assert isinstance(step, FormCluster)
    replicas, run.replicas_starting = run.replicas_starting, None
    form_cluster(run.rt.connector, run.rt.loaded.layout,
                 replicas_started=replicas.result if replicas is not None else None)


def join_cluster(run: Execution, step: Step) -> None:
    assert isinstance(step, JoinCluster)
    node, via = _node(run, step), run.rt.node(step.via)
    with run.rt.admin(node) as admin, run.rt.admin(via) as via_admin:
        via_view = parse_cluster_nodes(str(via_admin.raw("CLUSTER", "NODES")))
        live = _known_by_its_peers(run, node, parse_cluster_nodes(str(admin.raw("CLUSTER", "NODES"))), via_view)
        old_id = None if node.endpoint in live.handshaking else reset_stale_identity(admin, node, live.ids)
        if old_id is not None:
            run.emit(Log(step.title(), f"{node.name} came back as {old_id[:8]}, a node the cluster forgot: "
                                       "reset it to a new empty node (CLUSTER RESET HARD)"))
        meet(admin, via.address, via.port)


@frozen
class KnownBack(Frozen):
    """What the cluster's nodes know of a joining node: every id they know, and the endpoints they are still
    shaking hands with (a MEET under way: the met side knows the meeter only by a random id until its PING)."""

    ids: frozenset[str]
    handshaking: frozenset[str]


def _known_by_its_peers(run: Execution, node: Node, view: list[ClusterNodeLine],
                        via_view: list[ClusterNodeLine]) -> KnownBack:
    """What via and the spec's nodes that node itself knows know of the cluster (they answer, else they count for
    nothing). A node met by some of the cluster and not yet by via (a creation killed after a replica met only
    its master), or whose MEETs were under way (killed while the masters met), is known back: not a forgotten
    identity to reset."""
    import redis

    views = [via_view]
    by_endpoint = {n.endpoint: n for n in run.rt.loaded.layout.servers if n.name != node.name}
    for peer in (by_endpoint[line.endpoint] for line in view if line.endpoint in by_endpoint):
        try:
            with run.rt.admin(peer, timeout=2.0) as peer_admin:
                views.append(parse_cluster_nodes(str(peer_admin.raw("CLUSTER", "NODES"))))
        except redis.RedisError:
            continue
    lines = [line for v in views for line in v]
    return KnownBack(frozenset(line.id for line in lines),
                     frozenset(line.endpoint for line in lines if "handshake" in line.flags))


def do_replicate(run: Execution, step: Step) -> None:
    assert isinstance(step, Replicate)
    name = _master_now(run, step, step.master)
    if name is None:
        run.emit(Log(step.title(), f"{step.node} is the shard's master now: nothing to point"))
        return
    node, master = _node(run, step), run.rt.node(name)
    with run.rt.admin(node) as admin, run.rt.admin(master) as master_admin:
        if run.rt.loaded.spec.topology == "cluster":
            master_id = myid(master_admin)
            wait_for(lambda: True if _knows(admin, master_id) else None, 30.0,
                     f"{node.name} to learn about {master.name} through gossip")
            replicate(admin, master_id)
        else:
            _refuse_if_master_with_data(admin, node)
            _refuse_unless_master(master_admin, master, node)
            admin.call("REPLICAOF", master.address, str(master.port))
            admin.call("CONFIG", "REWRITE")


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


def _refuse_if_master_with_data(admin: Admin, node: Node) -> None:
    """The step's precondition, checked again right before REPLICAOF: it would drop a master's data."""
    role = parse_role(admin.call("ROLE"))
    keys = int(admin.client.dbsize())
    if role.kind == "master" and keys > 0:
        raise RefusedError(f"{node.name} became a master holding {keys} keys since the plan was made",
                           "REPLICAOF would replace its data with the master's",
                           "check which node has the data you want, then plan again")


def _refuse_unless_master(admin: Admin, master: Node, node: Node) -> None:
    """Checked again right before REPLICAOF, on the connection that follows: the master the step's look decided on
    still answers as one. Pointed at a replica, the node would chain behind it, or loop with it if that replica
    follows the node."""
    role = parse_role(admin.call("ROLE"))
    if role.kind != "master":
        follows = f" of {role.master[0]}:{role.master[1]}" if role.master else ""
        raise RefusedError(f"{master.name} is a {role.kind}{follows} now, not a master: {node.name} is left as it is",
                           "the shard's roles changed while the step ran (a failover in flight)",
                           "apply again once the roles settle (opsctl status shows them)")


def _knows(admin: Admin, node_id: str) -> bool:
    return any(line.id == node_id for line in parse_cluster_nodes(str(admin.raw("CLUSTER", "NODES"))))


def sentinel_monitor(run: Execution, step: Step) -> None:
    assert isinstance(step, SentinelMonitor)
    spec = run.rt.loaded.spec
    node = _node(run, step)
    address, port = _sentinels_master_now(run, step, step.master)
    name = sentinel_master_name(spec)
    topo = spec.sentinel_or_default()
    with run.rt.admin(node) as admin:
        admin.call("SENTINEL", "MONITOR", name, address, str(port), str(sentinel_quorum(spec)))
        settings = {"auth-pass": run.rt.loaded.credentials.password.reveal(),
                    "down-after-milliseconds": str(topo.down_after_ms),
                    "failover-timeout": str(topo.failover_timeout_ms), "parallel-syncs": str(topo.parallel_syncs)}
        if spec.auth.mode == "acl":
            settings["auth-user"] = spec.auth.admin_user
        for key, value in settings.items():
            admin.call("SENTINEL", "SET", name, key, value)


def _sentinels_master_now(run: Execution, step: Step, planned: str) -> tuple[str, int]:
    """Where a sentinel is pointed, from a live look when the step runs (runtime.master_endpoint, as a new
    sentinel's file): a failover earlier in the same plan moves the master the plan named."""
    where = _sentinels_master(run.rt)
    assert where is not None
    now = run.rt.loaded.layout.find(endpoint(*where))
    if now is None or now.name != planned:
        run.emit(Log(step.title(), f"{planned} is no longer the shard's master: {step.node} monitors "
                                   f"{now.name if now else endpoint(*where)}, its master now"))
    return where


def wait_converged(run: Execution, step: Step) -> None:
    loaded = run.rt.loaded
    topology = loaded.spec.topology
    if topology == "cluster":
        wait_cluster_converged(run.rt.connector, _cluster_now(run.rt), timeout=60.0)
    elif topology in ("replication", "sentinel"):
        wait_replication(run.rt, timeout=60.0)
    if topology == "sentinel":
        wait_sentinels(run.rt, timeout=60.0)


def _cluster_now(rt: Runtime) -> list[Node]:
    """The spec's servers and the nodes a larger spec had that the cluster still knows (slots.scale.retired_nodes,
    as a slot session and the failover checks take them): a scale-in killed before its drain and removal, which
    the same apply's next plan does, leaves them known, and the cluster as it is agrees or not."""
    from opsctl.plan.slotmath.scale import retired_nodes

    servers = list(rt.loaded.layout.servers)
    views = [o.cluster_nodes for o in observe(rt.connector, servers).values() if o.cluster_nodes]
    return [*servers, *retired_nodes(rt.loaded, views)]


def move_slots(run: Execution, step: Step) -> None:
    from opsctl.apply import slot_steps as handlers

    assert isinstance(step, MoveSlots)
    handlers.move_slots(run.rt, step, run.emit)


def assign_slots(run: Execution, step: Step) -> None:
    from opsctl.apply import slot_steps as handlers

    assert isinstance(step, AssignSlots)
    handlers.assign_slots(run.rt, step, run.emit)


def close_slots(run: Execution, step: Step) -> None:
    from opsctl.apply import slot_steps as handlers

    assert isinstance(step, CloseSlots)
    handlers.close_slots(run.rt, step, run.emit)


def remove_node(run: Execution, step: Step) -> None:
    from opsctl.apply import slot_steps as handlers

    assert isinstance(step, RemoveNode)
    handlers.remove_node(run.rt, step, run.emit)


HANDLERS: dict[type[Step], Callable[[Execution, Step], None]] = {
    WriteConfig: write_config, StartNode: start_node, StopNode: stop_node, RestartNode: restart_node,
    Failover: fail_over, SentinelSet: sentinel_set, FinishFailover: finish_failover,
    ConfigSet: config_set, AclLoad: acl_load, SetPasswords: set_passwords,
    FormCluster: form, JoinCluster: join_cluster, Replicate: do_replicate,
    SentinelMonitor: sentinel_monitor, WaitConverged: wait_converged,
    MoveSlots: move_slots, AssignSlots: assign_slots, CloseSlots: close_slots, RemoveNode: remove_node,
}
