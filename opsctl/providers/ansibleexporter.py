"""The Ansible provider's redis_exporters (metrics.exporter): one per server and Sentinel beside its node, run by
playbooks/exporters.yml as the exporter's own system user (opsctl.providers.ansibleexporter).

The first start of a run deploys every exporter of the spec in one playbook run (each one restarted only where its
settings or files changed); each start then checks its own exporter. An exporter is the node's only when the pid its
pidfile names is the exporter binary working in the exporter's folder (/proc over SFTP); the digest it was started
with lies in nodes/<node>-exporter.state. The password travels as a 0600 staged file through a no_log copy, deleted
after the run: never in the inventory, extra vars, an environment or a command line.

The redis_exporters of provider: ansible (pure): what playbooks/exporters.yml gets per host, the settings
bin/opsctl-node runs an exporter with, and the command that removes one. docs/monitoring.md, "provider: ansible".

An exporter runs as its own system user (EXPORTER_OS_USER), which cannot enter the nodes' folders: its folder is
metrics.exporter.exporter_home (`<spec folder>.exporters/<node>`, 0700, the exporter user's), holding its 0600 password
file and, with TLS, its 0600 copies of the node's CA, certificate and key. bin/opsctl-node starts and stops it under
the name `<node>-exporter` (nodes/<node>-exporter.env, root's), the one way nodes are run (a unit where systemd runs).
No secret in anything here: the inventory lists file names, the files travel as 0600 files through no_log copies."""

from __future__ import annotations

import shlex
import shutil
import weakref
from collections.abc import Sequence
from typing import Any

from opsctl.base.errors import OpsctlError
from opsctl.metrics.exporter import (
    EXPORTER_BINARY,
    EXPORTER_PACKAGE,
    PASSWORD_FILE,
    ExporterRun,
    exporter_home,
    exporter_nodes,
    exporter_run,
)
from opsctl.net.fanout import fan_out
from opsctl.plan.desired import desired_node
from opsctl.providers import ansibleexporter as remote
from opsctl.providers.ansible import PIDFILE_LIMIT, AnsibleProvider, remote_process
from opsctl.providers.remote import ssh
from opsctl.providers.remote.inventory import build_inventory, remote_paths, remote_root
from opsctl.providers.remote.runner import private_dir, run_playbook
from opsctl.render.directives import TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE
from opsctl.spec.layout import Node, exporter_port
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import write_private
from opsctl.tls.material import node_files

PLAYBOOK = "exporters.yml"
INSTALL_TASK = "Install the redis_exporter package"
# The providers whose exporters were deployed in this run: the first start-exporter step deploys them all.
_DEPLOYED: weakref.WeakKeyDictionary[AnsibleProvider, bool] = weakref.WeakKeyDictionary()


class AnsibleExporters:
    """Deploy, look at and remove the exporters of an AnsibleProvider's nodes."""

    def __init__(self, provider: AnsibleProvider) -> None:
        self.provider = provider
        self.loaded = provider.loaded

    def run_of(self, node: Node) -> ExporterRun:
        provider = self.provider
        return exporter_run(self.loaded, desired_node(self.loaded, node, provider.paths(node), provider.daemonize))

    def states(self, nodes: Sequence[Node]) -> list[str | None]:
        """state of each node, the hosts looked at side by side."""
        return fan_out(self.state, list(nodes))

    def state(self, node: Node) -> str | None:
        """The digest the node's running exporter was started with; None when none runs or its host cannot be
        reached ("" when one runs whose start was not recorded: it is restarted)."""
        folder = remote.home(self.loaded, node)

        def look(sftp: ssh.Sftp) -> str | None:
            text = (ssh.read_bytes(sftp, f"{folder}/{remote.PID_FILE}", PIDFILE_LIMIT) or b"").strip()
            facts = remote_process(sftp, int(text)) if text.isdigit() else None
            if facts is None or facts.cwd != folder or facts.exe.removesuffix(" (deleted)") != EXPORTER_BINARY:
                return None
            return (ssh.read_file(sftp, remote.state_file(self.loaded, node)) or "").strip()

        try:
            return self.provider._over_sftp(node, look, "look at the redis_exporter on")
        except OpsctlError:  # a host that cannot be reached: its nodes show as down; no exporter seen there
            return None

    def start(self, node: Node, run: ExporterRun) -> None:
        """Deploy every exporter of the spec once per run (exporters.yml), then check that the node's runs with
        run's settings."""
        if not _DEPLOYED.get(self.provider):
            self.deploy()
        found = self.state(node)
        if found != run.digest:
            folder = remote.home(self.loaded, node)
            raise OpsctlError(f"the redis_exporter of {node.name} on host {node.host} does not run with its settings "
                              "after exporters.yml", "it runs with other settings" if found else "none runs",
                              f"its log is {folder}/{remote.LOG_FILE} on host {node.host}")

    def deploy(self) -> None:
        """One exporters.yml run over every exporter of the spec; its password and TLS files are staged 0600 in the
        ansible data dir and deleted afterwards, whatever happens."""
        provider = self.provider
        provider.flush()  # the nodes' folders and bin/opsctl-node land first
        nodes = exporter_nodes(self.loaded)
        runs = {n.name: self.run_of(n) for n in nodes}
        staging = private_dir(provider.data_dir) / "exporter-files"
        try:
            for node in nodes:
                files = {PASSWORD_FILE: runs[node.name].password_file,
                         **node_files(self.loaded, provider.state_dir, node)}
                folder = private_dir(staging / node.name)
                for name in remote.file_names(self.loaded):
                    write_private(folder / name, files[name])
            inventory = build_inventory(self.loaded, str(staging), provider.known_hosts,
                                        only={n.name: [] for n in nodes})
            for host, values in inventory["all"]["hosts"].items():
                values["opsctl_exporters"] = [remote.exporter_vars(self.loaded, n, runs[n.name])
                                              for n in nodes if n.host == host]
            inventory["all"]["vars"] = remote.play_vars(self.loaded)
            try:
                provider.last_result = run_playbook(PLAYBOOK, provider.data_dir, inventory, None, provider.on_event)
            except OpsctlError as exc:
                raise install_error(exc) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _DEPLOYED[provider] = True

    def renew_tls(self) -> None:
        """Each exporter holds copies of its node's TLS files: exporters.yml ships the new ones and restarts the
        exporters whose files changed."""
        self.deploy()

    def remove(self, node: Node) -> None:
        """Stop the node's exporter and delete its folder (password file included), settings and unit."""
        result = self.provider._run(node, remote.remove_command(self.loaded, node))
        if result.status != 0:
            raise OpsctlError(f"cannot remove the redis_exporter of {node.name} on host {node.host}",
                              (result.stdout + result.stderr).strip())


def install_error(exc: OpsctlError) -> OpsctlError:
    """A host that could not install the package gets the way on; other failures stay as they are."""
    if INSTALL_TASK not in exc.summary:
        return exc
    return OpsctlError(exc.summary, exc.detail,
                       f"the host needs Debian's {EXPORTER_PACKAGE} from a package source it reaches "
                       f"(apt-get install {EXPORTER_PACKAGE}); or set metrics.exporter: false")


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
