"""TLS on live nodes: certificate rotation without restarts (what the TLS audit asks each node is
opsctl.tls.handshake). I/O shell.

A server reloads its files on `CONFIG SET tls-cert-file ... tls-key-file ... tls-ca-cert-file ...` with the same
paths, keeping its pid and every open connection; sentinels restart one at a time (Redis 7.0's has no CONFIG).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Literal

from opsctl.base.errors import NodeError, OpsctlError, RefusedError
from opsctl.base.events import Emit, Note
from opsctl.base.poll import Pending, wait_for
from opsctl.metrics.exporter_steps import exporters_follow_tls
from opsctl.net.connection import connection_to, said
from opsctl.net.connector import Connector
from opsctl.net.topolock import check_held
from opsctl.plan.desired import unquote
from opsctl.render.directives import tls
from opsctl.runtime.opening import Runtime, make_connector
from opsctl.spec.deployed import running_nodes
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.tls.certs import facts
from opsctl.tls.handshake import handshake
from opsctl.tls.material import Generated, node_files

Mode = Literal["certs", "new-ca", "drop-old-ca"]
RELOADED = ("tls-cert-file", "tls-key-file", "tls-ca-cert-file")


def rotate(rt: Runtime, mode: Mode, emit: Emit) -> list[str]:
    """New files on every node deployed (made here for tls.generate, else read again from the spec's paths), then
    each server reloads them live; returns one line per node."""
    if not rt.loaded.spec.tls.enabled:
        raise OpsctlError("the spec has no TLS to rotate", hint="set tls.enabled: true and apply first")
    loaded = deployed_only(rt)
    _renew_files(rt, loaded, mode)
    for node in loaded.layout.nodes:
        rt.provider.write_files(node, node_files(loaded, rt.state_dir, node))
    rt.provider.flush()
    connector = make_connector(loaded, rt.state_dir, rt.connector.route)  # opsctl's own new files
    lines = []
    for node in [*loaded.layout.servers, *loaded.layout.sentinels]:
        check_held(rt.connector)  # a run that lost its topology lock touches no further node
        lines.append(_restart_sentinel(rt, connector, node) if node.is_sentinel else _reload(rt, connector, node))
        emit(Note(lines[-1]))
    exporters_follow_tls(rt)
    return lines


def deployed_only(rt: Runtime) -> LoadedSpec:
    """rt.loaded with the nodes that run now as its layout's nodes (spec.deployed.running_nodes: the ones the next
    apply adds left out, their files made by that apply; drained ones still running kept, at their recorded
    address); a retired node whose process is gone (its host lost) is left out: it has nothing to reload."""
    layout = rt.loaded.layout
    retired = {n.name for n in layout.retired}
    nodes = tuple(n for n in running_nodes(layout, rt.provider.deployed_records())
                  if n.name not in retired or rt.provider.process_state(n).running)
    return dataclasses.replace(rt.loaded, layout=dataclasses.replace(layout, nodes=nodes))


def _renew_files(rt: Runtime, loaded: LoadedSpec, mode: Mode) -> None:
    if not loaded.spec.tls.generate:
        if mode != "certs":
            raise RefusedError("CA rotation with given files goes through the files themselves",
                               "opsctl made no CA for this spec (tls.generate is off)",
                               "put both CAs in tls.ca's file and run `opsctl tls rotate`; then new certificates; "
                               "then the new CA alone, each followed by `opsctl tls rotate`")
        return
    store = Generated(loaded, rt.state_dir)
    store.ensure()
    if mode == "new-ca":
        store.add_ca()
    elif mode == "drop-old-ca":
        _refuse_old_certificates(loaded, store)
        store.drop_old_cas()
    else:
        store.reissue()


def _refuse_old_certificates(loaded: LoadedSpec, store: Generated) -> None:
    signing = facts(store.ca_cert())[0].subject
    old = [n.name for n in loaded.layout.nodes if store.issuer(n) != signing]
    if old:
        raise RefusedError(f"{len(old)} node certificate(s) still come from an older CA: {', '.join(old[:5])}",
                           "dropping that CA from the bundle would break them",
                           "run `opsctl tls rotate -f SPEC` first (new certificates from the newest CA)")


def _reload(rt: Runtime, connector: Connector, node: Node) -> str:
    files = dict(tls(rt.loaded.spec, rt.provider.paths(node)))
    args = [word for name in RELOADED for word in (name, unquote(files[name]))]
    try:
        with connection_to(connector, node) as handle:  # the connector of the new files, not the run's
            handle.call("CONFIG", "SET", *args)
    except NodeError as exc:
        raise OpsctlError(f"{node.name} did not reload its TLS files", said(exc),
                          f"its log says why ({rt.provider.paths(node).log}); the old files stay in use") from None
    return f"{node.name}: reloaded, presents {_presented(connector, node)}"


def _presented(connector: Connector, node: Node) -> str:
    cert, protocol = handshake(connector, node)
    return f"{cert.fingerprint} ({protocol}, {cert.days_left(datetime.datetime.now(datetime.timezone.utc)):.0f} days)"


def _restart_sentinel(rt: Runtime, connector: Connector, node: Node, timeout: float = 30.0) -> str:
    rt.provider.stop(node)
    rt.provider.start(node)

    def answers() -> bool | Pending:
        try:
            with connection_to(connector, node, timeout=2.0) as handle:
                handle.call("PING")
        except NodeError as exc:
            return Pending(said(exc))
        return True

    wait_for(answers, timeout, f"{node.name} to answer", 0.05,
             on_timeout=lambda why: OpsctlError(f"{node.name} does not answer after its restart", why))
    return f"{node.name}: restarted (Sentinel cannot reload TLS files), presents {_presented(connector, node)}"


