"""The node steps of a plan: write a node's files, start, stop and restart its server, change its config live
(rolled back when the server refuses), its passwords and its ACL file. A server's files keep the role it has now."""

from __future__ import annotations

import time
from dataclasses import replace

from opsctl.apply.replication_steps import finish_fenced, sentinels_master
from opsctl.base.errors import (
    AuthRefused,
    ConvergenceError,
    NodeError,
    NodeRefused,
    NodeUnreachable,
    OpsctlError,
    RefusedError,
    is_auth_failure,
)
from opsctl.base.poll import Pending, wait_for
from opsctl.base.secrets import Secret, remember
from opsctl.net.connection import Connection, said
from opsctl.net.observer import Observer
from opsctl.net.topolock import mark_started, stopping
from opsctl.observe.replies import ROLE, Command, RespError
from opsctl.plan.desired import single_valued, unquote
from opsctl.plan.facts import FENCE, MAX_LAG, TO_WRITE, spec_values
from opsctl.plan.masters import start_master, takes_writes
from opsctl.plan.rotation import managed_users
from opsctl.plan.steps import AclLoad, ConfigSet, RestartNode, SetPasswords, StartNode, StopNode, WriteConfig
from opsctl.render import render_node, render_sections
from opsctl.runtime.execution import Before, Execution
from opsctl.runtime.gather import shard_facts
from opsctl.spec.deployed import DeployedAs, NodeRecord
from opsctl.spec.layout import Node
from opsctl.status.looks import wait_back_in_place
from opsctl.tls.material import node_files

START_TIMEOUT = 60.0


def _files(run: Execution, node: Node) -> dict[str, str]:
    rt = run.rt
    master = sentinels_master(rt) if node.is_sentinel else None
    rendered = render_node(rt.loaded, node, rt.provider.paths(node), reveal=True,
                           daemonize=rt.provider.daemonize, master=master)
    files = {**rendered.files, **node_files(rt.loaded, rt.state_dir, node)}
    role_line = _replicaof_line(run, node)
    if role_line:
        files["redis.conf"] += role_line
    return files




def _replicaof_line(run: Execution, node: Node) -> str:
    """Keep a running replica a replica across restarts (replication/sentinel; clusters keep roles in nodes.conf).
    When the role cannot be read the file is not written: a replica restarting as a master is worse."""
    if node.is_sentinel or run.rt.loaded.spec.topology not in ("replication", "sentinel"):
        return ""
    if not run.rt.provider.process_state(node).running:
        return _follow_line(run, node)
    try:
        role = run.rt.connections[node.name].read(ROLE)
    except NodeError as exc:
        raise OpsctlError(f"cannot read {node.name}'s role before writing its config", said(exc),
                          "apply again when the node answers; its config file was left as it was") from None
    if role.kind == "replica" and role.master:
        return f"\n# current role, kept by opsctl\nreplicaof {role.master[0]} {role.master[1]}\n"
    return ""


def _follow_line(run: Execution, node: Node) -> str:
    """A stopped node starts as a replica of its shard's master now, if that is another node (masters.start_master,
    from the live state when the file is written). One the sentinels still name as master starts fenced:
    after_start lifts the fence once no Sentinel failover is in flight (or demotes it if one promoted a replica)."""
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


def write_config(run: Execution, step: WriteConfig) -> None:
    node = run.node(step)
    files = _files(run, node)
    if node.name not in run.before and run.sets_live(node.name):
        provider = run.rt.provider
        run.before[node.name] = Before({name: provider.read_file(node, name) for name in files},
                                       provider.load_record(node))
    run.rt.provider.write_files(node, files)
    sections = render_sections(run.rt.loaded, node, run.rt.provider.paths(node), reveal=False,
                               daemonize=run.rt.provider.daemonize)
    record = NodeRecord(step.digest, tuple(d for s in sections for d in s.directives), time.time(),
                        DeployedAs.of(node))
    if run.restarts(node.name) and run.rt.provider.process_state(node).running:
        record = replace(record, pending_restart=True)  # cleared by the restart; a later plan restarts it if it dies
    run.rt.provider.save_record(node, record)


def after_start(run: Execution, step: StartNode) -> None:
    """What a StartNode step does once the executor started its node (with the others of its wave, _start_together):
    a server of a Sentinel topology may have started fenced (_follow_line), and finish_fenced lifts the fence, or
    demotes the node if the sentinels promoted a replica meanwhile."""
    if run.rt.loaded.spec.topology == "sentinel" and not run.node(step).is_sentinel:
        finish_fenced(run, step.title(), "started fenced")


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
                reply = observer.connections[node.name].texts([("PING",)])[0]
            except AuthRefused as exc:
                if not is_auth_failure(exc.detail):
                    return False  # e.g. LOADING: still loading its data
                return OpsctlError(f"{node.name} refuses the spec's password", exc.detail,
                                   "the node runs with another password; check auth.password")
            except NodeUnreachable:
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


def stop_node(run: Execution, step: StopNode) -> None:
    stopping(run.rt.connector, [step.node])  # the run's own stops do not count against its topology lock
    run.rt.provider.stop(run.node(step))


def restart_node(run: Execution, step: RestartNode) -> None:
    """Stop, start, and wait until the node is back in its place (a replica linked and caught up)."""
    node = run.node(step)
    _refuse_unplanned_downtime(run, step)
    stopping(run.rt.connector, [node.name])
    run.rt.provider.stop(node)
    run.rt.provider.start(node)
    _raise_first(wait_answering(run, [node]))
    mark_started(run.rt.connector, [node.name])  # its marker went with the stop: marked again before it is waited on
    wait_back_in_place(run.rt, node, timeout=run.wait_timeout)
    record = run.rt.provider.load_record(node)
    if record.pending_restart:
        run.rt.provider.save_record(node, replace(record, pending_restart=False))


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




def config_set(run: Execution, step: ConfigSet) -> None:
    """CONFIG SET the rendered value (or, for a directive the spec dropped, the step's default). A value the
    server refuses rolls the node back: its earlier CONFIG SETs of this run, its files and its record."""
    node = run.node(step)
    real = single_valued([d for s in render_node(run.rt.loaded, node, run.rt.provider.paths(node), reveal=True,
                                                 daemonize=run.rt.provider.daemonize).sections
                          for d in s.directives])
    value = unquote(real.get(step.directive, step.value))
    handle = run.rt.connections[node.name]
    old = handle.config_get(step.directive).get(step.directive)
    try:
        handle.config_set(step.directive, value)
    except NodeRefused as exc:
        undone = roll_back(run, node, handle)
        raise OpsctlError(f"{node.name} refused CONFIG SET {step.directive}: {exc.detail}",
                          f"rolled back on {node.name}: {undone}",
                          f"fix {step.directive} in the spec (a value {node.name}'s server accepts), "
                          "then apply again") from None
    if old is not None:
        run.undo_list(node.name).append((step.directive, old))


def roll_back(run: Execution, node: Node, handle: Connection) -> str:
    """Undo this run's changes to one node: CONFIG SETs in reverse, then its files and record as they were."""
    before = run.before.get(node.name)
    if before is None:
        return "nothing had changed"
    done: list[str] = []
    for directive, old in reversed(before.config):
        handle.config_set(directive, old)
        done.append(directive)
    restore = {name: text for name, text in before.files.items() if text is not None}
    if restore:
        run.rt.provider.write_files(node, restore)
        run.rt.provider.save_record(node, before.record)
        done.append(", ".join(sorted(restore)))
    return ", ".join(done) or "nothing had changed"


def set_passwords(run: Execution, step: SetPasswords) -> None:
    """The node accepts the spec's password (and the previous one during the overlap). A server takes
    requirepass and the extra password in one MULTI, so no client is ever refused in between."""
    node = run.node(step)
    users = managed_users(run.rt.loaded, node)
    new = users["default"][0].reveal()
    handle = run.rt.connections[node.name]
    if node.is_sentinel:
        for user, secrets in users.items():
            handle.call("ACL", "SETUSER", user, "resetpass", *_password_words(*secrets))
        handle.call("SENTINEL", "CONFIG", "SET", "sentinel-pass", new)
        handle.call("SENTINEL", "FLUSHCONFIG")
        return
    commands: list[Command] = [("CONFIG", "SET", "requirepass", new)]  # the value CONFIG REWRITE keeps
    commands += [("ACL", "SETUSER", user, "resetpass", *_password_words(*secrets)) for user, secrets in users.items()]
    for command, reply in zip(commands, handle.transaction(commands), strict=True):
        if isinstance(reply, RespError):  # named by its first two words: the rest are passwords
            raise handle.refused(" ".join(command[:2]), reply.message)


def _password_words(secret: Secret, previous: Secret | None) -> list[str]:
    """ACL SETUSER's words for a user accepting secret, and previous during the overlap."""
    accepted = [secret, *([previous] if previous is not None and previous.reveal() and previous != secret else [])]
    for one in accepted:
        remember(one)  # masked wherever an error would echo it
    return [f">{one.reveal()}" for one in accepted]


def acl_load(run: Execution, step: AclLoad) -> None:
    run.rt.connections[step.node].call("ACL", "LOAD")

