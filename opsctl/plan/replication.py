"""The steps of a replication or Sentinel topology past each server's own: finish an interrupted failover, point
replicas at the shard's master, start and point the sentinels and change their settings live. Pure."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from opsctl.base.errors import RefusedError
from opsctl.base.secrets import MASK
from opsctl.plan.desired import DesiredNode, unquote
from opsctl.plan.facts import Facts
from opsctl.plan.masters import sentinel_agreed_master, shard_master
from opsctl.plan.steps import (
    UNSET,
    FinishFailover,
    Replicate,
    RestartNode,
    SentinelMonitor,
    SentinelSet,
    StartNode,
    Step,
    WriteConfig,
)
from opsctl.server.versions import parse_version, server_text
from opsctl.spec.layout import Layout, endpoint, sentinel_master_name, sentinel_quorum
from opsctl.spec.load import LoadedSpec


def finish_failover_steps(layout: Layout, facts: Facts) -> list[Step]:
    """Nodes fenced by an interrupted failover (opsctl.plan.facts): finish that failover first."""
    walls = [n.name for n in layout.servers if facts[n.name].fenced]
    return [FinishFailover(walls[0], f"{', '.join(walls)} fenced by an interrupted failover (refuses writes): "
                           "finish it")] if walls else []




def follows(master: str, moving: Collection[str]) -> str:
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
        steps.append(Replicate(name, f"should replicate {follows(master, moving)}", master))
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
        elif (stale := stale_view(layout, facts, node.name, master, sentinel_quorum(loaded.spec))) is not None:
            steps.append(SentinelMonitor(node.name, stale, master))
        elif f.server and f.server != server:
            steps.append(RestartNode(node.name, f"server {server_text(*f.server)} -> {server_text(*server)}"))
    return steps


def stale_view(layout: Layout, facts: Facts, sentinel: str, master: str, quorum: int) -> str | None:
    """Why a sentinel must monitor the master afresh, or None: it names a node that is not a master while at least
    quorum other sentinels name the master, at a configuration epoch no older than its own. Sentinel takes another
    sentinel's configuration only at a newer epoch, so it keeps such a view for good (seen when the promoted replica
    of a failover died: the leader got the others' newer epoch while its own failover still named the old master,
    then ended that failover on the dead replica). Monitoring afresh is what the others' hellos would have done.
    Never while it runs a failover (its entry names the old master until that ends)."""
    f, lead = facts[sentinel], layout.node(master)
    named, entry, where = f.sentinel_master, f.sentinel_entry, (lead.address, lead.port)
    if named is None or entry is None or entry.failing_over or named[1:] == where:
        return None
    if (role := facts[master].role) is None or role.kind != "master":
        return None
    seen = layout.find(f"{named[1]}:{named[2]}")
    if seen is not None and seen.name in facts and (other := facts[seen.name].role) and other.kind == "master":
        return None  # two masters: not a stale view (the server steps refuse or settle that)
    agreeing = [n.name for n in layout.sentinels if n.name != sentinel
                if (g := facts[n.name]).sentinel_master is not None and g.sentinel_master[1:] == where
                and g.sentinel_entry is not None and g.sentinel_entry.config_epoch >= entry.config_epoch]
    if len(agreeing) < quorum:
        return None
    return (f"names {seen.name if seen else endpoint(*named[1:])} as master, which is not one, while "
            f"{', '.join(agreeing)} name {master} (config epoch {entry.config_epoch} or newer): a sentinel takes "
            "the others' configuration only at a newer epoch, so it is monitored afresh")


def with_sentinel_steps(loaded: LoadedSpec, desired: Mapping[str, DesiredNode], facts: Facts, steps: list[Step],
                         moving: Collection[str]) -> list[Step]:
    """Settings first (a raised quorum last), then the servers' steps, then the sentinels'. A failover in the plan
    waits for every sentinel to answer CKQUORUM OK (its sentinel-quorum pre-check): then the sentinels to start or
    to point at the master go before the servers' steps (they learn of the failover like the others);
    restarts stay last."""
    sentinels = sentinel_steps(loaded, desired, facts)
    first = [s for s in sentinels if not isinstance(s, RestartNode)] if moving else []
    settings = sentinel_setting_steps(loaded, desired, facts)
    raising = [s for s in settings if raises_quorum(s, facts)]  # after the new sentinels start
    return [*(s for s in settings if s not in raising), *first, *steps, *(s for s in sentinels if s not in first),
            *raising]


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


def spec_changes(want: DesiredNode, changed: Mapping[str, str], had: Mapping[str, str]) -> list[str]:
    """Why sentinel settings change with the spec: a derived one by the field that derives it (the quorum by the
    sentinels' number), the others by name."""
    causes = dict(want.causes)
    derived = [f"{causes[k]} derives {k} {had.get(k, UNSET)} -> {v}" for k, v in sorted(changed.items()) if k in causes]
    named = sorted(k for k in changed if k not in causes)
    return derived + ([f"spec changed {', '.join(named)}"] if named else [])


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
        reasons = spec_changes(desired[node.name], changed, had)
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


def raises_quorum(step: Step, facts: Facts) -> bool:
    """A SENTINEL SET that raises the quorum: it waits for the new sentinels to start, so the quorum never exceeds
    the sentinels running."""
    if not isinstance(step, SentinelSet) or step.node not in facts:
        return False
    want = dict(step.settings).get("quorum")
    had = sentinel_settings(facts[step.node].recorded_directives).get("quorum")
    return want is not None and had is not None and want.isdigit() and had.isdigit() and int(want) > int(had)
