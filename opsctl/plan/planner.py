"""(spec, observed facts) -> Plan. Pure: no I/O, every step with its reason."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from opsctl.base.errors import RefusedError
from opsctl.base.secrets import MASK
from opsctl.observe.parse import IMMUTABLE, PROTECTED, config_equal, is_config_directive
from opsctl.plan.desired import NOT_CONFIG_DIRECTIVES, DesiredNode, single_valued, unquote
from opsctl.plan.facts import NodeFacts, fingerprint
from opsctl.plan.fence import FENCE, TO_WRITE
from opsctl.plan.masters import (
    cluster_endpoints,
    current_master,
    has_slots,
    sentinel_agreed_master,
    shard_master,
    start_master,
    writer_now,
)
from opsctl.plan.ondisk import DIFFERS, canonical
from opsctl.plan.rotation import after_rotation, rotation_steps
from opsctl.plan.slotmath.planning import slot_steps
from opsctl.plan.steps import (
    AclLoad,
    AssignSlots,
    CloseSlots,
    ConfigSet,
    Failover,
    FinishFailover,
    FormCluster,
    JoinCluster,
    Plan,
    Replicate,
    RestartNode,
    SentinelMonitor,
    SentinelSet,
    StartNode,
    Step,
    WaitConverged,
    WriteConfig,
)
from opsctl.render.tokens import quoted
from opsctl.server.defaults import SERVER_DEFAULTS
from opsctl.server.versions import Version, parse_version, rolling_change_problem, server_text
from opsctl.spec.layout import Layout, Node, Shard, deployed_as, sentinel_master_name
from opsctl.spec.load import LoadedSpec

Facts = Mapping[str, NodeFacts]


def make_plan(loaded: LoadedSpec, desired: Mapping[str, DesiredNode], facts: Facts, spec_digest: str,
              filling: Collection[int] = ()) -> Plan:
    """filling: the shards a scale-out was filling when its run stopped (the slot journal's, read by the shell)."""
    layout = loaded.layout
    server = (loaded.spec.server.flavor, parse_version(loaded.spec.server.version))
    refuse_unsafe_server_change(facts, server)
    refuse_empty_master_restart(loaded, facts)
    if loaded.spec.topology == "cluster":
        refuse_layout_change(layout, facts)
    together = renames_changed(layout, desired, facts)
    steps: list[Step] = []
    for shard in layout.shards:
        steps += shard_steps(layout, shard, desired, facts, server, together, loaded.spec.topology)
    topology = loaded.spec.topology
    waiting = _masters_coming_back(layout, facts) if topology == "cluster" else []
    if waiting:
        return _start_first(loaded, steps, waiting, facts, spec_digest)
    moving = {s.node for s in steps if isinstance(s, Failover)}
    replan = False
    if topology == "cluster":
        cluster = cluster_steps(layout, facts, moving, filling)
        repairs = [s for s in cluster if isinstance(s, (AssignSlots, CloseSlots))]
        if moving and repairs:
            return _repairs_first(loaded, repairs, SLOTS_FIRST, facts, spec_digest)
        closing = any(isinstance(s, CloseSlots) for s in repairs)  # the moves are planned once nothing is open
        if closing and any(shard.index in filling for shard in layout.shards):
            return _repairs_first(loaded, repairs, FILL_AFTER_REPAIRS, facts, spec_digest)
        steps += cluster
        replan = closing
    elif topology in ("replication", "sentinel"):
        finish = finish_failover_steps(layout, facts)
        if finish and any(isinstance(s, RestartNode) for s in steps):
            return _repairs_first(loaded, finish, FINISH_FIRST, facts, spec_digest)
        steps += finish + replication_steps(layout, facts, moving)
    if topology == "sentinel":
        steps = _with_sentinel_steps(loaded, desired, facts, steps, moving)
    rotation = rotation_steps(loaded, desired, facts)
    steps = rotation + after_rotation(rotation, steps)
    if topology != "standalone" and steps and not isinstance(steps[-1], FormCluster):  # it waits itself
        steps.append(WaitConverged(layout.nodes[0].name, "wait until every node agrees"))
    elif topology == "cluster" and not steps and (settling := _settling(layout, facts)):
        steps.append(WaitConverged(layout.nodes[0].name, f"formed, but cluster_state is not ok yet on "
                                   f"{', '.join(settling)} (a run stopped before it settled): wait until it is"))
    elif topology != "cluster" and not steps and (linking := _linking(layout, facts)):
        steps.append(WaitConverged(layout.nodes[0].name, f"{', '.join(linking)} not linked to the master yet "
                                   "(started a moment ago, or a run stopped before it settled): wait until linked"))
    notes = (CLOSE_THEN_MOVES,) if replan else () if steps else (_why_nothing(loaded, facts),)
    return Plan(loaded.spec.name, spec_digest, fingerprint(facts), tuple(steps), notes, replan=replan)


def _masters_coming_back(layout: Layout, facts: Facts) -> list[str]:
    """Shard masters that are down and come back by themselves from their nodes.conf (a whole shard or the whole
    cluster was stopped): until they run, their slots look unowned and the cluster looks unformed."""
    masters = [current_master(shard, layout, facts) for shard in layout.shards]
    return [m for m in masters if _rejoins(layout.node(m), facts)]


def _start_first(loaded: LoadedSpec, steps: list[Step], waiting: list[str], facts: Facts, spec_digest: str) -> Plan:
    """Only the down nodes' steps now (they start and rejoin with their slots and data); apply observes again
    once they run and plans the rest (config changes, joins, replicas, slot moves, the wait) from what it sees."""
    note = (f"{', '.join(waiting)} {'is a shard master' if len(waiting) == 1 else 'are shard masters'} that "
            "stopped with the cluster's nodes.conf: started first, they rejoin with their slots and data; "
            "apply then observes again and plans the rest")
    first = tuple(s for s in steps if not facts[s.node].running)
    return Plan(loaded.spec.name, spec_digest, fingerprint(facts), first, (note,), replan=True)


SLOTS_FIRST = ("slots a killed run left open or unserved are repaired first: a failover refuses while slots are "
               "open, and the repair decides which masters take writes; apply then observes again and plans the rest")
FILL_AFTER_REPAIRS = ("slots a killed run left open are closed first: the moves that finish its scale-out are "
                      "planned from what closing leaves; apply then observes again and plans them")
CLOSE_THEN_MOVES = ("slots a killed run left open are closed in this plan; the moves and removals still to make (a "
                    "scale-in's drain, say) are planned from what closing leaves: apply then observes again and "
                    "plans them")
FINISH_FIRST = ("the interrupted failover is finished first: a restart would lift its fence (two masters taking "
                "writes), and finishing it decides the master; apply then observes again and plans the rest")


def _repairs_first(loaded: LoadedSpec, repairs: Sequence[Step], note: str, facts: Facts, spec_digest: str) -> Plan:
    """Only the repairs of what a killed run left now, when the plan also restarts nodes (in a cluster: fails
    masters over): they decide which node takes which writes, and so the rolling order, the failover before a
    master's restart and the master a step names. A slot repair comes before a failover, which refuses while
    slots are open; an interrupted failover is finished before a restart, which would lift its fence. Open slots
    are also closed alone while a scale-out is unfinished: the moves that finish it are planned from what closing
    leaves. Apply observes again once they ran and plans the rest."""
    return Plan(loaded.spec.name, spec_digest, fingerprint(facts), tuple(repairs), (note,), replan=True)


def _settling(layout: Layout, facts: Facts) -> list[str]:
    """Cluster nodes that answer but do not report cluster_state ok (yet)."""
    return [n.name for n in layout.servers
            if facts[n.name].reachable and facts[n.name].info.get("cluster_state", "ok") != "ok"]


def _linking(layout: Layout, facts: Facts) -> list[str]:
    """Replicas that answer, but whose link to their master is not up (yet)."""
    return [n.name for n in layout.servers
            if facts[n.name].reachable and (r := facts[n.name].role) and r.kind == "replica" and r.link != "connected"]


def _why_nothing(loaded: LoadedSpec, facts: Facts) -> str:
    count = len(facts)
    nodes = "the node runs, its config matches" if count == 1 else f"all {count} nodes run, their configs match"
    return (f"nothing to do: {nodes} the spec, "
            f"and the {loaded.spec.topology} topology is formed (roles inside a shard are not drift)")


def refuse_unsafe_server_change(facts: Facts, server: tuple[str, Version]) -> None:
    """A server change that would break replication mid-rollout is refused before anything is touched."""
    for f in facts.values():
        running = f.server if f.reachable else None
        if running is None:
            continue
        problem = rolling_change_problem(running, server)
        if problem:
            raise RefusedError(f"cannot change {f.name} from {server_text(*running)} to {server_text(*server)}",
                               problem, "keep the current server version, or migrate the data to a new topology")


NodeSteps = Callable[[Node, bool], list[Step]]


def refuse_empty_master_restart(loaded: LoadedSpec, facts: Facts) -> None:
    """Without persistence a master restarts empty, and its replicas would copy the empty data set; unless another
    node is the shard's master now (the down ones start as its replicas), even one promoted before it held a key."""
    persistence = loaded.spec.persistence
    if persistence.aof != "off" or persistence.rdb:
        return
    for shard in loaded.layout.shards:
        down = [m for m in shard.members if _restarting(facts[m])]
        holding = [m for m in shard.members if facts[m].running and facts[m].role and facts[m].keys > 0]
        follow = start_master(loaded.layout, shard, facts) if down else None
        if down and holding and (follow is None or follow in down):
            raise RefusedError(
                f"{', '.join(down)} is down and runs without persistence: started now it would come back "
                f"empty as master, and {', '.join(holding)} would copy the empty data set",
                "persistence is off (aof: off, rdb: []), so nothing on disk survives a restart",
                f"promote a replica first (opsctl failover --shard {shard.index} --mode takeover --yes, or "
                "wait for the cluster or Sentinel to do it), then apply again")


def refuse_layout_change(layout: Layout, facts: Facts) -> None:
    """A deployed node keeps its shard, role, host and port: a spec that derives others for its name (another
    cluster.replicas_per_master, hosts in another order) would restart it as another node. Compared with the
    record of what it was deployed as, not with live roles (failovers move those legitimately)."""
    moved = []
    for node in layout.servers:
        was = facts[node.name].record.get("deployed") if node.name in facts else None
        now = deployed_as(node)
        if isinstance(was, Mapping) and dict(was) != now:
            moved.append(f"{node.name}: deployed as {_as_text(was)}, the spec now makes it {_as_text(now)}")
    if moved:
        raise RefusedError(f"the spec changes what {len(moved)} deployed node(s) are", "\n".join(moved),
                           "a running node cannot move to another shard, role, host or port: keep "
                           "cluster.replicas_per_master and the hosts list as deployed (add shards with "
                           "cluster.masters); for another shape deploy a new topology and migrate the data")


def _as_text(deployed: Mapping[str, object]) -> str:
    return (f"shard {deployed.get('shard')} {deployed.get('role')} on {deployed.get('host')} "
            f"port {deployed.get('port')}")


def renames_changed(layout: Layout, desired: Mapping[str, DesiredNode], facts: Facts) -> bool:
    """Did rename-command lines change for a running node? Then every node must switch names together."""
    return any(facts[n.name].running and facts[n.name].recorded_digest is not None and
               _repeated(desired[n.name].directives) != _repeated(facts[n.name].recorded_directives)
               for n in layout.servers)


def shard_steps(layout: Layout, shard: Shard, desired: Mapping[str, DesiredNode], facts: Facts,
                server: tuple[str, Version], together: bool = False, topology: str = "") -> list[Step]:
    follow = start_master(layout, shard, facts) if topology in ("replication", "sentinel") else None

    def steps_of(node: Node, is_master: bool) -> list[Step]:
        steps = server_steps(node, desired[node.name], facts[node.name], is_master, server)
        return _start_as_replica(layout, node, facts[node.name], follow, steps, topology == "sentinel")

    return rolling(layout, shard, facts, steps_of, fail_over=not together)


def _start_as_replica(layout: Layout, node: Node, f: NodeFacts, follow: str | None, steps: list[Step],
                      sentinel: bool = False) -> list[Step]:
    """A stopped node whose shard has another master gets its file written with `replicaof` that master first
    (the executor adds the line from the live state), unless its file already says so. In a Sentinel topology a
    stopped node the sentinels still name as master starts fenced: they may be promoting a replica right now."""
    if follow is None or not any(isinstance(s, StartNode) for s in steps) or \
            any(isinstance(s, WriteConfig) for s in steps):
        return steps
    on_disk = f.on_disk or {}
    if follow == node.name:
        if not sentinel or on_disk.get(TO_WRITE) == FENCE:
            return steps
        why = "starts fenced (refuses writes) until no Sentinel failover of it is in flight, then takes writes"
        return [WriteConfig(node.name, why, f.recorded_digest or ""), *steps]
    master = layout.node(follow)
    if on_disk.get("replicaof", "").split() == [master.address, str(master.port)]:
        return steps
    why = f"starts as a replica of {follow}, the shard's master now (its file would start it as a master)"
    return [WriteConfig(node.name, why, f.recorded_digest or ""), *steps]


def rolling(layout: Layout, shard: Shard, facts: Facts, steps_of: NodeSteps, fail_over: bool = True) -> list[Step]:
    """One shard: replicas first, then the master; a master that must restart is failed over first
    (unless names change: clients and Sentinel use one name per command, so all nodes switch together)."""
    writer = writer_now(layout, shard, facts)
    ordered = [m for m in shard.members if m != writer] + ([writer] if writer else [])
    steps: list[Step] = []
    for node in map(layout.node, ordered):
        node_steps = steps_of(node, node.name == writer)
        steps += _fail_over_before_restart(node_steps, shard, facts, node.name) if fail_over else \
            [_in_shard(s, shard.index) for s in node_steps]
    return steps


def _in_shard(step: Step, shard: int) -> Step:
    return RestartNode(step.node, step.reason, step.needs_downtime, shard) if isinstance(step, RestartNode) else step


def restart_plan(loaded: LoadedSpec, facts: Facts, selected: set[str], spec_digest: str) -> Plan:
    """`opsctl restart`: the selected nodes, shard by shard, replicas first, masters after a failover."""
    layout = loaded.layout

    def steps_of(node: Node, is_master: bool) -> list[Step]:
        return [RestartNode(node.name, "restart requested", needs_downtime=is_master)] \
            if node.name in selected else []

    steps: list[Step] = []
    for shard in layout.shards:
        steps += rolling(layout, shard, facts, steps_of)
    steps += [RestartNode(n.name, "restart requested") for n in layout.sentinels if n.name in selected]
    if steps and loaded.spec.topology != "standalone":
        steps.append(WaitConverged(layout.nodes[0].name, "wait until every node agrees"))
    return Plan(loaded.spec.name, spec_digest, fingerprint(facts), tuple(steps))


def _fail_over_before_restart(steps: list[Step], shard: Shard, facts: Facts, name: str) -> list[Step]:
    """Insert a failover before a master's restart. Its new file is written after the failover, because the
    failover's CONFIG REWRITE would otherwise write the old live values back into it."""
    live_replicas = [m for m in shard.members if m != name and (r := facts[m].role) and r.kind == "replica"]
    restart = next((s for s in steps if isinstance(s, RestartNode)), None)
    if restart is None or not (restart.needs_downtime and live_replicas):
        return [_in_shard(s, shard.index) for s in steps]
    writes = [s for s in steps if isinstance(s, WriteConfig)]
    others = [s for s in steps if not isinstance(s, (WriteConfig, RestartNode))]
    failover = Failover(name, f"{name} must restart; its writes move to an updated replica first", shard.index)
    return [*others, failover, *writes, RestartNode(name, restart.reason, needs_downtime=False, shard=shard.index)]


def server_steps(node: Node, want: DesiredNode, f: NodeFacts, is_master: bool,
                 server: tuple[str, Version]) -> list[Step]:
    if not f.running:
        steps: list[Step] = []
        stale = file_drift(want, f)
        if f.recorded_digest != want.digest or stale:
            new = f.recorded_digest is None
            why = "new node" if new else _summary(stale) if stale and f.recorded_digest == want.digest else \
                "rendered config changed"
            steps.append(WriteConfig(node.name, why, want.digest))
        reason = "new node" if f.recorded_digest is None else f"process is not running ({f.process_detail or 'died'})"
        return [*steps, StartNode(node.name, reason)]
    return config_steps(node, want, f, is_master, server)


def file_drift(want: DesiredNode, f: NodeFacts) -> list[str]:
    """What the files on the node's disk say against the spec (edits or CONFIG REWRITE behind opsctl's back):
    a restart would bring these back, so the file is written again."""
    found: list[str] = []
    if f.on_disk is not None and not f.on_disk:
        found.append("the config file on disk is missing or empty")
    elif f.on_disk is not None:
        for name, value in single_valued(want.directives).items():
            if not is_config_directive(name):
                continue
            have = f.on_disk.get(canonical(name))
            if have is None or not config_equal(name, value, have):
                found.append(f"the file on disk has {name} {'(missing)' if have is None else repr(have)}, "
                             f"spec says {value}")
    if f.on_disk and DIFFERS in f.on_disk.get("user default", ""):
        found.append("the file on disk lets the default user in with another password than the spec's")
    if f.acl_on_disk is not None and f.acl_on_disk != MASK:
        found.append("users.acl on disk differs from the spec")
    return found


def _summary(found: list[str], shown: int = 3) -> str:
    more = len(found) - shown
    return "; ".join(found[:shown]) + (f"; and {more} more" if more > 0 else "")


def config_steps(node: Node, want: DesiredNode, f: NodeFacts, is_master: bool,
                 server: tuple[str, Version]) -> list[Step]:
    """A running node: write the file if the rendering changed or the file on disk drifted, then CONFIG SET
    or restart per directive."""
    steps: list[Step] = []
    live_changes: list[Step] = []
    restart_for: list[str] = []
    wanted = single_valued(want.directives)
    recorded = single_valued(f.recorded_directives)
    for name, value in wanted.items():
        if name == "user":
            continue  # the default user's passwords during a rotation: the rotation phase sets them live
        live = (f.config or {}).get(name)
        changed_in_spec = f.recorded_digest is not None and recorded.get(name) != value
        drifted = live is not None and not config_equal(name, value, live)
        if not (changed_in_spec or drifted):
            continue
        if name in NOT_CONFIG_DIRECTIVES or name in IMMUTABLE or name in PROTECTED or live is None:
            restart_for.append(name)
        else:
            why = f"spec changed {name}" if changed_in_spec else f"live {name} is {live!r}, spec says {value}"
            live_changes.append(ConfigSet(node.name, why, name, value))
    for step_or_reason in dropped_config_steps(node, wanted, recorded, f, server[0]):
        if isinstance(step_or_reason, str):
            restart_for.append(step_or_reason)
        else:
            live_changes.append(step_or_reason)
    if _repeated(want.directives) != _repeated(f.recorded_directives) and f.recorded_digest is not None:
        restart_for.append("rename-command")
    if f.record.get("pending_restart"):
        restart_for.append("a restart planned by an earlier apply that did not finish")
    if f.server and f.server != server:
        restart_for = [f"server {server_text(*f.server)} -> {server_text(*server)}"]
        live_changes = [c for c in live_changes if not isinstance(c, ConfigSet)]
    stale = file_drift(want, f)
    if f.recorded_digest != want.digest:
        steps.append(WriteConfig(node.name, "rendered config changed" if f.recorded_digest else
                                 "no record of the applied config", want.digest))
    elif stale:
        steps.append(WriteConfig(node.name, _summary(stale), want.digest))
    steps += live_changes
    if f.acl_on_disk is not None and f.acl_on_disk != MASK and not restart_for:
        steps.append(AclLoad(node.name, "users.acl on disk differs from the spec: load the rewritten file"))
    if restart_for:
        why = restart_for[0] if restart_for[0].startswith("server ") else \
            f"{', '.join(sorted(set(restart_for)))} cannot change at runtime"
        steps.append(RestartNode(node.name, why, needs_downtime=is_master))
    return steps


def dropped_config_steps(node: Node, wanted: Mapping[str, str], recorded: Mapping[str, str], f: NodeFacts,
                         flavor: str) -> list[Step | str]:
    """A config the last apply set and the spec no longer has goes back to the server's built-in default:
    CONFIG SET where it can, else the directive's name as a reason to restart (the new file lacks it)."""
    result: list[Step | str] = []
    defaults = SERVER_DEFAULTS.get(flavor, {})
    for name in sorted(set(recorded) - set(wanted)):
        live = (f.config or {}).get(name)
        if not is_config_directive(name) or live is None:
            continue
        default = defaults.get(name)
        if default is not None and config_equal(name, quoted(default), live):
            continue
        if default is None or name in IMMUTABLE or name in PROTECTED or name in NOT_CONFIG_DIRECTIVES:
            result.append(f"{name} (left the spec)")
        else:
            result.append(ConfigSet(node.name, f"{name} left the spec: back to the server default {default!r}",
                                    name, quoted(default)))
    return result


def _repeated(directives: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> list[tuple[str, str]]:
    single = single_valued(list(directives))
    return sorted(d for d in directives if d[0] not in single)


def finish_failover_steps(layout: Layout, facts: Facts) -> list[Step]:
    """Nodes fenced by an interrupted failover (opsctl.plan.fence): finish that failover first."""
    walls = [n.name for n in layout.servers if facts[n.name].fenced]
    return [FinishFailover(walls[0], f"{', '.join(walls)} fenced by an interrupted failover (refuses writes): "
                           "finish it")] if walls else []



def _follows(master: str, moving: Collection[str]) -> str:
    """The master a replicate step names, for its reason. A master this plan fails over first is no longer the
    master when the step runs: the executor points at the master it finds then."""
    if master not in moving:
        return master
    return f"the shard's master when the step runs ({master} now, which this plan fails over first)"


def replication_steps(layout: Layout, facts: Facts, moving: Collection[str] = ()) -> list[Step]:
    shard = layout.shards[0]
    master = shard_master(layout, shard, facts)
    sentinel_view = sentinel_agreed_master(layout, facts) is not None
    target = layout.node(master)
    steps: list[Step] = []
    for name in shard.members:
        if name == master or (sentinel_view and facts[name].recorded_digest is not None):
            continue  # once sentinels agree on a master, roles of known nodes are Sentinel's to set
        if facts[name].fenced:
            continue  # FinishFailover decides its role
        role = facts[name].role
        if role and role.kind == "replica" and role.master == (target.address, target.port):
            continue
        if role and role.kind == "master" and facts[name].keys > 0 and facts[name].running:
            raise RefusedError(f"{name} is a master holding {facts[name].keys} keys, but {master} is the master",
                               "turning it into a replica would delete its data",
                               f"check which node has the data; stop {name} and purge it to re-seed it")
        steps.append(Replicate(name, f"should replicate {_follows(master, moving)}", master))
    return steps



def sentinel_steps(loaded: LoadedSpec, desired: Mapping[str, DesiredNode], facts: Facts) -> list[Step]:
    """Sentinels start from a rendered file once; after that Sentinel owns its file (it rewrites it)."""
    layout = loaded.layout
    master = shard_master(layout, layout.shards[0], facts)
    name = sentinel_master_name(loaded.spec)
    server = (loaded.spec.server.flavor, parse_version(loaded.spec.server.version))
    steps: list[Step] = []
    for node in layout.sentinels:
        f = facts[node.name]
        if not f.running:
            if f.recorded_digest is None:
                steps.append(WriteConfig(node.name, "new sentinel", desired[node.name].digest))
            steps.append(StartNode(node.name, "new sentinel" if f.recorded_digest is None
                                   else f"process is not running ({f.process_detail or 'died'})"))
        elif not f.sentinel_master or f.sentinel_master[0] != name:
            steps.append(SentinelMonitor(node.name, f"does not monitor '{name}'", master))
        elif f.server and f.server != server:
            steps.append(RestartNode(node.name, f"server {server_text(*f.server)} -> {server_text(*server)}"))
    return steps


def _with_sentinel_steps(loaded: LoadedSpec, desired: Mapping[str, DesiredNode], facts: Facts, steps: list[Step],
                         moving: Collection[str]) -> list[Step]:
    """Settings first, then the servers' steps, then the sentinels'. A failover in the plan waits for every
    sentinel to answer CKQUORUM OK (its sentinel-quorum pre-check): then the sentinels to start or to point at the
    master go before the servers' steps (they learn of the failover like the others); restarts stay last."""
    sentinels = sentinel_steps(loaded, desired, facts)
    first = [s for s in sentinels if not isinstance(s, RestartNode)] if moving else []
    return [*sentinel_setting_steps(loaded, desired, facts), *first, *steps, *(s for s in sentinels if s not in first)]


SENTINEL_SETTINGS = ("down-after-milliseconds", "failover-timeout", "parallel-syncs", "auth-pass", "auth-user")


def sentinel_settings(directives: Sequence[tuple[str, str]]) -> dict[str, str]:
    """What SENTINEL SET can change, from a sentinel's rendered directives: quorum, timings, auth-pass (masked),
    renames."""
    settings: dict[str, str] = {}
    for name, value in directives:
        words = value.split()
        if name == "sentinel monitor" and words:
            settings["quorum"] = words[-1]
        elif name.removeprefix("sentinel ") in SENTINEL_SETTINGS and len(words) == 2:
            settings[name.removeprefix("sentinel ")] = unquote(words[1])
        elif name == "sentinel rename-command" and len(words) == 3:
            settings[f"rename-command {words[1]}"] = words[2]
    return settings


def sentinel_setting_steps(loaded: LoadedSpec, desired: Mapping[str, DesiredNode], facts: Facts) -> list[Step]:
    """Spec changes and drift (live settings, auth-pass in the sentinel's file) reach running sentinels
    through SENTINEL SET, before any server restarts."""
    steps: list[Step] = []
    for node in loaded.layout.sentinels:
        f = facts[node.name]
        if not f.running or f.recorded_digest is None:
            continue
        want = sentinel_settings(desired[node.name].directives)
        had = sentinel_settings(f.recorded_directives)
        changed = {k: v for k, v in want.items() if had.get(k) != v}
        changed |= {k: k.split()[1] for k in had if k.startswith("rename-command") and k not in want}
        reasons = [f"spec changed {', '.join(sorted(changed))}"] if changed else []
        drifted = sentinel_drift(want, f.sentinel_config)
        if drifted:
            reasons.append(f"{', '.join(sorted(drifted))} on the sentinel differ from the spec")
        changed |= drifted
        if changed:
            steps.append(SentinelSet(node.name, "; ".join(reasons), tuple(sorted(changed.items()))))
    return steps


def sentinel_drift(want: Mapping[str, str], seen: Mapping[str, str] | None) -> dict[str, str]:
    """Settings whose observed value is not the spec's (auth-pass is observed as a verdict)."""
    if seen is None:
        return {}
    return {k: v for k, v in want.items() if k in seen or k == "auth-pass"
            if seen.get(k) != v and not (k == "auth-pass" and seen.get(k) == MASK)}


def cluster_steps(layout: Layout, facts: Facts, moving: Collection[str] = (),
                  filling: Collection[int] = ()) -> list[Step]:
    members = [n.name for n in layout.servers]
    if all(_unclustered(facts[m]) for m in members):
        first = layout.shards[0].master
        return [FormCluster(first, "no node belongs to a cluster yet", tuple(members))]
    via = next((m for m in members if not _unclustered(facts[m])), members[0])
    steps: list[Step] = []
    rejoining = {m for m in members if _rejoins(layout.node(m), facts)}
    for m in members:
        if m in rejoining:
            continue
        if _restarting(facts[m]):
            steps.append(JoinCluster(m, "no node serving slots knows it (a scale-in removed it, or a creation "
                                        "stopped before it met the cluster): it joins as a new node, reset first "
                                        "if it comes back with an identity the cluster forgot", via))
        elif _unclustered(facts[m]) or not _knows_cluster(facts[m], facts[via]):
            steps.append(JoinCluster(m, "not part of the cluster", via))
    for shard in layout.shards:
        master = current_master(shard, layout, facts)
        master_me = facts[master].myself
        master_id = master_me.id if master_me else None
        for name in shard.members:
            me = facts[name].myself
            linked = me is not None and master_id is not None and me.master_id == master_id
            if name == master or linked or has_slots(facts[name]) or name in rejoining:
                continue
            steps.append(Replicate(name, f"should replicate {_follows(master, moving)} (shard {shard.index})",
                                   master))
    masters = [current_master(shard, layout, facts) for shard in layout.shards]
    return steps + slot_steps(layout, facts, masters, filling)


def _restarting(f: NodeFacts) -> bool:
    """A known node whose process is down: it comes back with its nodes.conf, so it rejoins by itself."""
    return not f.running and f.recorded_digest is not None


def _rejoins(node: Node, facts: Facts) -> bool:
    """A cluster node that is down but that the running nodes still know: its nodes.conf brings it back by itself.
    One they do not know (a scale-in removed and forgot it) joins again as a new node. Asked are the running
    nodes that serve slots (a removed node serves none, its old view does not count); with none to ask, every
    node that is down is taken to come back by itself."""
    if not _restarting(facts[node.name]):
        return False
    known = cluster_endpoints(facts)
    return known is None or node.endpoint in known


def _unclustered(f: NodeFacts) -> bool:
    """A node that is new or alone: not running yet, or knows only itself and has no slots."""
    if not f.running or f.cluster_nodes is None:
        return True
    return len(f.cluster_nodes) <= 1 and not has_slots(f)


def _knows_cluster(f: NodeFacts, via: NodeFacts) -> bool:
    """f and via know each other (a node that knows the cluster from an old nodes.conf is not known back)."""
    me, mine = via.myself, f.myself
    return me is None or (any(n.id == me.id for n in f.cluster_nodes or ())
                          and (mine is None or any(n.id == mine.id for n in via.cluster_nodes or ())))
