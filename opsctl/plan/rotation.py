"""Password rotation, planned first: every node accepts the spec's password (and, during the overlap, the previous one)
before anything uses the new one (masterauth, Sentinel auth-pass). Pure.

The overlap lasts while auth.previous_password (or users[].previous_password) is set; a later apply without it drops
the old password. How ACL mode, password mode and sentinels keep both: docs/rotation.md."""

from __future__ import annotations

from collections.abc import Mapping

from opsctl.base.secrets import MASK, Secret
from opsctl.plan.desired import DIFFERS, PREVIOUS, DesiredNode
from opsctl.plan.facts import NodeFacts
from opsctl.plan.steps import AclLoad, ConfigSet, Failover, RestartNode, SetPasswords, Step, WriteConfig
from opsctl.render.exporteruser import EXPORTER_USER, exporter_secrets
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec

WORDS = {MASK: "the spec's password", PREVIOUS: "the previous password", DIFFERS: "another password"}


def managed_users(loaded: LoadedSpec, node: Node) -> dict[str, tuple[Secret, Secret | None]]:
    """The users whose passwords opsctl sets on a node: user -> (spec's secret, previous secret or None); the
    exporter's user too when metrics.exporter is on (its passwords follow the admin's)."""
    credentials = loaded.credentials
    exporter = _exporter_user(loaded)
    if node.is_sentinel or loaded.spec.auth.mode == "password":
        return {"default": (credentials.password, credentials.previous), **exporter}
    previous = dict(credentials.users_previous)
    return {loaded.spec.auth.admin_user: (credentials.password, credentials.previous),
            **{name: (secret, previous.get(name)) for name, secret in credentials.users}, **exporter}


def _exporter_user(loaded: LoadedSpec) -> dict[str, tuple[Secret, Secret | None]]:
    if not loaded.spec.metrics.exporter:
        return {}
    secrets = exporter_secrets(loaded)
    return {EXPORTER_USER: (secrets[0], secrets[1] if len(secrets) > 1 else None)}


def wanted_accepts(loaded: LoadedSpec, node: Node) -> dict[str, tuple[str, ...]]:
    """Per managed user, the verdicts of the passwords it should accept: the spec's, plus the previous one."""
    return {user: tuple(sorted({MASK} | ({PREVIOUS} if previous and previous.reveal() and previous != secret
                                         else set())))
            for user, (secret, previous) in managed_users(loaded, node).items()}


def _describe(verdicts: tuple[str, ...]) -> str:
    return " and ".join(WORDS.get(v, v) for v in verdicts) or "no password"


def _mismatch(loaded: LoadedSpec, node: Node, f: NodeFacts) -> str | None:
    if f.accepts is None:
        return None
    for user, want in wanted_accepts(loaded, node).items():
        have = f.accepts.get(user, ())
        if user == EXPORTER_USER and not have:
            continue  # no such user yet: its start-exporter step creates it
        if have != want:
            return f"user {user} accepts {_describe(have)}, the spec wants {_describe(want)}"
    return None


def rotation_steps(loaded: LoadedSpec, desired: Mapping[str, DesiredNode], facts: Mapping[str, NodeFacts]) \
        -> list[Step]:
    steps: list[Step] = []
    for node in loaded.layout.nodes:
        f = facts.get(node.name)
        if f is None or not f.running or not f.reachable:
            continue
        why = _mismatch(loaded, node, f)
        if node.is_sentinel:
            own = (f.sentinel_config or {}).get("sentinel-pass", MASK)
            if own != MASK:
                why = why or f"sentinel-pass is {WORDS.get(own, own)}"
            if why:
                steps.append(SetPasswords(node.name, why))
        elif loaded.spec.auth.mode == "password":
            live = (f.config or {}).get("requirepass", MASK)
            if live != MASK:  # even when ACL GETUSER did not answer: CONFIG SET alone would drop the overlap
                why = why or f"requirepass is {WORDS.get(live, live)}"
            if why:
                steps.append(SetPasswords(node.name, why))
        elif why or (f.acl_on_disk is not None and f.acl_on_disk != MASK):
            why = why or "users.acl on disk differs from the spec"
            steps += [WriteConfig(node.name, why, desired[node.name].digest), AclLoad(node.name, why)]
    return steps


def after_rotation(first: list[Step], rest: list[Step]) -> list[Step]:
    """The rest of a plan without what the rotation phase already did (requirepass, ACL LOAD, the file; the
    file is written again only where a failover's CONFIG REWRITE or a restart follows)."""
    rotated = {(type(s), s.node) for s in first}
    restarting = {s.node for s in rest if isinstance(s, (RestartNode, Failover))}
    return [s for s in rest if not (
        ((type(s), s.node) in rotated and not (isinstance(s, WriteConfig) and s.node in restarting)) or
        (isinstance(s, ConfigSet) and s.directive == "requirepass" and (SetPasswords, s.node) in rotated))]
