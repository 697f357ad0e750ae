"""One server's steps from its facts: write its files when the rendering or the file on disk differs from the
spec, start it when it is down, then CONFIG SET or restart per changed directive. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from opsctl.base.secrets import MASK
from opsctl.observe.replies import IMMUTABLE, PROTECTED, config_equal, is_config_directive
from opsctl.plan.desired import DIFFERS, NOT_CONFIG_DIRECTIVES, PREVIOUS, DesiredNode, canonical, single_valued
from opsctl.plan.facts import Facts, NodeFacts, is_fence
from opsctl.plan.steps import UNSET, AclLoad, Change, ConfigSet, RestartNode, StartNode, Step, WriteConfig
from opsctl.render.directives import SECRET_DIRECTIVES
from opsctl.render.tokens import quoted
from opsctl.server.defaults import SERVER_DEFAULTS
from opsctl.server.versions import Version, server_text
from opsctl.spec.layout import Layout, Node


def server_steps(node: Node, want: DesiredNode, f: NodeFacts, is_master: bool,
                 server: tuple[str, Version]) -> list[Step]:
    if not f.running:
        steps: list[Step] = []
        stale = file_drift(want, f)
        if f.recorded_digest != want.digest or stale:
            new = f.recorded_digest is None
            why = "new node" if new else _summary(stale) if stale and f.recorded_digest == want.digest else \
                "rendered config changed"
            steps.append(WriteConfig(node.name, why, want.digest, config_changes(want, f)))
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
            if is_fence(name, have):
                continue  # an interrupted failover's, lifted by finishing it
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
    wanted = single_valued(want.directives)
    recorded = single_valued(f.recorded_directives)
    live_changes, restart_for = _directive_changes(node, want, f, wanted, recorded)
    for step_or_reason in dropped_config_steps(node, wanted, recorded, f, server[0]):
        if isinstance(step_or_reason, str):
            restart_for.append(step_or_reason)
        else:
            live_changes.append(step_or_reason)
    if _repeated(want.directives) != _repeated(f.recorded_directives) and f.recorded_digest is not None:
        restart_for.append("rename-command")
    if f.record.pending_restart:
        restart_for.append("a restart planned by an earlier apply that did not finish")
    if f.server and f.server != server:
        restart_for = [f"server {server_text(*f.server)} -> {server_text(*server)}"]
        live_changes = [c for c in live_changes if not isinstance(c, ConfigSet)]
    stale = file_drift(want, f)
    if f.recorded_digest != want.digest:
        changes = config_changes(want, f)
        steps.append(WriteConfig(node.name, write_reason(want, f, changes) if f.recorded_digest else
                                 "no record of the applied config", want.digest, changes))
    elif stale:
        steps.append(WriteConfig(node.name, _summary(stale), want.digest, config_changes(want, f)))
    steps += live_changes
    if f.acl_on_disk is not None and f.acl_on_disk != MASK and not restart_for:
        steps.append(AclLoad(node.name, "users.acl on disk differs from the spec: load the rewritten file"))
    if restart_for:
        why = restart_for[0] if restart_for[0].startswith("server ") else \
            f"{', '.join(sorted(set(restart_for)))} cannot change at runtime"
        steps.append(RestartNode(node.name, why, needs_downtime=is_master))
    return steps


def _directive_changes(node: Node, want: DesiredNode, f: NodeFacts, wanted: dict[str, str],
                       recorded: dict[str, str]) -> tuple[list[Step], list[str]]:
    """Per directive the spec changed or the live config drifted from: a CONFIG SET, or (a directive that cannot
    change at runtime) a reason to restart."""
    live_changes: list[Step] = []
    restart_for: list[str] = []
    for name, value in wanted.items():
        if name == "user":
            continue  # the default user's passwords during a rotation: the rotation phase sets them live
        live = (f.config or {}).get(name)
        if is_fence(name, live):
            continue  # FinishFailover lifts it to the spec's value once the failover is decided
        changed_in_spec = f.recorded_digest is not None and recorded.get(name) != value
        drifted = live is not None and not config_equal(name, value, live)
        if not (changed_in_spec or drifted):
            continue
        if name in NOT_CONFIG_DIRECTIVES or name in IMMUTABLE or name in PROTECTED or live is None:
            restart_for.append(name)
        else:
            why = spec_change(want, name, recorded.get(name), value) if changed_in_spec else \
                f"live {name} is {live!r}, spec says {value}"
            live_changes.append(ConfigSet(node.name, why, name, value, shown(name, live)))
    return live_changes, restart_for


def write_reason(want: DesiredNode, f: NodeFacts, changes: tuple[Change, ...]) -> str:
    """Why the rendering changed: the spec field behind derived settings (their before -> after lines follow);
    with no single setting changed (no lines follow), what did: repeated lines, or a file beside the config."""
    if not changes:
        if _repeated(want.directives) != _repeated(f.recorded_directives):
            return "rendered config changed: its rename-command lines (no single setting changes)"
        return "rendered files changed beside the single settings (users.acl, user lines, comments)"
    causes = dict(want.causes)
    derived = sorted({causes[name] for name, _, _ in changes if name in causes})
    if derived and all(name in causes for name, _, _ in changes):
        return f"{'; '.join(derived)} derives {', '.join(name for name, _, _ in changes)}"
    return "rendered config changed"


def spec_change(want: DesiredNode, name: str, before: str | None, after: str) -> str:
    """Why a setting changes with the spec: the field that derives it when opsctl derives it (the user edited
    cluster.replicas_per_master, not repl-diskless-sync-delay), else the setting itself; before -> after, a secret's
    masked."""
    was, now = shown(name, before) if before is not None else UNSET, shown(name, after)
    values = f" {was} -> {now}" if was != now else ""  # two masked values read the same: none shown
    cause = dict(want.causes).get(name)
    return f"{cause} derives {name}{values}" if cause else f"spec changed {name}{values}"


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
                                    name, quoted(default), shown(name, live)))
    return result


def config_changes(want: DesiredNode, f: NodeFacts) -> tuple[Change, ...]:
    """Each single-valued setting the write changes, before -> after: against the last applied rendering, then
    what the file on disk says where it drifted from the spec. None for a node without a record (all new)."""
    if f.recorded_digest is None:
        return ()
    wanted = {k: v for k, v in single_valued(want.directives).items() if k != "user"}  # users: rotation's words
    recorded = {k: v for k, v in single_valued(f.recorded_directives).items() if k != "user"}
    changes = {name: (recorded.get(name, UNSET), wanted.get(name, UNSET))
               for name in [*wanted, *sorted(set(recorded) - set(wanted))]
               if recorded.get(name) != wanted.get(name)}
    for name, value in wanted.items():
        have = (f.on_disk or {}).get(canonical(name))
        if name in changes or f.on_disk is None or not is_config_directive(name) or is_fence(name, have):
            continue
        if have is None or not config_equal(name, value, have):
            changes[name] = (UNSET if have is None else have, value)
    listed = ((name, shown(name, before), shown(name, after)) for name, (before, after) in changes.items())
    return tuple(change for change in listed if change[1] != change[2])  # two masked values read the same


VERDICTS = frozenset({MASK, DIFFERS, PREVIOUS, UNSET})


def shown(name: str, value: str | None) -> str:
    """A setting's value as a plan may print it: a secret directive's only as a verdict or the mask; an empty
    value as "" (so it reads as a value, not as a missing one)."""
    if value is None:
        return ""
    if name in SECRET_DIRECTIVES and value not in VERDICTS:
        return MASK
    return value if value else '""'


def _repeated(directives: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The repeated lines a change of needs a restart (rename-command): `user` lines are not among them, the
    rotation phase and the start-exporter step set those users live."""
    single = single_valued(list(directives))
    return sorted(d for d in directives if d[0] not in single and d[0] != "user")




def renames_changed(layout: Layout, desired: Mapping[str, DesiredNode], facts: Facts) -> bool:
    """Did rename-command lines change for a running node? Then every node must switch names together."""
    return any(facts[n.name].running and facts[n.name].recorded_digest is not None and
               _repeated(desired[n.name].directives) != _repeated(facts[n.name].recorded_directives)
               for n in layout.servers)



def restarting(f: NodeFacts) -> bool:
    """A known node whose process is down: it starts again from its files (a cluster node with its nodes.conf,
    so it rejoins by itself)."""
    return not f.running and f.recorded_digest is not None
