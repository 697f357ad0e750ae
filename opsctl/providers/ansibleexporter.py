"""The Ansible provider's redis_exporters (metrics.exporter): one per server and Sentinel beside its node, run by
playbooks/exporters.yml as the exporter's own system user (opsctl.providers.remote.exporters).

The first start of a run deploys every exporter of the spec in one playbook run (each one restarted only where its
settings or files changed); each start then checks its own exporter. An exporter is the node's only when the pid its
pidfile names is the exporter binary working in the exporter's folder (/proc over SFTP); the digest it was started
with lies in nodes/<node>-exporter.state. The password travels as a 0600 staged file through a no_log copy, deleted
after the run: never in the inventory, extra vars, an environment or a command line."""

from __future__ import annotations

import shutil
import weakref

from opsctl.base.errors import OpsctlError
from opsctl.plan.desired import desired_node
from opsctl.plan.exporters import (
    EXPORTER_BINARY,
    EXPORTER_PACKAGE,
    PASSWORD_FILE,
    ExporterRun,
    exporter_nodes,
    exporter_run,
)
from opsctl.providers.ansible import PIDFILE_LIMIT, AnsibleProvider, remote_process
from opsctl.providers.remote import exporters as remote
from opsctl.providers.remote import ssh
from opsctl.providers.remote.inventory import build_inventory
from opsctl.providers.remote.runner import private_dir, run_playbook
from opsctl.spec.layout import Node
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
