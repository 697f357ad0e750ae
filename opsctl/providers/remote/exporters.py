"""The redis_exporters of provider: ansible (pure): what playbooks/exporters.yml gets per host, the settings
bin/opsctl-node runs an exporter with, and the command that removes one. docs/monitoring.md, "provider: ansible".

An exporter runs as its own system user (EXPORTER_OS_USER), which cannot enter the nodes' folders: its folder is
plan.exporters.exporter_home (`<spec folder>.exporters/<node>`, 0700, the exporter user's), holding its 0600 password
file and, with TLS, its 0600 copies of the node's CA, certificate and key. bin/opsctl-node starts and stops it under
the name `<node>-exporter` (nodes/<node>-exporter.env, root's), the one way nodes are run (a unit where systemd runs).
No secret in anything here: the inventory lists file names, the files travel as 0600 files through no_log copies."""

from __future__ import annotations

import shlex
from typing import Any

from opsctl.plan.exporters import EXPORTER_BINARY, EXPORTER_PACKAGE, PASSWORD_FILE, ExporterRun, exporter_home
from opsctl.providers.remote.inventory import remote_paths, remote_root
from opsctl.render.directives import TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE
from opsctl.spec.layout import Node, exporter_port
from opsctl.spec.load import LoadedSpec

EXPORTER_OS_USER = "opsctl-exporter"  # the OS user every exporter of a host runs as (nologin, no home)
PID_FILE = "exporter.pid"
LOG_FILE = "exporter.log"


def control_name(node: Node) -> str:
    """The name bin/opsctl-node knows the node's exporter by (no node's name ends so)."""
    return f"{node.name}-exporter"


def exporter_unit(node: Node) -> str:
    return f"opsctl-{control_name(node)}"


def home(loaded: LoadedSpec, node: Node) -> str:
    return exporter_home(loaded, node, remote_paths(loaded.spec, node).dir)


def exporters_root(loaded: LoadedSpec) -> str:
    """The folder of a spec's exporter folders (root's, 0755: each exporter enters its own only)."""
    return f"{remote_root(loaded.spec)}.exporters"


def settings_file(loaded: LoadedSpec, node: Node) -> str:
    return f"{remote_root(loaded.spec)}/nodes/{control_name(node)}.env"


def state_file(loaded: LoadedSpec, node: Node) -> str:
    """The digest the running exporter was started with (root's, beside its settings)."""
    return f"{remote_root(loaded.spec)}/nodes/{control_name(node)}.state"


def file_names(loaded: LoadedSpec) -> list[str]:
    """The files of an exporter's folder: the password file, and with TLS the node's CA, certificate and key."""
    tls = [TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE] if loaded.spec.tls.enabled else []
    return [PASSWORD_FILE, *tls]


def settings_text(loaded: LoadedSpec, node: Node, run: ExporterRun) -> str:
    """nodes/<node>-exporter.env for bin/opsctl-node: OPSCTL_FOREGROUND=yes (the exporter does not daemonize:
    opsctl-node backgrounds it and writes its pidfile). No secret: the arguments name the password file only."""
    folder = home(loaded, node)
    values = {"OPSCTL_UNIT": exporter_unit(node), "OPSCTL_DIR": folder, "OPSCTL_BIN": EXPORTER_BINARY,
              "OPSCTL_CONF": "", "OPSCTL_ARGS": shlex.join(run.args), "OPSCTL_PID": f"{folder}/{PID_FILE}",
              "OPSCTL_LOG": f"{folder}/{LOG_FILE}",
              "OPSCTL_PORT": str(exporter_port(node, loaded.spec.metrics.port_offset)),
              "OPSCTL_USER": EXPORTER_OS_USER, "OPSCTL_FOREGROUND": "yes"}
    lines = [f"# Written by opsctl (exporters.yml): the redis_exporter of node {node.name}. No secrets here."]
    return "\n".join([*lines, *(f"{key}={shlex.quote(value)}" for key, value in values.items())]) + "\n"


def exporter_vars(loaded: LoadedSpec, node: Node, run: ExporterRun) -> dict[str, Any]:
    """One entry of a host's opsctl_exporters (exporters.yml): names, paths, arguments and digest; no secret."""
    return {"node": node.name, "name": control_name(node), "unit": exporter_unit(node), "dir": home(loaded, node),
            "settings": settings_text(loaded, node, run), "args": list(run.args), "digest": run.digest,
            "files": file_names(loaded), "port": exporter_port(node, loaded.spec.metrics.port_offset)}


def play_vars(loaded: LoadedSpec) -> dict[str, str]:
    """The variables exporters.yml needs beside the inventory's."""
    return {"opsctl_exporter_user": EXPORTER_OS_USER, "opsctl_exporter_package": EXPORTER_PACKAGE,
            "opsctl_exporter_binary": EXPORTER_BINARY, "opsctl_exporters_root": exporters_root(loaded)}


def remove_command(loaded: LoadedSpec, node: Node) -> str:
    """Stop the node's exporter and delete its folder (password file included), settings, state and unit; the
    spec's exporters folder too once it is empty. Does nothing where none was deployed."""
    q = shlex.quote
    root, name = remote_root(loaded.spec), control_name(node)
    control, settings = q(f"{root}/bin/opsctl-node"), q(settings_file(loaded, node))
    unit, unit_file = q(exporter_unit(node)), q(f"/etc/systemd/system/{exporter_unit(node)}.service")
    return "; ".join([
        f"if [ -f {settings} ] && [ -x {control} ]; then {control} stop {q(name)} >/dev/null || exit 1; fi",
        f"rm -rf -- {q(home(loaded, node))} {settings} {q(state_file(loaded, node))} || exit 1",
        f"if [ -f {unit_file} ]; then systemctl disable {unit} >/dev/null 2>&1; rm -f -- {unit_file}; "
        "systemctl daemon-reload >/dev/null 2>&1; fi",
        f"rmdir {q(exporters_root(loaded))} 2>/dev/null",
        "true",
    ])
