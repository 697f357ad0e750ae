"""A standby's primary, from its spec's `follows:`: another spec (a topology opsctl runs) or endpoints (one it does
not, reached as `migrate --from-endpoints` reaches it). Refused by name before anything connects: a primary that
is the standby itself, or that follows this standby back (a cycle)."""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass

from opsctl.base.errors import OpsctlError
from opsctl.migrate.foreign import ForeignSource, check_source, foreign_connector
from opsctl.net.connector import Connector
from opsctl.spec.layout import split_endpoint
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import Follows
from opsctl.state.specfile import read_spec

HINT = "follows: names the primary, another topology: its spec (follows: {spec: PATH}) or its servers' endpoints"


@dataclass(frozen=True)
class Primary:
    """What follows: names, resolved: the primary's spec (follows.spec) or its servers (follows.endpoints)."""

    shown: str  # how messages name it
    loaded: LoadedSpec | None = None
    foreign: ForeignSource | None = None

    def ref(self) -> dict[str, str]:
        """The options that reach it again, as the migrate journal keeps them (no secret)."""
        if self.loaded is not None:
            return {"from_spec": os.path.abspath(self.loaded.file)}
        assert self.foreign is not None
        return self.foreign.ref()


def _beside(loaded: LoadedSpec, path: str) -> str:
    """A path of the spec, relative ones from the spec's folder."""
    return os.path.join(os.path.dirname(os.path.abspath(loaded.file)), path)


def _follows(loaded: LoadedSpec) -> Follows:
    follows = loaded.spec.follows
    if follows is None:
        raise OpsctlError(f"'{loaded.spec.name}' is no standby: its spec has no follows:",
                          hint="add follows: {spec: PRIMARY_SPEC} (docs/standby.md)")
    return follows


def primary_of(loaded: LoadedSpec) -> Primary:
    """The primary, checked: not this topology, not a standby of this one."""
    follows = _follows(loaded)
    if follows.spec is not None:
        path = _beside(loaded, follows.spec)
        if os.path.abspath(path) == os.path.abspath(loaded.file):
            raise OpsctlError(f"'{loaded.spec.name}' follows itself (follows.spec: {follows.spec})", hint=HINT)
        primary = read_spec(path)
        _refuse_same(loaded, primary)
        return Primary(f"'{primary.spec.name}'", loaded=primary)
    endpoints = [e for e in (split_endpoint(t) for t in follows.endpoints or []) if e is not None]
    ours = {(n.address, n.port) for n in loaded.layout.servers}
    if ours & set(endpoints):
        raise OpsctlError(f"'{loaded.spec.name}' follows itself: follows.endpoints names its own servers",
                          hint=HINT)
    password = follows.password
    assert password is not None  # Follows.check: endpoints need one
    tls = follows.tls
    ca, cert, key = (tls.ca, tls.cert, tls.key) if tls else (None, None, None)
    foreign = ForeignSource(tuple(endpoints), password.file and _beside(loaded, password.file), password.env,
                            follows.user, *(_beside(loaded, ref.file) if ref else None for ref in (ca, cert, key)))
    check_source(foreign)
    return Primary(", ".join(follows.endpoints or []), foreign=foreign)


def _refuse_same(loaded: LoadedSpec, primary: LoadedSpec) -> None:
    """The primary's spec names this topology's servers, or follows this spec back."""
    name = loaded.spec.name
    if {n.endpoint for n in loaded.layout.servers} & {n.endpoint for n in primary.layout.servers}:
        raise OpsctlError(f"'{name}' follows '{primary.spec.name}', whose servers are its own", hint=HINT)
    back = primary.spec.follows
    if back is None:
        return
    if back.spec is not None and os.path.abspath(_beside(primary, back.spec)) == os.path.abspath(loaded.file):
        cycle = True
    else:
        theirs = {e for e in (split_endpoint(t) for t in back.endpoints or []) if e is not None}
        cycle = bool(theirs & {(n.address, n.port) for n in loaded.layout.servers})
    if cycle:
        raise OpsctlError(f"'{name}' follows '{primary.spec.name}', which follows '{name}' back: a cycle",
                          "a standby's primary must take writes; two standbys of each other have none",
                          f"remove follows: from one of them (the one that takes writes: '{primary.spec.name}' "
                          "after a switchover)")


def primary_connector(primary: Primary, stack: ExitStack, force_lock: bool = False) -> Connector:
    """The connector to the primary, entered on stack: a spec's topology lock held (no opsctl run reshards it while
    it is followed); a store given by endpoints has none."""
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for

    if primary.foreign is not None:
        return foreign_connector(primary.foreign)
    assert primary.loaded is not None
    connector = stack.enter_context(open_connector(primary.loaded, state_dir_for(primary.loaded, None)))
    stack.enter_context(topology_lock(connector, force=force_lock))
    return connector



def primary_silent(primary: Primary) -> str | None:
    """None when a server of the primary answers now; else why none does (a split, its site down)."""
    from opsctl.net.discover import discover
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for

    try:
        if primary.foreign is not None:
            live = discover(foreign_connector(primary.foreign))
        else:
            assert primary.loaded is not None
            with open_connector(primary.loaded, state_dir_for(primary.loaded, None)) as connector:
                live = discover(connector)
    except (OpsctlError, OSError) as exc:
        return exc.summary if isinstance(exc, OpsctlError) else str(exc)
    if any(node.role != "down" for node in live):
        return None
    return "; ".join(f"{node.node.name}: {node.error}" for node in live) or "no server"
