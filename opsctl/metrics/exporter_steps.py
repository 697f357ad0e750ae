"""The exporter steps (metrics.exporter): set the exporter's ACL user on its node, then (re)start or stop the
redis_exporter beside it through the provider; and the exporter facts drift compares. The local and Ansible
providers run exporters: another provider with metrics.exporter on is refused before anything is planned."""

from __future__ import annotations

from opsctl.base.errors import OpsctlError
from opsctl.base.secrets import remember
from opsctl.metrics.exporter import exporter_run
from opsctl.plan.desired import desired_node
from opsctl.plan.steps import StartExporter, StopExporter
from opsctl.providers.local import LocalProvider
from opsctl.render.exporteruser import EXPORTER_USER, exporter_acl_words
from opsctl.runtime.drift import Exporters, exporters_of
from opsctl.runtime.execution import Execution
from opsctl.runtime.opening import Runtime
from opsctl.spec.layout import Node


def start_exporter(run: Execution, step: StartExporter) -> None:
    """The exporter's ACL user set live (ACL SETUSER: the rendered users.acl or `user` line keeps it across a
    restart), then the exporter (re)started with the settings the step was planned for."""
    rt = run.rt
    node = run.node(step)
    exporters = exporters_of(rt)
    if exporters is None:
        return
    exporter = exporter_run(rt.loaded, desired_node(rt.loaded, node, rt.provider.paths(node), rt.provider.daemonize))
    remember(exporter.password)
    if exporter.digest != step.digest:
        raise OpsctlError(f"the exporter settings of {node.name} changed since the plan was made",
                          hint="run `opsctl plan` again")
    set_exporter_user(rt, node)
    exporters.start(node, exporter)


def set_exporter_user(rt: Runtime, node: Node) -> None:
    """The user set live; a Sentinel then writes it into its own file (FLUSHCONFIG), which it owns after its
    first start, so a restart keeps it."""
    words = exporter_acl_words(rt.loaded, reveal=True, sentinel=node.is_sentinel)
    if words is None:
        return
    handle = rt.connections[node.name]
    handle.call("ACL", "SETUSER", EXPORTER_USER, "reset", *words)
    if node.is_sentinel:
        handle.call("SENTINEL", "FLUSHCONFIG")


def stop_exporter(run: Execution, step: StopExporter) -> None:
    exporters = exporters_of(run.rt)
    if exporters is not None:
        exporters.remove(run.node(step))


def remove_exporter(rt: Runtime, node: Node) -> None:
    """destroy, and a node leaving the fleet (retired or parked): the node's exporter stopped and its password file
    gone, whatever metrics.exporter says now."""
    exporters = _running_exporters(rt)
    if exporters is not None:
        exporters.remove(node)


def exporter_runs(rt: Runtime, node: Node) -> bool:
    """Whether a redis_exporter runs beside node, whatever metrics.exporter says now (destroy stops it, the node's
    server running or not: it would hold its port and call the node down)."""
    exporters = _running_exporters(rt)
    return exporters is not None and exporters.state(node) is not None


def _running_exporters(rt: Runtime) -> Exporters | None:
    """The exporters of a provider that runs them (local, ansible); None for another provider."""
    known = isinstance(rt.provider, LocalProvider) or rt.loaded.spec.provider == "ansible"
    return exporters_of(rt) if known else None


def exporters_follow_tls(rt: Runtime) -> None:
    """After `tls rotate` changed the nodes' TLS files: exporters that hold copies of them get the new ones."""
    exporters = exporters_of(rt)
    if exporters is not None and rt.loaded.spec.metrics.exporter:
        exporters.renew_tls()
